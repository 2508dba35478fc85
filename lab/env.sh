# shellcheck shell=bash
# Source me (bash), from any directory:   source lab/env.sh
#
# Puts the real Pulumi engine (built and cached by lab/tools.sh) first on PATH and points Pulumi
# at local, offline state:
#   PULUMI_BACKEND_URL=file://<repo>/.lab/state     (override it after sourcing for a scratch backend)
#   PULUMI_HOME=<repo>/.lab/pulumi-home             (no ~/.pulumi plugin cache can interfere)
#   PULUMI_CONFIG_PASSPHRASE (default spark-vllm-lab), PULUMI_SKIP_UPDATE_CHECK=true,
#   PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
# and exports SPARK_VLLM_ENGINE:
#   complete  CLI + pulumi-language-python + pulumi-resource-command: `pulumi up` on the project
#   partial   CLI (+ the Python scripts from sdk/v3) only: lab/tools.sh could not get the language
#             host or the command provider. Automation API inline programs still run, with
#             resources that need no provider plugin or Python dynamic providers (set
#             PULUMI_RUNTIME_VIRTUALENV to the venv for those); callers needing more should skip
#             with a reason
# With SPARK_VLLM_TOOLS_PARTIAL=0 a partial engine is an error instead (return 1).
# Safe under `set -euo pipefail`; returns non-zero (never exits the caller's shell) on failure.

if [ -z "${BASH_VERSION:-}" ]; then
    echo "lab/env.sh: needs bash (in a Makefile: SHELL := bash)" >&2
    return 1 2>/dev/null || exit 1
fi

_svl_env() {
    local here repo out rc bin n
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) || return 1
    repo=$(cd "$here/.." && pwd) || return 1

    # Quiet when cached: tools.sh prints nothing on stderr then. A cold build shows its progress.
    rc=0
    out=$(SPARK_VLLM_TOOLS_QUIET=1 SPARK_VLLM_TOOLS_PARTIAL="${SPARK_VLLM_TOOLS_PARTIAL:-1}" \
        "$here/tools.sh") || rc=$?
    bin=${out##*$'\n'}
    if [ "$rc" -ne 0 ] || [ -z "$bin" ] || [ ! -x "$bin/pulumi" ]; then
        echo "lab/env.sh: lab/tools.sh failed (exit $rc): no Pulumi engine" >&2
        return 1
    fi

    SPARK_VLLM_ENGINE=complete
    for n in pulumi-language-python pulumi-language-python-exec pulumi-resource-command; do
        [ -x "$bin/$n" ] || SPARK_VLLM_ENGINE=partial
    done
    if [ "$SPARK_VLLM_ENGINE" = partial ]; then
        echo "lab/env.sh: partial Pulumi engine (CLI only, see lab/tools.sh): $bin" >&2
    fi

    case ":$PATH:" in
        ":$bin:"*) ;;
        *) PATH="$bin:$PATH" ;;
    esac

    mkdir -p "$repo/.lab/state" "$repo/.lab/pulumi-home" || return 1
    export PATH SPARK_VLLM_ENGINE
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
