#!/usr/bin/env bash
# Build the Pulumi engine once, cached outside the repo, and hand back its bin dir (fast path
# well under a second once built):
#
#   BIN=$(lab/tools.sh | tail -1)      # progress goes to stderr, the bin dir is the last stdout line
#
# Everything here is a real Pulumi part, built from upstream source:
#   bin/pulumi                          the CLI, from the Go module proxy (pkg/v3 + sdk/v3)
#   bin/pulumi-language-python-exec     the SDK's launcher script, from the sdk/v3 module
#   bin/pulumi-language-python          the Python language host  } from ../shared/vendor/
#   bin/pulumi-resource-pulumi-python   the dynamic-provider host } pulumi-language-python/
#   plugins/resource-command-v<V>/pulumi-resource-command
#                                       pulumi-command's provider, from ../shared/vendor/
#                                       pulumi-command/ at the version requirements.txt pins
# The language host and pulumi-python sit next to `pulumi`, where the official CLI tarball ships
# them (the engine calls them "bundled": found there without a `from $PATH` warning). The
# command provider is a normal resource plugin: lab/env.sh installs it into the lab's
# PULUMI_HOME with `pulumi plugin install resource command <V> --file …`, as a download would.
#
# The module proxy refuses both plugins *as modules* but serves their dependencies, so they are
# built from the vendored sources (copied first: ../shared is read-only in CI). Each part is
# cached under its own key (version + a hash of the sources it comes from), built into
# <key>.partial/ and renamed when complete, so an interrupted build never looks finished.
#
# Cache: ${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain/
# Sources: ${SPARK_VLLM_VENDOR:-<repo>/../shared/vendor}
set -euo pipefail

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQ="$HERE/../requirements.txt"
VENDOR=${SPARK_VLLM_VENDOR:-$(cd "$HERE/../.." && pwd)/shared/vendor}
pin() { # pin NAME -> version from requirements.txt (NAME==VERSION)
    local v
    v=$(sed -n -E "s/^[[:space:]]*$1[[:space:]]*==[[:space:]]*([0-9][0-9A-Za-z.+-]*).*/\1/p" "$REQ" | head -1)
    [[ -n $v ]] || die "no '$1==X' pin in $REQ"
    printf '%s\n' "$v"
}
vendored() { # vendored FOLDER WORD -> the version after WORD in vendor/README.md's row of FOLDER
    sed -n -E "s/^\| \`$1\/\`.*\| $2 v?([0-9][0-9.]*)[ |].*/\1/p" "$VENDOR/README.md" | head -1
}
tree_sum() { # tree_sum DIR -> short content hash of every file under DIR
    (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
}

[[ -f $VENDOR/README.md ]] || die "vendored plugin sources not found at $VENDOR (set SPARK_VLLM_VENDOR)"
SDK_VERSION=$(pin pulumi)            # Python SDK, e.g. 3.272.0
CMD_VERSION=$(pin pulumi-command)    # command provider the Python SDK asks the engine for
CMD_SRC="$VENDOR/pulumi-command"
LANG_SRC="$VENDOR/pulumi-language-python"
[[ $(vendored pulumi-command tag) == "$CMD_VERSION" ]] ||
    die "requirements.txt pins pulumi-command==$CMD_VERSION but $CMD_SRC is v$(vendored pulumi-command tag)"
LANG_VERSION=$(vendored pulumi-language-python sdk)
[[ -n $LANG_VERSION ]] || die "no sdk version for pulumi-language-python in $VENDOR/README.md"

# The CLI must be >= the Python SDK. The module proxy here serves only some versions: pkg/v3
# v3.272.0 and v3.273.0 are refused (403, 2026-11-30) while v3.274.1 is served for pkg/v3 and
# sdk/v3, so the SDK pin 3.272.0 gets the nearest newer CLI. Looked up, not probed each run.
case "$SDK_VERSION" in
    3.272.0) CLI_VERSION=3.274.1 ;;
    *) CLI_VERSION=$SDK_VERSION ;;
esac

CACHE_ROOT=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain
CLI_DIR="$CACHE_ROOT/cli-v$CLI_VERSION"
CMD_DIR="$CACHE_ROOT/resource-command-v$CMD_VERSION-$(tree_sum "$CMD_SRC")"
LANG_DIR="$CACHE_ROOT/language-python-v$LANG_VERSION-$(tree_sum "$LANG_SRC")"
ENGINE="$CACHE_ROOT/engine-$(printf '%s\n' "$CLI_DIR" "$CMD_DIR" "$LANG_DIR" | sha256sum | cut -c1-12)"
if [[ -d $ENGINE ]]; then
    echo "$ENGINE/bin"   # fast path: no lock, no network
    exit 0
fi

command -v go >/dev/null || die "go not found (Go >= 1.26 builds the Pulumi engine)"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock -n 9 || { log "another build holds $CACHE_ROOT/.lock; waiting"; flock 9; }
WORK=$(mktemp -d "$CACHE_ROOT/.work.XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=${CGO_ENABLED:-0}
T0=$SECONDS

mod_field() { # mod_field MODULE@VERSION FIELD -> one field (Dir, GoMod) of `go mod download -json`
    (cd "$WORK" && go mod download -json "$1" 2>/dev/null) |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d[sys.argv[1]]) if "Error" not in d else sys.exit(1)' "$2"
}

# A wrapper module: a main package whose own go.mod has replace directives cannot be built with
# `go install pkg@version`; require it (and the pulumi modules at one version) and copy its
# module replacements.
wrapper_module() {
    local dir=$1 mv gomod
    shift
    mkdir -p "$dir"
    printf 'module sparkvllm.local/toolchain\n\ngo 1.26\n' >"$dir/go.mod"
    for mv in "$@"; do
        gomod=$(mod_field "$mv" GoMod) || return 1
        (cd "$dir" && go mod edit -require="$mv")
        go mod edit -json "$gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"].get("Version"):   # module replacements only (local directories are skipped)
        old = r["Old"]["Path"] + ("@" + r["Old"]["Version"] if r["Old"].get("Version") else "")
        print(old + "=" + r["New"]["Path"] + "@" + r["New"]["Version"])
' | while read -r rep; do (cd "$dir" && go mod edit -replace="$rep"); done
    done
}

go_build() { # go_build DIR PKG OUT [LDFLAG_X]
    (cd "$1" && go build -trimpath -ldflags "-s -w${4:+ -X $4}" -o "$3" "$2")
}

# part DIR WHAT COLD BUILDER: build DIR (unless complete) by running BUILDER into DIR.partial
part() {
    local dir=$1 what=$2 cold=$3 t=$SECONDS
    shift 3
    [[ -d $dir ]] && return 0
    rm -rf "$dir.partial" && mkdir -p "$dir.partial"
    log "building $what${cold:+ (cold: $cold)}"
    "$@" "$dir.partial" || die "building $what failed"
    mv "$dir.partial" "$dir"
    log "$what built in $((SECONDS - t)) s"
}

VERSION_X=github.com/pulumi/pulumi/sdk/v3/go/common/version.Version
build_cli() {
    local pkg="github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION" sdk="github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION"
    wrapper_module "$WORK/cli" "$pkg" "$sdk" || die "the module proxy does not serve $pkg and $sdk"
    go_build "$WORK/cli" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi "$1/pulumi" "$VERSION_X=v$CLI_VERSION" &&
        install -m 0755 "$(mod_field "$sdk" Dir)/python/cmd/pulumi-language-python-exec" "$1/"
}

# vendor/README.md's recipe: the provider module builds as it is, with its version stamped.
build_command() {
    cp -r "$CMD_SRC/provider" "$WORK/pc" && chmod -R u+w "$WORK/pc"
    go_build "$WORK/pc" ./cmd/pulumi-resource-command "$1/pulumi-resource-command" \
        "github.com/pulumi/pulumi-command/provider/pkg/version.Version=$CMD_VERSION"
}

# vendor/README.md's recipe: the host's go.mod points pkg/v3 and sdk/v3 at the monorepo by
# `replace`; drop those and take the served modules at the snapshot's own version.
build_language() {
    mkdir -p "$WORK/lh" && cp "$LANG_SRC"/{main.go,go.mod,go.sum} "$WORK/lh/" && chmod -R u+w "$WORK/lh"
    (cd "$WORK/lh" && go mod edit \
        -dropreplace github.com/pulumi/pulumi/pkg/v3 -dropreplace github.com/pulumi/pulumi/sdk/v3 \
        -require "github.com/pulumi/pulumi/pkg/v3@v$LANG_VERSION" \
        -require "github.com/pulumi/pulumi/sdk/v3@v$LANG_VERSION") || return 1
    go_build "$WORK/lh" . "$1/pulumi-language-python" "$VERSION_X=v$LANG_VERSION" &&
        install -m 0755 "$LANG_SRC/dist/pulumi-resource-pulumi-python" "$1/"
}

# Cold times on 2 cores, 2026-11-30: CLI 386 s (module downloads included), command provider
# 98 s and language host 53 s (their modules downloaded while the CLI built).
part "$CLI_DIR" "the pulumi CLI v$CLI_VERSION from Go modules" "~6.5 min on 2 cores" build_cli
part "$CMD_DIR" "pulumi-resource-command v$CMD_VERSION from $CMD_SRC" "~2 min" build_command
part "$LANG_DIR" "pulumi-language-python v$LANG_VERSION from $LANG_SRC" "~1-2 min" build_language

# The engine: one bin dir holding the CLI with its bundled plugins, and the command plugin to
# install. Hard links (same file system), so assembling costs nothing.
assemble() {
    mkdir -p "$1/bin" "$1/plugins/resource-command-v$CMD_VERSION"
    ln -f "$CLI_DIR"/* "$LANG_DIR"/* "$1/bin/"
    ln -f "$CMD_DIR/pulumi-resource-command" "$1/plugins/resource-command-v$CMD_VERSION/"
}
part "$ENGINE" "the engine dir" "" assemble
log "engine ready in $((SECONDS - T0)) s: $ENGINE ($(cd "$ENGINE/bin" && ls | tr '\n' ' '))"
echo "$ENGINE/bin"
