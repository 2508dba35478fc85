#!/usr/bin/env bash
# `make test`: every test, in two lanes side by side.
#
# - lane 1, in the foreground: most of the lab suite (tests/integration: the real engine against
#   the Docker lab). It spends most of its time waiting on containers, SSH and Ray, and it
#   sets the run's length.
# - lane 2, beside it, its output kept in .lab/test-rest.log and printed after lane 1's:
#   1. the rest (unit, vllm-sim, the GPU tier's fidelity, toolchain, engine conformance),
#      which needs no lab, at a lower CPU priority (nice);
#   2. the lab suite's modules in LAB2_MODULES, on a second lab of their own (SPARK_VLLM_LAB=2:
#      its own containers, networks, subnets, stack and state; lab/config.py), so that the
#      two lanes end near each other;
#   3. the CPU tier (tests/cpu_tier: real vLLM across two network namespaces, CPU-bound while
#      its ranks start, so last rather than beside the rest).
#
# Each pytest prints its own "where the time went" table (tests/conftest.py); every one is held
# to the suite's budget counted from this script's start (SPARK_VLLM_SUITE_START).
# SPARK_VLLM_SERIAL=1 runs everything one after the other, on lab 1 (to measure a part alone).
# Exit status: the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
PY=.venv/bin/python
mkdir -p .lab
# the repository's own modules' bytecode, as make venv makes the installed ones' (where
# PYTHONDONTWRITEBYTECODE is set, Python writes none and every process compiles its imports)
"$PY" -m compileall -q -j0 spark_vllm components lab bench __main__.py >/dev/null || exit
log=.lab/test-rest.log
# lab suite modules lane 2 runs on lab 2 (~750 s of the ~2700 s): ones that set up a lab of
# their own and need nothing of another module (test_upgrade stays in lane 1: it deploys an
# older commit of the program, which knows lab 1 only)
LAB2_MODULES=(tests/integration/test_wedge.py tests/integration/test_legacy_vllm.py
              tests/integration/test_operator_project.py tests/integration/test_several.py
              tests/integration/test_v2_executor.py)
# Why these, on two labs, and what each layout measured: docs/development.md ("Tests").
# SPARK_VLLM_LABS=1 runs every lab module on lab 1.
labs=${SPARK_VLLM_LABS:-2}
[ "$labs" = 2 ] || LAB2_MODULES=()
rest_cmd=(nice -n 15 "$PY" -m pytest -q -ra --ignore=tests/integration --ignore=tests/cpu_tier tests)
cpu_cmd=(nice -n 10 "$PY" -m pytest -q -ra tests/cpu_tier)
lab_cmd=("$PY" -m pytest -q -ra tests/integration)
lab2_cmd=(nice -n 5 "$PY" -m pytest -q -ra "${LAB2_MODULES[@]}")
t0=$(date +%s)
export SPARK_VLLM_SUITE_START=$t0

first() { [ "$rc" -ne 0 ] || rc=$1; }  # first CODE: keep the caller's first failure in rc

lane2() {
    local rc=0
    SPARK_VLLM_TIMING_FILE=.lab/timing-rest.json "${rest_cmd[@]}" || first $?
    if [ "${#LAB2_MODULES[@]}" -gt 0 ]; then
        echo "[test] lab 2 (${LAB2_MODULES[*]##*/}) after the rest: $(( $(date +%s) - t0 )) s in"
        SPARK_VLLM_LAB=2 SPARK_VLLM_TIMING_FILE=.lab/timing-lab2.json "${lab2_cmd[@]}" || first $?
    fi
    if [ -d tests/cpu_tier ]; then
        echo "[test] the CPU tier (real vLLM, two nodes) after the rest${LAB2_MODULES[*]:+ and lab 2}: $(( $(date +%s) - t0 )) s in"
        SPARK_VLLM_TIMING_FILE=.lab/timing-cpu.json "${cpu_cmd[@]}" || first $?
    fi
    return "$rc"
}

if [ "${SPARK_VLLM_SERIAL:-0}" = 1 ]; then
    LAB2_MODULES=()  # every lab module on lab 1, after lane 2's other parts
    lane2; rest_rc=$?
    SPARK_VLLM_TIMING_FILE=.lab/timing-lab.json "${lab_cmd[@]}"; lab_rc=$?
else
    lab_cmd+=("${LAB2_MODULES[@]/#/--ignore=}")
    lane2 >"$log" 2>&1 &
    rest=$!
    # an interrupted run leaves no pytest behind: SIGINT, as a Ctrl-C, so that pytest runs its
    # fixtures' teardown (vllm-sim servers, Ray, the CPU tier's namespaces)
    trap 'pkill -INT -P "$rest" 2>/dev/null; wait "$rest"; exit 130' INT TERM
    echo "[test] $labs lab(s); lane 2 (the rest,${LAB2_MODULES[*]:+ lab 2,} the CPU tier) runs beside the lab suite (pid $rest, log $log)"
    SPARK_VLLM_TIMING_FILE=.lab/timing-lab.json "${lab_cmd[@]}"; lab_rc=$?
    t_lab=$(date +%s)
    if kill -0 "$rest" 2>/dev/null; then
        echo "[test] the lab suite is done; waiting for lane 2 (every test in it has its own deadline)"
    fi
    wait "$rest"; rest_rc=$?
    echo
    echo "================ lane 2: the rest, lab 2, the CPU tier (beside the lab suite): $log ================"
    cat "$log"
    echo "[test] lab suite (lab 1) $(( t_lab - t0 )) s (exit $lab_rc); lane 2 ended $(( $(date +%s) - t0 )) s after the start (exit $rest_rc)"
fi
[ "$lab_rc" -ne 0 ] && exit "$lab_rc"
exit "$rest_rc"
