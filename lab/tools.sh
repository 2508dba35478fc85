#!/usr/bin/env bash
# The lab's Pulumi engine, and its bin dir as the last stdout line (progress goes to stderr):
#
#   BIN=$(lab/tools.sh | tail -1)
#
# 1. An installed engine when there is one: `pulumi` on PATH at >= the Python SDK pin
#    (requirements.txt), with the language host beside it (as the official CLI tarball ships
#    it), and pulumi-command's provider at the pinned version in the plugin cache
#    (${PULUMI_HOME:-~/.pulumi}/plugins, where `pulumi plugin install resource command V` puts
#    it). Links to those parts are assembled under the cache; nothing is built or downloaded.
#    SPARK_VLLM_ENGINE=vendored skips this step.
# 2. Otherwise (the offline fallback, e.g. a machine that reaches package registries only) the
#    same real parts are built once from upstream source and cached (under a second, once built):
#      bin/pulumi                          the CLI, from the Go module proxy (pkg/v3 + sdk/v3)
#      bin/pulumi-language-python-exec     the SDK's launcher script, from the sdk/v3 module
#      bin/pulumi-language-python          the Python language host  } from the vendored
#      bin/pulumi-resource-pulumi-python   the dynamic-provider host } pulumi-language-python/
#      plugins/resource-command-v<V>/pulumi-resource-command
#                                          pulumi-command's provider, from the vendored
#                                          pulumi-command/ at the version requirements.txt pins
#    The module proxy refuses both plugins *as modules* but serves their dependencies, so they
#    are built from vendored upstream snapshots (SPARK_VLLM_VENDOR: a directory holding
#    pulumi-command/ and pulumi-language-python/ and a README.md naming their versions; copied
#    before building, as it may be read-only). Each part is cached under its own key (version +
#    a hash of its sources), built into <key>.partial/ and renamed when complete, so an
#    interrupted build never looks finished.
# The language host and pulumi-python sit next to `pulumi` (the engine calls them "bundled":
# found there without a `from $PATH` warning). The command provider is a normal resource
# plugin: lab/env.sh installs it into the lab's PULUMI_HOME with `pulumi plugin install
# resource command <V> --file …`, as a download would.
#
# Cache: ${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain/
# Sources (fallback only): ${SPARK_VLLM_VENDOR:-<repo>/../shared/vendor}
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

SDK_VERSION=$(pin pulumi)            # Python SDK, e.g. 3.272.0
CMD_VERSION=$(pin pulumi-command)    # command provider the Python SDK asks the engine for
CACHE_ROOT=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain

installed_engine() { # -> the bin dir of links to an installed engine, or fail
    [[ ${SPARK_VLLM_ENGINE:-auto} != vendored ]] || return 1
    local cli dir version plugin key out
    cli=$(command -v pulumi) || return 1
    dir=$(dirname "$(readlink -f "$cli")")
    case "$dir/" in "$CACHE_ROOT"/*) return 1 ;; esac   # this script's own build, on PATH
    [[ -x $dir/pulumi-language-python && -x $dir/pulumi-resource-pulumi-python ]] || {
        log "installed pulumi at $dir has no pulumi-language-python beside it: not used"; return 1; }
    version=$("$dir/pulumi" version 2>/dev/null) || return 1
    version=${version#v}
    [[ $(printf '%s\n%s\n' "$SDK_VERSION" "$version" | sort -V | head -1) == "$SDK_VERSION" ]] || {
        log "installed pulumi $version is older than the SDK pin $SDK_VERSION: not used"; return 1; }
    plugin=${PULUMI_HOME:-$HOME/.pulumi}/plugins/resource-command-v$CMD_VERSION/pulumi-resource-command
    [[ -x $plugin ]] || {
        log "installed pulumi $version found, but not pulumi-resource-command $CMD_VERSION" \
            "(pulumi plugin install resource command $CMD_VERSION): not used"; return 1; }
    key=$(printf '%s\n' "$dir" "$version" "$plugin" | sha256sum | cut -c1-12)
    out="$CACHE_ROOT/installed-$key"
    if [[ ! -d $out ]]; then
        mkdir -p "$out.partial/bin" "$out.partial/plugins/resource-command-v$CMD_VERSION"
        ln -sf "$dir"/pulumi "$dir"/pulumi-language-python* "$dir"/pulumi-resource-pulumi-python \
            "$out.partial/bin/"
        ln -sf "$plugin" "$out.partial/plugins/resource-command-v$CMD_VERSION/"
        rm -rf "$out" && mv "$out.partial" "$out"
    fi
    log "using the installed engine: pulumi $version at $dir, pulumi-resource-command $CMD_VERSION"
    echo "$out/bin"
}
if installed_engine; then exit 0; fi

[[ -f $VENDOR/README.md ]] || die "no installed Pulumi engine (pulumi >= $SDK_VERSION on PATH with pulumi-resource-command $CMD_VERSION in its plugins), and no vendored sources to build one at $VENDOR (set SPARK_VLLM_VENDOR)"
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
