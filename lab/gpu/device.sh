#!/usr/bin/env bash
# The GPU machine's side of the tier (lab/gpu/README.md). Run from the repository root there:
#   bash lab/gpu/device.sh stash        keep the carried wheel part(s) in /root/stash
#   bash lab/gpu/device.sh run PART     stash, install once (wheels checked against the lock),
#                                       make the tiny models, run the runner's PART into $OUT
#   bash lab/gpu/device.sh run real-scale   the real-scale memory cases (real_scale.py), going
#                                       on where the last call on this machine stopped
# The machine starts bare and keeps files only while it stays warm (~30 s after a command), so
# the calls follow each other at once.
set -euo pipefail
STASH=/root/stash SITE=/root/site HF=/root/hf
repo=$(pwd)
mkdir -p "$STASH"
cp .gpu-stash/wheels.tar.* "$STASH"/ 2>/dev/null || true
[ "$1" = stash ] && { ls "$STASH"; exit 0; }
part=$2
# NVLink multicast off: on a shared host it can take the GPUs out of service
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -f "$SITE/.ready" ]; then
  t0=$(date +%s)
  cat "$STASH"/wheels.tar.* | tar -x -C "$STASH"
  (cd "$STASH/wheels" && sha256sum -c --quiet "$repo/lab/gpu/wheels-vllm-0.26.0.lock")
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STASH"/wheels/*.whl
  # the env probe: a vLLM general plugin (lab/gpu/envprobe), found through its entry point
  cp lab/gpu/envprobe/spark_vllm_envprobe.py "$SITE"/
  d="$SITE/spark_vllm_envprobe-0.0.0.dist-info"; mkdir -p "$d"
  cp lab/gpu/envprobe/entry_points.txt "$d"/
  printf 'Metadata-Version: 2.1\nName: spark-vllm-envprobe\nVersion: 0.0.0\n' > "$d/METADATA"
  touch "$SITE/.ready"
  echo "[device] wheels checked and installed in $(( $(date +%s) - t0 )) s"
fi
export SPARK_VLLM_COMMIT=$(cat .commit 2>/dev/null || echo unknown)  # prepare.sh writes it
if [ "$part" = bench ]; then  # issue 49: llama-benchy's wheel travels beside the stash
  if [ ! -f "$SITE/llama_benchy/__init__.py" ]; then
    (cd .gpu-stash && sha256sum -c --quiet "$repo/lab/gpu/wheels-bench.lock")
    python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu-stash/llama_benchy-*.whl
  fi
  PYTHONPATH="$SITE" python3 lab/gpu/tiny_model.py "$HF" dense
  PYTHONPATH="$SITE" python3 lab/gpu/bench_part.py --out "$OUT" 2>&1 | tee "$OUT/runner-bench.log"
  exit 0
fi
if [ "$part" = real-scale ]; then  # issue 45: resumable over calls made back to back
  PYTHONPATH="$SITE" python3 lab/gpu/real_scale.py --hf "$HF" --out "$OUT" --state /root/rs \
    --until "${UNTIL:-$(( $(date +%s) + 540 ))}" --cases "${CASES:-}"
  exit 0
fi
PYTHONPATH="$SITE" python3 lab/gpu/tiny_model.py "$HF" ${MODELS:-dense}
PYTHONPATH="$SITE" python3 lab/gpu/runner.py --out "$OUT" --part "$part" --cases "${CASES:-}" 2>&1 | tee "$OUT/runner-$part.log"
