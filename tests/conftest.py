"""Where the suite's time goes, printed at the end of every run, and the suite's budget.

- A table per module (tests, seconds with setup and teardown, share of the run) and the
  slowest tests, so the next addition shows its cost (written to `.lab/timing.json` too, or
  to $SPARK_VLLM_TIMING_FILE: lab/test.sh runs the lab suite and the rest side by side).
- A budget: CI's hard limit is 90 minutes for everything (`.ci/run`), so the suite alone may
  take SPARK_VLLM_SUITE_BUDGET_S (default 3000 s: 50 min; the lab suite, the longest, took
  2436 s on 2026-12-03 with the rest beside it). Past it, the run stops before the next test
  with the modules that took the time named, instead of running into CI's kill with nothing
  said. 0 turns the check off. Counted from SPARK_VLLM_SUITE_START (epoch seconds; lab/test.sh
  sets it when `make test` starts, so a pytest it starts late is held to the same end), else
  from this process's start.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = float(os.environ.get("SPARK_VLLM_SUITE_BUDGET_S", "3000"))
SLOWEST = 15

_start = time.monotonic()
# lab/test.sh's start (a pytest it starts late is held to the same end), else this process's
_since_suite_start = time.time() - float(os.environ.get("SPARK_VLLM_SUITE_START") or time.time())
_budget_start = _start - max(0.0, _since_suite_start)
_seconds: dict[str, float] = defaultdict(float)  # nodeid -> setup + call + teardown
_outcome: dict[str, str] = {}


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _by_module() -> list[tuple[str, int, float]]:
    per: dict[str, list[float]] = defaultdict(list)
    for nodeid, s in _seconds.items():
        per[_module(nodeid)].append(s)
    return sorted(((m, len(v), sum(v)) for m, v in per.items()), key=lambda r: -r[2])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] += report.duration
    if report.when == "call" or report.outcome != "passed":
        _outcome[report.nodeid] = report.outcome


def pytest_runtest_setup(item: pytest.Item) -> None:
    elapsed = time.monotonic() - _budget_start
    if BUDGET_S and elapsed > BUDGET_S:
        top = ", ".join(f"{m} {s:.0f} s" for m, _, s in _by_module()[:5])
        pytest.exit(f"the suite passed its budget: {elapsed:.0f} s > SPARK_VLLM_SUITE_BUDGET_S="
                    f"{BUDGET_S:.0f} s before {item.nodeid} (CI's hard limit is 5400 s for "
                    f"everything). Where the time went: {top}", returncode=3)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    if not _seconds:
        return
    total = time.monotonic() - _start
    rows = _by_module()
    w = terminalreporter
    w.section(f"where the time went ({total:.0f} s wall, {len(_seconds)} tests)")
    w.write_line(f"{'module':<58} {'tests':>5} {'seconds':>8} {'share':>6}")
    for module, n, s in rows:
        w.write_line(f"{module:<58} {n:>5} {s:>8.1f} {s / total:>6.1%}")
    w.write_line(f"{'(collection, fixtures between modules, teardown)':<58} {'':>5} "
                 f"{total - sum(r[2] for r in rows):>8.1f}")
    w.write_line("")
    w.write_line(f"slowest {SLOWEST} tests (setup + call + teardown):")
    for nodeid, s in sorted(_seconds.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        w.write_line(f"  {s:>7.1f} s  {nodeid}  [{_outcome.get(nodeid, '?')}]")
    out = REPO / os.environ.get("SPARK_VLLM_TIMING_FILE", ".lab/timing.json")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"wall_s": round(total, 1), "modules": [
            {"module": m, "tests": n, "seconds": round(s, 1)} for m, n, s in rows],
            "tests": {k: round(v, 2) for k, v in _seconds.items()}}, indent=1))
    except OSError:
        pass
