#!/usr/bin/env bash
# The lab's Pulumi engine, and its bin dir as the last stdout line (progress goes to stderr):
#
#   BIN=$(lab/tools.sh | tail -1)
#
# Every part comes from a package registry or from this repository; nothing is built from
# copied upstream source (docs/development.md, "The Pulumi engine").
#
# 1. An installed engine when there is one (an operator's machine with the official CLI):
#    `pulumi` on PATH at >= the Python SDK pin (requirements.txt) with the official language host
#    beside it, as the CLI tarball ships it. pulumi-command's real provider is used when it is in
#    the operator's plugin cache at the pinned version (`pulumi plugin install resource command V`;
#    ${SPARK_VLLM_OPERATOR_PULUMI_HOME:-${PULUMI_HOME:-~/.pulumi}}/plugins);
#    otherwise the lab's stand-in (lab/engine/command_provider) takes its place. Nothing is built.
#    SPARK_VLLM_ENGINE=lab skips this step.
# 2. Otherwise the lab's engine, cached:
#      bin/pulumi                          the CLI, built from the Go module proxy (pkg/v3 +
#                                          sdk/v3 at one version): the real engine
#      bin/pulumi-language-python-exec     } the Python SDK's own scripts, as the sdk/v3 module
#      bin/pulumi-resource-pulumi-python   } serves them (the dynamic-provider host)
#      bin/pulumi-language-python          -> lab/engine/bin/pulumi-language-python: the Python
#                                          SDK's own language server (pulumi.automation's),
#                                          launched where the CLI looks for its host (no registry
#                                          serves the official Go host)
#      plugins/resource-command-v<V>/pulumi-resource-command
#                                          -> lab/engine/bin/pulumi-resource-command: the lab's
#                                          stand-in for pulumi-command's provider (no registry
#                                          serves it), written from its documented behaviour
#    The CLI part is cached under its version (built into <dir>.partial/ and renamed when
#    complete, so an interrupted build never looks finished); the engine dir, which links into
#    this checkout, under a key of the CLI dir and the checkout's path.
# The language host sits next to `pulumi` (the engine calls it "bundled": found there without a
# `from $PATH` warning). lab/env.sh links the command plugin into the lab's PULUMI_HOME.
#
# Cache: ${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain/
set -euo pipefail

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
REQ="$REPO/requirements.txt"
STAND_IN_BIN="$HERE/engine/bin"
pin() { # pin NAME -> version from requirements.txt (NAME==VERSION)
    local v
    v=$(sed -n -E "s/^[[:space:]]*$1[[:space:]]*==[[:space:]]*([0-9][0-9A-Za-z.+-]*).*/\1/p" "$REQ" | head -1)
    [[ -n $v ]] || die "no '$1==X' pin in $REQ"
    printf '%s\n' "$v"
}

SDK_VERSION=$(pin pulumi)            # Python SDK, e.g. 3.272.0
CMD_VERSION=$(pin pulumi-command)    # command provider the Python SDK asks the engine for
CACHE_ROOT=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain
PLUGIN_LEAF="resource-command-v$CMD_VERSION"

# assemble OUT CLI_DIR LANG_HOST COMMAND_PLUGIN [symlink]: OUT/bin and OUT/plugins. The CLI looks
# for its bundled language host beside its own resolved path: an installed CLI is symlinked (its
# official host beside it answers), the lab's CLI hard-linked (else copied) so that the
# launcher linked beside it here is the one found.
assemble() {
    local out=$1 cli_dir=$2 host=$3 plugin=$4 how=${5:-hard} f src
    rm -rf "$out.partial" && mkdir -p "$out.partial/bin" "$out.partial/plugins/$PLUGIN_LEAF"
    for f in pulumi pulumi-language-python-exec pulumi-resource-pulumi-python; do
        src=$(readlink -f "$cli_dir/$f") || continue
        [[ -e $src ]] || continue
        if [[ $how == symlink ]]; then ln -s "$src" "$out.partial/bin/$f"
        else ln -f "$src" "$out.partial/bin/$f" 2>/dev/null || cp -p "$src" "$out.partial/bin/$f"; fi
    done
    ln -sfn "$host" "$out.partial/bin/pulumi-language-python"
    ln -sfn "$plugin" "$out.partial/plugins/$PLUGIN_LEAF/pulumi-resource-command"
    rm -rf "$out" && mv "$out.partial" "$out"
}

installed_engine() { # -> the bin dir of an engine around an installed CLI, or fail
    [[ ${SPARK_VLLM_ENGINE:-auto} != lab ]] || return 1
    local cli dir version plugin key out which
    cli=$(command -v pulumi) || return 1
    dir=$(dirname "$(readlink -f "$cli")")
    case "$dir/" in "$CACHE_ROOT"/*) return 1 ;; esac   # this script's own engine, on PATH
    [[ -x $dir/pulumi-language-python && -x $dir/pulumi-resource-pulumi-python ]] || {
        log "installed pulumi at $dir has no pulumi-language-python beside it: not used"; return 1; }
    version=$("$dir/pulumi" version 2>/dev/null) || return 1
    version=${version#v}
    [[ $(printf '%s\n%s\n' "$SDK_VERSION" "$version" | sort -V | head -1) == "$SDK_VERSION" ]] || {
        log "installed pulumi $version is older than the SDK pin $SDK_VERSION: not used"; return 1; }
    # the operator's own plugin cache (lab/env.sh keeps it: after a source, PULUMI_HOME is the lab's)
    plugin=${SPARK_VLLM_OPERATOR_PULUMI_HOME:-${PULUMI_HOME:-$HOME/.pulumi}}/plugins/$PLUGIN_LEAF/pulumi-resource-command
    which="pulumi-resource-command $CMD_VERSION (the real one)"
    if [[ ! -x $plugin ]]; then
        plugin=$STAND_IN_BIN/pulumi-resource-command
        which="the lab's stand-in for pulumi-resource-command (no $CMD_VERSION in the plugin cache)"
    fi
    key=$(printf '%s\n' "$dir" "$version" "$plugin" "$REPO" | sha256sum | cut -c1-12)
    out="$CACHE_ROOT/installed-$key"
    [[ -d $out ]] || assemble "$out" "$dir" "$(readlink -f "$dir/pulumi-language-python")" "$plugin" symlink
    log "using the installed engine: pulumi $version at $dir, its language host, $which"
    echo "$out/bin"
}
if installed_engine; then exit 0; fi

# The CLI must be >= the Python SDK. The module proxy here serves only some versions: pkg/v3
# v3.272.0 and v3.273.0 are refused (403, 2026-11-30) while v3.274.1 is served for pkg/v3 and
# sdk/v3, so the SDK pin 3.272.0 gets the nearest newer CLI. Looked up, not probed each run.
case "$SDK_VERSION" in
    3.272.0) CLI_VERSION=3.274.1 ;;
    *) CLI_VERSION=$SDK_VERSION ;;
esac
CLI_DIR="$CACHE_ROOT/cli-v$CLI_VERSION"
ENGINE="$CACHE_ROOT/engine-$(printf '%s\n' "$CLI_DIR" "$REPO" "$CMD_VERSION" | sha256sum | cut -c1-12)"
if [[ -d $ENGINE && -d $CLI_DIR && -x $ENGINE/bin/pulumi-resource-pulumi-python ]]; then
    echo "$ENGINE/bin"   # fast path: no lock, no network
    exit 0
fi

command -v go >/dev/null || die "go not found (Go >= 1.26 builds the Pulumi CLI from the module proxy)"
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

VERSION_X=github.com/pulumi/pulumi/sdk/v3/go/common/version.Version
build_cli() { # build_cli OUT: the CLI, and the SDK's two Python scripts from the served sdk/v3
    local pkg="github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION" sdk="github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION" dir
    wrapper_module "$WORK/cli" "$pkg" "$sdk" || die "the module proxy does not serve $pkg and $sdk"
    (cd "$WORK/cli" && go build -trimpath -ldflags "-s -w -X $VERSION_X=v$CLI_VERSION" \
        -o "$1/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi) || return 1
    dir=$(mod_field "$sdk" Dir) || return 1
    install -m 0755 "$dir/python/cmd/pulumi-language-python-exec" "$dir/python/dist/pulumi-resource-pulumi-python" "$1/"
}

if [[ ! -d $CLI_DIR ]]; then
    # Cold on 2 cores (2026-11-30): ~6.5 min, module downloads included.
    log "building the pulumi CLI v$CLI_VERSION from the Go module proxy (cold: ~6.5 min on 2 cores)"
    rm -rf "$CLI_DIR.partial" && mkdir -p "$CLI_DIR.partial"
    build_cli "$CLI_DIR.partial" || die "building the pulumi CLI v$CLI_VERSION failed"
    mv "$CLI_DIR.partial" "$CLI_DIR"
    log "the CLI built in $((SECONDS - T0)) s"
fi
assemble "$ENGINE" "$CLI_DIR" "$STAND_IN_BIN/pulumi-language-python" "$STAND_IN_BIN/pulumi-resource-command"
log "engine ready in $((SECONDS - T0)) s: $ENGINE (pulumi v$CLI_VERSION; the lab's language launcher and command-provider stand-in)"
echo "$ENGINE/bin"
