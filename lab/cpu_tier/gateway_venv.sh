#!/usr/bin/env bash
# The CPU tier's gateway "image": a venv of LiteLLM's proxy from lab/gateway/requirements.txt
# (the lab's gateway image's own pins, every wheel by sha256), cached OUTSIDE the repository:
#   bash lab/cpu_tier/gateway_venv.sh     prints the venv's path on its last line
# The tier's docker shim runs the gateway's container from it (lab/cpu_tier/several.py), as the
# vLLM containers run from the tier's vLLM venv (install.sh): LiteLLM's 121 packages stay out of
# vLLM's venv, whose dependencies are what the recordings were made with.
# Idempotent: a venv whose stamp matches the requirements is kept (~0 s); cold ~60-90 s, 744 MB.
set -euo pipefail
cd "$(dirname "$0")"
t0=$(date +%s)
req=../gateway/requirements.txt
key=$(cat "$req" gateway_venv.sh | sha256sum | cut -c1-16)
VENV=${SPARK_VLLM_GATEWAY_VENV:-$HOME/.cache/spark-vllm/gateway-litellm-$key}
PY=${PYTHON:-python3}
if [ "$(cat "$VENV/.spark-vllm-files" 2>/dev/null)" = "$key" ] && [ -x "$VENV/bin/python3" ]; then
  echo "[cpu-tier] gateway venv ready (cached) in $(( $(date +%s) - t0 )) s"; echo "$VENV"; exit 0
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
  --only-binary=:all: -r "$req"
# what the gateway's entry point imports (scripts/spark_vllm_gateway.py), as the image's build
# does; LiteLLM's price map from its wheel, not fetched (no network on a node; ~10 s of retries)
LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c "import litellm.proxy.proxy_server, uvicorn"
echo "$key" > "$VENV/.spark-vllm-files"
echo "[cpu-tier] gateway venv installed in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1)"
echo "$VENV"
