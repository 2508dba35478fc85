# shellcheck shell=bash
# Source me (bash), from any directory:   source lab/env.sh
#
# Puts the Pulumi engine of lab/tools.sh on PATH (the real CLI with its bundled Python language
# host: the official one, or the lab's launcher of the SDK's own language server), links the
# command provider (the real one, or the lab's stand-in) into that engine's own plugin cache
# where `pulumi plugin install` puts a download, and points Pulumi at local, offline state:
#   PULUMI_BACKEND_URL=file://<repo>/.lab/state
#   PULUMI_HOME=<repo>/.lab/pulumi-home/<engine>   one per engine choice (<engine>: the name of
#       lab/tools.sh's engine dir), so a shell that sources this with another engine never
#       relinks the provider under a run already going in another shell
#   SPARK_VLLM_OPERATOR_PULUMI_HOME   your own PULUMI_HOME (default ~/.pulumi), kept from the
#       first source: where lab/tools.sh looks for an installed real provider
#   (SPARK_VLLM_LAB=N, another lab of this machine: its state in <repo>/.lab/labN/state)
#   PULUMI_CONFIG_PASSPHRASE (default spark-vllm-lab)  PULUMI_SKIP_UPDATE_CHECK=true
#   PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
#   PULUMI_IGNORE_AMBIENT_PLUGINS=true   a stray pulumi-resource-* on the user's PATH is not
#                                        what the lab runs; bundled plugins are still found
# Safe under `set -euo pipefail`; returns non-zero (never exits the caller's shell) on failure.

if [ -z "${BASH_VERSION:-}" ]; then
    echo "lab/env.sh: needs bash (in a Makefile: SHELL := bash)" >&2
    return 1 2>/dev/null || exit 1
fi

_svl_env() {
    local here repo bin plugdir leaf kind rest name target out state home
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) || return 1
    repo=$(cd "$here/.." && pwd) || return 1
    if [ -z "${SPARK_VLLM_OPERATOR_PULUMI_HOME:-}" ]; then
        case "${PULUMI_HOME:-}" in
            */.lab/pulumi-home|*/.lab/pulumi-home/*) SPARK_VLLM_OPERATOR_PULUMI_HOME=$HOME/.pulumi ;;
            *) SPARK_VLLM_OPERATOR_PULUMI_HOME=${PULUMI_HOME:-$HOME/.pulumi} ;;
        esac
    fi
    export SPARK_VLLM_OPERATOR_PULUMI_HOME
    bin=$("$here/tools.sh" | tail -n 1) || { echo "lab/env.sh: lab/tools.sh failed" >&2; return 1; }
    home="$repo/.lab/pulumi-home/$(basename "$(dirname "$bin")")"
    case ":$PATH:" in ":$bin:"*) ;; *) PATH="$bin:$PATH" ;; esac
    # lab N's state beside lab 1's, as lab/config.py's STATE_DIR
    state="$repo/.lab/state"
    case "${SPARK_VLLM_LAB:-1}" in
        1) ;;
        [2-9]) state="$repo/.lab/lab$SPARK_VLLM_LAB/state" ;;
        *) echo "lab/env.sh: SPARK_VLLM_LAB=$SPARK_VLLM_LAB: must be a number within 1..9" >&2; return 1 ;;
    esac
    mkdir -p "$state" "$home" || return 1
    export PATH
    export SPARK_VLLM_TOOLCHAIN_BIN="$bin"
    export PULUMI_BACKEND_URL="file://$state"
    export PULUMI_HOME="$home"
    export PULUMI_CONFIG_PASSPHRASE="${PULUMI_CONFIG_PASSPHRASE:-spark-vllm-lab}"
    export PULUMI_SKIP_UPDATE_CHECK=true
    export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
    export PULUMI_IGNORE_AMBIENT_PLUGINS=true
    # <engine>/plugins/<kind>-<name>-v<version>/<binary>: link each into this engine's plugin
    # cache, where `pulumi plugin install` would put a download (a link, not a copy: the
    # stand-in provider is a script that finds this checkout from its own path). The cache is
    # this engine's alone: the link, once made, only changes if the engine dir is rebuilt.
    for plugdir in "$bin"/../plugins/*-v*/; do
        [ -d "$plugdir" ] || continue
        leaf=$(basename "$plugdir"); kind=${leaf%%-*}; rest=${leaf#*-}; name=${rest%-v*}
        target=$(readlink -f "$plugdir/pulumi-$kind-$name") || return 1
        out="$PULUMI_HOME/plugins/$leaf"
        if [ "$(readlink -f "$out/pulumi-$kind-$name" 2>/dev/null)" != "$target" ]; then
            # a new link renamed over the old name: two shells sourcing this at once (the lab
            # suite and the rest of the tests start together) both end with the right link
            rm -rf "$out.lock" "$out.partial" && mkdir -p "$out" &&
                ln -sfn "$target" "$out/.pulumi-$kind-$name.$$" &&
                mv -Tf "$out/.pulumi-$kind-$name.$$" "$out/pulumi-$kind-$name" ||
                { echo "lab/env.sh: linking the $kind plugin $name into $out failed" >&2; return 1; }
        fi
    done
}
_svl_rc=0
_svl_env || _svl_rc=$?
unset -f _svl_env
# shellcheck disable=SC2317  # return works when sourced, exit when (wrongly) executed
if [ "$_svl_rc" -ne 0 ]; then unset _svl_rc; return 1 2>/dev/null || exit 1; fi
unset _svl_rc
