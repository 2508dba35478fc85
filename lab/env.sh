# shellcheck shell=bash
# Source me (bash), from any directory:   source lab/env.sh
#
# Puts the Pulumi engine on PATH (lab/tools.sh: the CLI built from Go modules and cached; then
# lab/engine/bin: the labelled stand-ins for the language host and the command provider, which
# the module proxy here refuses — a real plugin earlier on PATH wins) and points Pulumi at
# local, offline state:
#   PULUMI_BACKEND_URL=file://<repo>/.lab/state  PULUMI_HOME=<repo>/.lab/pulumi-home
#   PULUMI_CONFIG_PASSPHRASE (default spark-vllm-lab)  PULUMI_SKIP_UPDATE_CHECK=true
#   PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
# Safe under `set -euo pipefail`; returns non-zero (never exits the caller's shell) on failure.

if [ -z "${BASH_VERSION:-}" ]; then
    echo "lab/env.sh: needs bash (in a Makefile: SHELL := bash)" >&2
    return 1 2>/dev/null || exit 1
fi

_svl_env() {
    local here repo bin
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) || return 1
    repo=$(cd "$here/.." && pwd) || return 1
    bin=$("$here/tools.sh" | tail -n 1) || { echo "lab/env.sh: lab/tools.sh failed" >&2; return 1; }
    case ":$PATH:" in *":$repo/lab/engine/bin:"*) ;; *) PATH="$repo/lab/engine/bin:$PATH" ;; esac
    case ":$PATH:" in ":$bin:"*) ;; *) PATH="$bin:$PATH" ;; esac
    mkdir -p "$repo/.lab/state" "$repo/.lab/pulumi-home" || return 1
    export PATH
    export SPARK_VLLM_TOOLCHAIN_BIN="$bin"
    export PULUMI_BACKEND_URL="file://$repo/.lab/state"
    export PULUMI_HOME="$repo/.lab/pulumi-home"
    export PULUMI_CONFIG_PASSPHRASE="${PULUMI_CONFIG_PASSPHRASE:-spark-vllm-lab}"
    export PULUMI_SKIP_UPDATE_CHECK=true
    export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
}
_svl_rc=0
_svl_env || _svl_rc=$?
unset -f _svl_env
# shellcheck disable=SC2317  # return works when sourced, exit when (wrongly) executed
if [ "$_svl_rc" -ne 0 ]; then unset _svl_rc; return 1 2>/dev/null || exit 1; fi
unset _svl_rc
