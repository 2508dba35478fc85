#!/usr/bin/env bash
# `make test`: every test, in two pytest processes side by side.
#
# - the lab suite (tests/integration: the real engine against the Docker lab, one lab at a time
#   on this machine) in the foreground: it spends most of its time waiting on containers, SSH
#   and Ray, and it sets the run's length;
# - the rest (unit, vllm-sim, the GPU tier's fidelity, toolchain, engine conformance), which
#   needs no lab, beside it at a lower CPU priority (nice), then the CPU tier (tests/cpu_tier:
#   real vLLM across two network namespaces, CPU-bound while its ranks start, so after the
#   rest rather than beside it); their output kept in .lab/test-rest.log and printed after the
#   lab suite's.
#
# Each prints its own "where the time went" table (tests/conftest.py). SPARK_VLLM_SERIAL=1 runs
# the two one after the other (to measure either alone). Exit status: the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p .lab
log=.lab/test-rest.log
rest_cmd=(nice -n 15 "$PY" -m pytest -q -ra --ignore=tests/integration --ignore=tests/cpu_tier tests)
cpu_cmd=(nice -n 10 "$PY" -m pytest -q -ra tests/cpu_tier)
lab_cmd=("$PY" -m pytest -q -ra tests/integration)
t0=$(date +%s)

rest_then_cpu() {
    local rc=0
    SPARK_VLLM_TIMING_FILE=.lab/timing-rest.json "${rest_cmd[@]}" || rc=$?
    if [ -d tests/cpu_tier ]; then
        echo "[test] the CPU tier (real vLLM, two nodes) after the rest: $(( $(date +%s) - t0 )) s in"
        SPARK_VLLM_TIMING_FILE=.lab/timing-cpu.json "${cpu_cmd[@]}" || { [ "$rc" -ne 0 ] || rc=$?; }
    fi
    return "$rc"
}

if [ "${SPARK_VLLM_SERIAL:-0}" = 1 ]; then
    rest_then_cpu; rest_rc=$?
    SPARK_VLLM_TIMING_FILE=.lab/timing-lab.json "${lab_cmd[@]}"; lab_rc=$?
else
    rest_then_cpu >"$log" 2>&1 &
    rest=$!
    # an interrupted run leaves no pytest behind: SIGINT, as a Ctrl-C, so that pytest runs its
    # fixtures' teardown (vllm-sim servers, Ray, the CPU tier's namespaces)
    trap 'pkill -INT -P "$rest" 2>/dev/null; wait "$rest"; exit 130' INT TERM
    echo "[test] the rest of the suite runs beside the lab suite (pid $rest, log $log)"
    SPARK_VLLM_TIMING_FILE=.lab/timing-lab.json "${lab_cmd[@]}"; lab_rc=$?
    t_lab=$(date +%s)
    if kill -0 "$rest" 2>/dev/null; then
        echo "[test] the lab suite is done; waiting for the rest (every test in it has its own deadline)"
    fi
    wait "$rest"; rest_rc=$?
    echo
    echo "================ the rest and the CPU tier (beside the lab suite): $log ================"
    cat "$log"
    echo "[test] lab suite $(( t_lab - t0 )) s (exit $lab_rc); the rest ended $(( $(date +%s) - t0 )) s after the start (exit $rest_rc)"
fi
[ "$lab_rc" -ne 0 ] && exit "$lab_rc"
exit "$rest_rc"
