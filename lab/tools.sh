#!/usr/bin/env bash
# Make the Pulumi engine available offline, cached outside the repo, in well under a second
# once built:
#
#   BIN=$(lab/tools.sh | tail -1)      # progress goes to stderr, the bin dir is the last stdout line
#
# What runs `pulumi up` here:
#   pulumi                        the real CLI, built from the Go module proxy (pkg/v3 + sdk/v3)
#   pulumi-language-python-exec   the real SDK launcher script, copied from the sdk/v3 module
#   pulumi-language-python        } the real ones cannot be had here: the module proxy answers 403
#   pulumi-resource-command       } for github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3
#                                   and github.com/pulumi/pulumi-command/provider at every version
#                                   and commit (tried 2026-11-30), and no other registry ships them.
#                                   lab/engine/bin/ holds labelled stand-ins written from their
#                                   sources; lab/env.sh puts them on PATH *after* this bin dir,
#                                   so real plugins (on PATH, or built here when
#                                   SPARK_VLLM_LANGUAGE_PYTHON_VERSION / SPARK_VLLM_COMMAND_PROVIDER_VERSION
#                                   name a module version the proxy serves) always win.
#
# Cache: ${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain/pulumi-v<CLI>/bin/, built into
# <key>.partial/ and renamed when complete, so an interrupted build never looks finished.
set -euo pipefail

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQ="$HERE/../requirements.txt"
pin() { # pin NAME -> version from requirements.txt (NAME==VERSION)
    local v
    v=$(sed -n -E "s/^[[:space:]]*$1[[:space:]]*==[[:space:]]*([0-9][0-9A-Za-z.+-]*).*/\1/p" "$REQ" | head -1)
    [[ -n $v ]] || die "no '$1==X' pin in $REQ"
    printf '%s\n' "$v"
}
SDK_VERSION=$(pin pulumi)            # Python SDK, e.g. 3.272.0
CMD_VERSION=$(pin pulumi-command)    # command provider, e.g. 1.2.1

# The CLI must be >= the Python SDK. The module proxy here serves only some versions: pkg/v3
# v3.272.0 and v3.273.0 are refused (403, 2026-11-30) while v3.274.1 is served for pkg/v3 and
# sdk/v3, so the SDK pin 3.272.0 gets the nearest newer CLI. Looked up, not probed each run.
case "$SDK_VERSION" in
    3.272.0) CLI_VERSION=3.274.1 ;;
    *) CLI_VERSION=$SDK_VERSION ;;
esac

CACHE_ROOT=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain
FINAL="$CACHE_ROOT/pulumi-v$CLI_VERSION"
PARTIAL="$FINAL.partial"
if [[ -x "$FINAL/bin/pulumi" && -x "$FINAL/bin/pulumi-language-python-exec" ]] \
    && [[ -z ${SPARK_VLLM_LANGUAGE_PYTHON_VERSION:-}${SPARK_VLLM_COMMAND_PROVIDER_VERSION:-} ]]; then
    echo "$FINAL/bin"   # fast path: no lock, no network
    exit 0
fi

command -v go >/dev/null || die "go not found (Go >= 1.26 builds the Pulumi CLI)"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock -n 9 || { log "another build holds $CACHE_ROOT/.lock; waiting"; flock 9; }
[[ -d $FINAL ]] && { rm -rf "$PARTIAL"; mv "$FINAL" "$PARTIAL"; }   # adding an optional plugin
mkdir -p "$PARTIAL/bin"
WORK=$(mktemp -d "$CACHE_ROOT/.work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=${CGO_ENABLED:-0}

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

go_build() { # go_build DIR PKG OUT VERSION_VAR=VALUE
    local tmp="$(dirname "$3")/.$(basename "$3").tmp.$$"
    (cd "$1" && go build -trimpath -ldflags "-s -w -X $4" -o "$tmp" "$2") || { rm -f "$tmp"; return 1; }
    mv -f "$tmp" "$3"
}

PKG="github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION"
SDK="github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION"
VERSION_X=github.com/pulumi/pulumi/sdk/v3/go/common/version.Version
if [[ ! -x "$PARTIAL/bin/pulumi" ]]; then
    log "building the pulumi CLI v$CLI_VERSION from Go modules (cold: ~5 min on 2 cores)"
    t0=$SECONDS
    wrapper_module "$WORK/cli" "$PKG" "$SDK" || die "the module proxy does not serve $PKG and $SDK"
    go_build "$WORK/cli" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi "$PARTIAL/bin/pulumi" \
        "$VERSION_X=v$CLI_VERSION" || die "building the pulumi CLI failed"
    log "pulumi CLI v$CLI_VERSION built in $((SECONDS - t0)) s"
fi
if [[ ! -x "$PARTIAL/bin/pulumi-language-python-exec" ]]; then
    sdkdir=$(mod_field "$SDK" Dir) || die "$SDK not served"
    install -m 0755 "$sdkdir/python/cmd/pulumi-language-python-exec" "$PARTIAL/bin/"
fi

# Optional: the real plugins, when a module version the proxy serves is known.
if [[ -n ${SPARK_VLLM_LANGUAGE_PYTHON_VERSION:-} ]]; then
    mod=github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3
    log "building pulumi-language-python ($mod@$SPARK_VLLM_LANGUAGE_PYTHON_VERSION)"
    if wrapper_module "$WORK/lang" "$mod@$SPARK_VLLM_LANGUAGE_PYTHON_VERSION" "$PKG" "$SDK"; then
        go_build "$WORK/lang" "$mod" "$PARTIAL/bin/pulumi-language-python" "$VERSION_X=v$CLI_VERSION" ||
            die "building pulumi-language-python failed"
    else
        log "refused by the module proxy: the stand-in in lab/engine/bin stays in use"
    fi
fi
if [[ -n ${SPARK_VLLM_COMMAND_PROVIDER_VERSION:-} ]]; then
    mod=github.com/pulumi/pulumi-command/provider
    log "building pulumi-resource-command ($mod@$SPARK_VLLM_COMMAND_PROVIDER_VERSION)"
    if wrapper_module "$WORK/cmd" "$mod@$SPARK_VLLM_COMMAND_PROVIDER_VERSION"; then
        go_build "$WORK/cmd" "$mod/cmd/pulumi-resource-command" "$PARTIAL/bin/pulumi-resource-command" \
            "github.com/pulumi/pulumi-command/provider/pkg/version.Version=v$CMD_VERSION" ||
            die "building pulumi-resource-command failed"
    else
        log "refused by the module proxy: the stand-in in lab/engine/bin stays in use"
    fi
fi

mv "$PARTIAL" "$FINAL"
log "engine ready: $FINAL/bin ($(cd "$FINAL/bin" && ls | tr '\n' ' '))"
echo "$FINAL/bin"
