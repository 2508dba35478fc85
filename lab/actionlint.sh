#!/usr/bin/env bash
# Build actionlint (the GitHub Actions workflow linter) once, cached outside the repo, and hand
# back the binary's path on the last stdout line (progress goes to stderr):
#
#   ACTIONLINT=$(lab/actionlint.sh | tail -1)
#   "$ACTIONLINT" .github/workflows/*.yml
#
# It is the real upstream tool, github.com/rhysd/actionlint at the version below, built from the
# Go module proxy with `go install` (the module has no replace directives, so no wrapper module
# is needed, unlike the Pulumi CLI in lab/tools.sh). Cached under the same toolchain root as the
# Pulumi engine, built into <dir>.partial and renamed when complete, so an interrupted build
# never looks finished. Fast path (cached): no lock, no network, no Go.
#
# Cache: ${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain/actionlint-v<VERSION>/
set -euo pipefail

# Pinned: a newer actionlint can add checks, and a lint test must not change verdict by itself.
VERSION=1.7.12

log() { printf '[actionlint] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CACHE_ROOT=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain
DIR="$CACHE_ROOT/actionlint-v$VERSION"
if [[ -x $DIR/actionlint ]]; then
    echo "$DIR/actionlint"   # fast path
    exit 0
fi

command -v go >/dev/null || die "go not found (Go builds actionlint from the module proxy)"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.actionlint.lock"
flock -n 9 || { log "another build holds $CACHE_ROOT/.actionlint.lock; waiting"; flock 9; }
if [[ ! -x $DIR/actionlint ]]; then   # the build we waited for may have made it
    T0=$SECONDS
    log "building actionlint v$VERSION from the Go module proxy (cold: 20-50 s)"
    rm -rf "$DIR.partial" && mkdir -p "$DIR.partial"
    # GOFLAGS from the caller (lab/tools.sh exports -mod=mod) do not apply to `go install pkg@v`
    PKG="github.com/rhysd/actionlint/cmd/actionlint@v$VERSION"
    GOFLAGS='' GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=${CGO_ENABLED:-0} \
        GOBIN="$DIR.partial" go install -trimpath -ldflags '-s -w' "$PKG" ||
        die "go install $PKG failed"
    rm -rf "$DIR" && mv "$DIR.partial" "$DIR"
    log "built in $((SECONDS - T0)) s: $DIR/actionlint ($("$DIR/actionlint" -version | head -1))"
fi
echo "$DIR/actionlint"
