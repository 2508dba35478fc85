#!/usr/bin/env bash
# Here (any x86-64 or not: pip downloads for the GPU machine's platform): the wheel set of the
# lock, checked by sha256, as 54 MiB parts under .gpu-stash/ (one part per device call: a call
# carries at most 64 MiB with the working tree). The download is cached in $CACHE.
set -euo pipefail
cd "$(dirname "$0")/../.."
lock=lab/gpu/wheels-vllm-0.26.0.lock
CACHE=${CACHE:-$HOME/.cache/spark-vllm-gpu}
mkdir -p "$CACHE/wheels" .gpu-stash
grep -qx '/.gpu-stash/' .git/info/exclude 2>/dev/null || echo /.gpu-stash/ >> .git/info/exclude
awk '{split($2, p, "-"); print p[1] "==" p[2]}' "$lock" > "$CACHE/reqs.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  $(for n in 28 27 26 24 31 17 5; do printf -- '--platform manylinux_2_%s_x86_64 ' "$n"; done) \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$CACHE/wheels" -r "$CACHE/reqs.txt"
(cd "$CACHE/wheels" && sha256sum -c --quiet "$OLDPWD/$lock")
rm -f .gpu-stash/wheels.tar.*
tar -cf - -C "$CACHE" wheels | split -b 54M -d - .gpu-stash/wheels.tar.
git rev-parse HEAD > .commit  # the runner records it (the device gets no .git)
ls -l .gpu-stash
