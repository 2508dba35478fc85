#!/usr/bin/env bash
# `make fidelity`: the simulator's vllm serve flag table against the real vLLM 0.33.0 source.
# Downloads the wheel once (336 MB, no dependencies, no install, no GPU) into the cache, unpacks
# its Python sources, re-extracts the table and diffs it with the committed one. Not in CI: the
# download is large; run it when the simulated vLLM version or the extractor changes.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VERSION=${VLLM_SIM_FIDELITY_VERSION:-0.33.0}
CACHE=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/vllm-$VERSION
PY=${PYTHON:-$HERE/../../.venv/bin/python}
if [[ ! -d $CACHE/src/vllm ]]; then
    mkdir -p "$CACHE"
    echo "[fidelity] downloading vllm==$VERSION (no deps) into $CACHE" >&2
    "$PY" -m pip download -q --no-deps "vllm==$VERSION" -d "$CACHE"
    rm -rf "$CACHE/src.partial" && mkdir -p "$CACHE/src.partial"
    unzip -q -o "$CACHE"/vllm-"$VERSION"-*.whl 'vllm/*.py' -d "$CACHE/src.partial"
    mv "$CACHE/src.partial" "$CACHE/src"
fi
table="$HERE/vllm_sim/serve_flags_${VERSION//./_}.txt"
"$PY" "$HERE/extract_serve_flags.py" "$CACHE/src" | diff -u "$table" - \
    && echo "[fidelity] $table matches vllm $VERSION's source ($(wc -l < "$table") flags)"
