#!/usr/bin/env bash
# Make the real Pulumi engine available offline: the CLI, the Python language host (with the
# pulumi-language-python-exec and pulumi-resource-pulumi-python scripts) and the command
# provider, built from the Go module proxy at versions matching requirements.txt, and cached
# outside the repo so that a second run takes well under a second.
#
#   BIN=$(lab/tools.sh | tail -1)      # progress goes to stderr, the bin dir is the last stdout line
#
# Cache: ${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain/pulumi-v<CLI>-command-v<CMD>/bin/
# That directory only ever exists complete: binaries are built into <key>.partial/ (each one
# written under a temporary name, then renamed) and <key>.partial/ is renamed to <key>/ once all
# three are there. An interrupted build leaves at most <key>.partial/ with whole binaries in it,
# which the next run reuses.
#
# Environment:
#   SPARK_VLLM_CACHE                    cache root (default ~/.cache/spark-vllm)
#   SPARK_VLLM_TOOLS_PARTIAL=1          if the language host or the command provider cannot be had,
#                                       still exit 0 and print <key>.partial/bin (CLI only): enough
#                                       for Automation API inline programs without providers
#   SPARK_VLLM_TOOLS_RETRY=1            retry components the module proxy refused (else a refusal
#                                       is remembered for 24 h, so sourcing env.sh stays fast)
#   SPARK_VLLM_LANGUAGE_PYTHON_VERSION  module version (pseudo-version) of
#                                       github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3
#   SPARK_VLLM_COMMAND_PROVIDER_VERSION module version of github.com/pulumi/pulumi-command/provider
# Exit: 0 complete (or partial allowed), 3 engine incomplete (a component cannot be had), 1 error.
set -euo pipefail

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
note() { [[ ${SPARK_VLLM_TOOLS_QUIET:-0} == 1 ]] || log "$@"; }   # repeated, no-work messages

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
REQ="$REPO/requirements.txt"
[[ -f $REQ ]] || die "missing $REQ"

pin() { # pin NAME -> version from requirements.txt (NAME==VERSION)
    local v
    v=$(sed -n -E "s/^[[:space:]]*$1[[:space:]]*==[[:space:]]*([0-9][0-9A-Za-z.+-]*).*/\1/p" "$REQ" | head -1)
    [[ -n $v ]] || die "no '$1==X' pin in $REQ"
    printf '%s\n' "$v"
}
SDK_VERSION=$(pin pulumi)            # Python SDK, e.g. 3.272.0
CMD_VERSION=$(pin pulumi-command)    # command provider, e.g. 1.2.1

# --- versions ------------------------------------------------------------------------------
# The CLI must be >= the Python SDK. The module proxy reachable here serves only some versions,
# so the CLI version is looked up from the SDK pin, not probed on each run.
cli_version_for_sdk() {
    case "$1" in
        # pkg/v3 v3.272.0 and v3.273.0 are refused by the module proxy (403 "This module version
        # is not available", tried 2026-11-30; sdk/v3 v3.272.0 is served). v3.274.0 and v3.274.1
        # are served for both pkg/v3 and sdk/v3; v3.274.1 is the patch release and the one the
        # environment's go-partial list shows fetched whole (go get + go mod tidy).
        3.272.0) echo 3.274.1 ;;
        # Any other pin: try the same version first (add a line here if the proxy refuses it).
        *) echo "$1" ;;
    esac
}
CLI_VERSION=$(cli_version_for_sdk "$SDK_VERSION")

# The Python language host has no tags of its own: it is a nested module of the pulumi repo,
# so it can only be required by the pseudo-version of the release commit of the CLI version
# (v3.0.0-<commit time>-<12 hex of the commit>). Known values, keyed by CLI version:
language_python_version_for_cli() {
    case "$1" in
        # Unknown for v3.274.1: the module proxy here refuses every query that would reveal it
        # (@v/list, @latest, a branch or commit, the tag name) with 403, and its .info for
        # sdk/v3 and pkg/v3 carries no Origin (commit hash). Set
        # SPARK_VLLM_LANGUAGE_PYTHON_VERSION once the pseudo-version is known.
        *) echo "" ;;
    esac
}
LANG_PY_VERSION=${SPARK_VLLM_LANGUAGE_PYTHON_VERSION:-$(language_python_version_for_cli "$CLI_VERSION")}

# The command provider is the nested module github.com/pulumi/pulumi-command/provider, which has
# no tags either (the repo's tag v1.2.1 belongs to the root module, which holds no provider code
# at that version). Its pseudo-version follows from the root module's v1.2.1 .info on the proxy:
# Origin.Hash 7f3eb6f3b77c..., Time 2026-03-03T23:59:22Z.
command_provider_version_for() {
    case "$1" in
        1.2.1) echo v0.0.0-20260303235922-7f3eb6f3b77c ;;
        *) echo "" ;;
    esac
}
CMD_MOD_VERSION=${SPARK_VLLM_COMMAND_PROVIDER_VERSION:-$(command_provider_version_for "$CMD_VERSION")}

CLI_MAIN=github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
LANG_MOD=github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3
CMD_MOD=github.com/pulumi/pulumi-command/provider
CMD_MAIN=$CMD_MOD/cmd/pulumi-resource-command
VERSION_X=github.com/pulumi/pulumi/sdk/v3/go/common/version.Version
CMD_VERSION_X=github.com/pulumi/pulumi-command/provider/pkg/version.Version

ver_ge() { # ver_ge A B: A >= B (semver-ish, without a leading v)
    [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" == "$2" ]]
}

# --- 1. tools already on PATH? ---------------------------------------------------------------
path_tools_ok() {
    local p lp rc v
    p=$(command -v pulumi 2>/dev/null) || return 1
    lp=$(command -v pulumi-language-python 2>/dev/null) || return 1
    rc=$(command -v pulumi-resource-command 2>/dev/null) || return 1
    [[ -x "$(dirname "$lp")/pulumi-language-python-exec" ]] || command -v pulumi-language-python-exec >/dev/null || return 1
    v=$(PULUMI_SKIP_UPDATE_CHECK=true "$p" version 2>/dev/null | tr -d '[:space:]') || return 1
    v=${v#v}
    [[ -n $v ]] && ver_ge "$v" "$SDK_VERSION" || return 1
    # The provider's version: from the manifest this script writes beside its own builds, else
    # from the Go build info of a foreign binary (module version or -ldflags).
    if [[ -f "$(dirname "$rc")/VERSIONS" ]] && grep -qx "pulumi-resource-command=v$CMD_VERSION" "$(dirname "$rc")/VERSIONS"; then
        :
    elif go version -m "$rc" 2>/dev/null | grep -E "pulumi-command" | grep -qF "v$CMD_VERSION"; then
        :
    else
        return 1
    fi
    note "using tools on PATH: $p (v$v), $lp, $rc (v$CMD_VERSION)"
    return 0
}
if [[ ${SPARK_VLLM_TOOLS_IGNORE_PATH:-0} != 1 ]] && path_tools_ok; then
    dirname "$(command -v pulumi)"
    exit 0
fi

# --- 2. cache --------------------------------------------------------------------------------
CACHE_ROOT=${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}/toolchain
KEY="pulumi-v$CLI_VERSION-command-v$CMD_VERSION"
FINAL="$CACHE_ROOT/$KEY"
PARTIAL="$CACHE_ROOT/$KEY.partial"
NAMES=(pulumi pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python pulumi-resource-command)

complete_in() { local n; for n in "${NAMES[@]}"; do [[ -x "$1/bin/$n" ]] || return 1; done; }

if complete_in "$FINAL"; then   # fast path: no lock, no network
    echo "$FINAL/bin"
    exit 0
fi

command -v go >/dev/null || die "go not found (Go >= 1.26 is needed to build the Pulumi engine)"
mkdir -p "$CACHE_ROOT"
# One builder at a time (several shells may source env.sh at once).
exec 9>"$CACHE_ROOT/.lock"
if ! flock -n 9; then
    log "another build holds $CACHE_ROOT/.lock; waiting"
    flock 9
fi
if complete_in "$FINAL"; then echo "$FINAL/bin"; exit 0; fi

mkdir -p "$PARTIAL/bin"
WORK=$(mktemp -d "$CACHE_ROOT/.work.XXXXXX")
trap 'rm -rf "$WORK"; rm -f "$PARTIAL"/bin/.*.tmp.* 2>/dev/null || true' EXIT

export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export CGO_ENABLED=${CGO_ENABLED:-0}

now() { date +%s; }

mod_download() { # mod_download MODULE@VERSION -> JSON on stdout; rc 1 (message on stderr) if refused
    local out
    out=$(cd "$WORK" && GOFLAGS=-mod=mod go mod download -json "$1" 2>&1) || true
    if printf '%s' "$out" | grep -q '"Error"' || ! printf '%s' "$out" | grep -q '"Dir"'; then
        printf '%s\n' "$out" | sed -n -E 's/.*"Error": "(.*)".*/\1/p' | sed 's/\\n/\n/g; s/\\t/  /g' >&2
        return 1
    fi
    printf '%s\n' "$out"
}
mod_field() { # mod_field MODULE@VERSION FIELD -> one field (Dir, GoMod, ...) of the download
    local js
    js=$(mod_download "$1") || return 1
    printf '%s' "$js" | python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# wrapper_module DIR NAME MODULE@VERSION... : a small main module requiring the given modules,
# carrying over the non-local replace directives of each (theirs are ignored in a dependency,
# and the local ones, like pkg's "sdk/v3 => ../sdk", are replaced by the explicit requires).
wrapper_module() {
    local dir=$1 name=$2 mv gomod
    shift 2
    mkdir -p "$dir"
    printf 'module sparkvllm.local/toolchain/%s\n\ngo 1.26\n' "$name" >"$dir/go.mod"
    for mv in "$@"; do
        gomod=$(mod_field "$mv" GoMod) || return 1
        (cd "$dir" && go mod edit -require="$mv")
        go mod edit -json "$gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    new = r["New"]
    if new.get("Version"):   # module replacement (local directory replacements are skipped)
        old = r["Old"]["Path"] + ("@" + r["Old"]["Version"] if r["Old"].get("Version") else "")
        print(old + "=" + new["Path"] + "@" + new["Version"])
' | while read -r rep; do (cd "$dir" && go mod edit -replace="$rep"); done
    done
}

# go_build DIR PKG OUT LDFLAGS-X: build PKG in wrapper DIR to OUT (temporary name, then rename)
go_build() {
    local dir=$1 pkg=$2 out=$3 x=$4 tmp
    tmp="$(dirname "$out")/.$(basename "$out").tmp.$$"
    (cd "$dir" && go build -trimpath -ldflags "-s -w -X $x" -o "$tmp" "$pkg") || { rm -f "$tmp"; return 1; }
    mv -f "$tmp" "$out"
}

refused_recently() { # a refusal stamp younger than 24 h (skipped with SPARK_VLLM_TOOLS_RETRY=1)
    local f="$PARTIAL/REFUSED-$1"
    [[ ${SPARK_VLLM_TOOLS_RETRY:-0} != 1 && -f $f ]] && (( $(now) - $(stat -c %Y "$f") < 86400 ))
}
MISSING=()

# --- the CLI ---------------------------------------------------------------------------------
if [[ ! -x "$PARTIAL/bin/pulumi" ]]; then
    log "building pulumi CLI v$CLI_VERSION (cold: several minutes)"
    t0=$(now)
    wrapper_module "$WORK/cli" pulumi "github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION" \
        "github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION" ||
        die "the module proxy does not serve pkg/v3 and sdk/v3 at v$CLI_VERSION: pick another CLI version in cli_version_for_sdk()"
    go_build "$WORK/cli" "$CLI_MAIN" "$PARTIAL/bin/pulumi" "$VERSION_X=v$CLI_VERSION" ||
        die "building the pulumi CLI failed"
    log "pulumi CLI v$CLI_VERSION built in $(( $(now) - t0 ))s"
fi

# --- the Python language host (+ the scripts that ship beside it, from sdk/v3) ---------------
# pulumi-language-python-exec runs the program; pulumi-resource-pulumi-python serves Python
# dynamic providers (it runs ${PULUMI_RUNTIME_VIRTUALENV}/bin/python, else python3, -m pulumi.dynamic).
if [[ ! -x "$PARTIAL/bin/pulumi-language-python-exec" || ! -x "$PARTIAL/bin/pulumi-resource-pulumi-python" ]]; then
    t0=$(now)
    sdkdir=$(mod_field "github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION" Dir) ||
        die "sdk/v3 v$CLI_VERSION not served"
    for src in python/cmd/pulumi-language-python-exec python/dist/pulumi-resource-pulumi-python; do
        tmp="$PARTIAL/bin/.$(basename "$src").tmp.$$"
        cp "$sdkdir/$src" "$tmp"
        chmod 0755 "$tmp"
        mv -f "$tmp" "$PARTIAL/bin/$(basename "$src")"
    done
    log "pulumi-language-python-exec, pulumi-resource-pulumi-python copied from sdk/v3 v$CLI_VERSION in $(( $(now) - t0 ))s"
fi
if [[ ! -x "$PARTIAL/bin/pulumi-language-python" ]]; then
    if [[ -z $LANG_PY_VERSION ]]; then
        note "pulumi-language-python: no module version known for CLI v$CLI_VERSION ($LANG_MOD has no tags;"
        note "  the module proxy refuses @v/list, @latest and commit queries for it). Set"
        note "  SPARK_VLLM_LANGUAGE_PYTHON_VERSION=v3.0.0-<time>-<commit> (the v$CLI_VERSION release commit)."
        MISSING+=(pulumi-language-python)
    elif refused_recently language-python; then
        note "pulumi-language-python: $LANG_MOD@$LANG_PY_VERSION was refused by the module proxy less than 24 h ago (SPARK_VLLM_TOOLS_RETRY=1 to retry)"
        MISSING+=(pulumi-language-python)
    else
        log "building pulumi-language-python ($LANG_MOD@$LANG_PY_VERSION) (cold: a few minutes)"
        t0=$(now)
        if wrapper_module "$WORK/lang" pulumi-language-python "$LANG_MOD@$LANG_PY_VERSION" \
            "github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION" "github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION"; then
            go_build "$WORK/lang" "$LANG_MOD" "$PARTIAL/bin/pulumi-language-python" "$VERSION_X=v$CLI_VERSION" ||
                die "building pulumi-language-python failed"
            log "pulumi-language-python built in $(( $(now) - t0 ))s"
        else
            log "pulumi-language-python: the module proxy refused $LANG_MOD@$LANG_PY_VERSION"
            touch "$PARTIAL/REFUSED-language-python"
            MISSING+=(pulumi-language-python)
        fi
    fi
fi

# --- the command provider --------------------------------------------------------------------
if [[ ! -x "$PARTIAL/bin/pulumi-resource-command" ]]; then
    if [[ -z $CMD_MOD_VERSION ]]; then
        note "pulumi-resource-command: no module version known for pulumi-command==$CMD_VERSION; set SPARK_VLLM_COMMAND_PROVIDER_VERSION"
        MISSING+=(pulumi-resource-command)
    elif refused_recently command; then
        note "pulumi-resource-command: $CMD_MOD@$CMD_MOD_VERSION was refused by the module proxy less than 24 h ago (SPARK_VLLM_TOOLS_RETRY=1 to retry)"
        MISSING+=(pulumi-resource-command)
    else
        log "building pulumi-resource-command v$CMD_VERSION ($CMD_MOD@$CMD_MOD_VERSION) (cold: a few minutes)"
        t0=$(now)
        if wrapper_module "$WORK/cmd" pulumi-resource-command "$CMD_MOD@$CMD_MOD_VERSION"; then
            go_build "$WORK/cmd" "$CMD_MAIN" "$PARTIAL/bin/pulumi-resource-command" "$CMD_VERSION_X=v$CMD_VERSION" ||
                die "building pulumi-resource-command failed"
            log "pulumi-resource-command v$CMD_VERSION built in $(( $(now) - t0 ))s"
        else
            log "pulumi-resource-command: the module proxy refused $CMD_MOD@$CMD_MOD_VERSION"
            touch "$PARTIAL/REFUSED-command"
            MISSING+=(pulumi-resource-command)
        fi
    fi
fi

have() { [[ -x "$PARTIAL/bin/$1" ]] && echo "$2" || echo unavailable; }
cat >"$PARTIAL/bin/VERSIONS" <<EOF
pulumi=v$CLI_VERSION
pulumi-language-python=$(have pulumi-language-python "${LANG_PY_VERSION:-unknown}")
pulumi-resource-command=$(have pulumi-resource-command "v$CMD_VERSION")
python-sdk-pin=$SDK_VERSION
EOF

if complete_in "$PARTIAL"; then
    rm -f "$PARTIAL"/REFUSED-*
    rm -rf "$FINAL"
    mv "$PARTIAL" "$FINAL"
    log "toolchain complete: $FINAL/bin"
    echo "$FINAL/bin"
    exit 0
fi

log "engine INCOMPLETE: missing ${MISSING[*]} (in $PARTIAL/bin: $(cd "$PARTIAL/bin" && ls | tr '\n' ' '))"
if [[ ${SPARK_VLLM_TOOLS_PARTIAL:-0} == 1 ]]; then
    note "SPARK_VLLM_TOOLS_PARTIAL=1: using the partial toolchain (inline Automation API programs without providers only)"
    echo "$PARTIAL/bin"
    exit 0
fi
exit 3
