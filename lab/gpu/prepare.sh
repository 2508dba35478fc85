#!/usr/bin/env bash
# Here (any x86-64 or not: pip downloads for the GPU machine's platform): the wheel set of the
# lock, checked by sha256, as parts under .gpu-stash/ (one part per device call: a call
# carries at most 64 MiB with the working tree). The download is cached in $CACHE.
set -euo pipefail
cd "$(dirname "$0")/../.."
lock=lab/gpu/wheels-vllm-0.26.0.lock
CACHE=${CACHE:-$HOME/.cache/spark-vllm-gpu}
mkdir -p "$CACHE/wheels" .gpu-stash
awk '{split($2, p, "-"); print p[1] "==" p[2]}' "$lock" > "$CACHE/reqs.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  $(for n in 28 27 26 24 31 17 5; do printf -- '--platform manylinux_2_%s_x86_64 ' "$n"; done) \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$CACHE/wheels" -r "$CACHE/reqs.txt"
(cd "$CACHE/wheels" && sha256sum -c --quiet "$OLDPWD/$lock")
rm -f .gpu-stash/wheels.tar.*
# a call carries 64 MiB in all, the working tree (tracked files) included: the fewest equal
# parts that each fit beside it with 1 MiB to spare (fixed 54M parts overran once the tree grew)
tar -cf "$CACHE/wheels.tar" -C "$CACHE" wheels
tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
room=$(( (63 << 20) - tree ))
size=$(stat -c %s "$CACHE/wheels.tar")
split -n $(( (size + room - 1) / room )) -d "$CACHE/wheels.tar" .gpu-stash/wheels.tar.
rm -f "$CACHE/wheels.tar"
# llama-benchy for part bench (`spark-vllm bench`'s load; the machine has its dependencies)
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu-stash llama-benchy==0.4.0
(cd .gpu-stash && sha256sum -c --quiet "$OLDPWD/lab/gpu/wheels-bench.lock")
git rev-parse HEAD > .commit  # the runner records it (the device gets no .git)
ls -l .gpu-stash
