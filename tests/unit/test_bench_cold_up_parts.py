"""bench/report.py's cold up, part by part: the parts follow one another along the critical
path, so they must add up to the run's seconds, for spark-vllm (from the engine's steps) and
for the bare path (from its own); and a run without the steps has no parts, not made-up ones."""

from __future__ import annotations

from typing import Any

import pytest

from bench.report import COLD_UP_PARTS, cold_up_parts, cold_up_section


def ours(seconds: float, first: float, head: float, gate: float, vllm: float,
         vllm_s: float) -> dict[str, Any]:
    steps = {"create node-1-preflight": {"start": first, "s": 0.5},
             "create ray-head": {"start": head, "s": 1.4},
             "create ray-worker-node-2": {"start": head + 1.5, "s": 5.9},
             "create ray-gate": {"start": gate, "s": 0.8},
             "create vllm-serve": {"start": vllm, "s": vllm_s}}
    return {"nodes": 2, "contender": "spark-vllm", "scenario": "cold_up", "ok": True,
            "seconds": seconds, "profile": {"first_remote_s": first, "steps": steps}}


def bare(seconds: float, head: float, workers: float) -> dict[str, Any]:
    return {"nodes": 2, "contender": "bare", "scenario": "cold_up", "ok": True,
            "seconds": seconds,
            "profile": {"steps": {"ray_head_s": head, "ray_workers_s": workers,
                                  "vllm_run_s": 0.4}}}


def test_spark_vllms_parts_follow_its_steps_and_add_up_to_the_run() -> None:
    parts = cold_up_parts(ours(19.4, first=1.7, head=4.5, gate=12.0, vllm=12.9, vllm_s=6.1))
    assert parts == pytest.approx({"engine start": 1.7, "checks": 2.8,
                                   "Ray head + workers": 7.5, "gate": 0.9,
                                   "vLLM to serving": 6.1, "after": 0.4})
    assert sum(parts.values()) == pytest.approx(19.4)
    assert set(parts) == set(COLD_UP_PARTS)


def test_the_bare_paths_parts_add_up_to_the_run() -> None:
    parts = cold_up_parts(bare(12.7, head=3.6, workers=3.7))
    assert parts == pytest.approx({"Ray head + workers": 7.3, "vLLM to serving": 5.4})


def test_a_run_without_its_steps_or_that_failed_has_no_parts() -> None:
    failed = ours(19.4, 1.7, 4.5, 12.0, 12.9, 6.1) | {"ok": False}
    no_gate = ours(19.4, 1.7, 4.5, 12.0, 12.9, 6.1)
    del no_gate["profile"]["steps"]["create ray-gate"]
    old_bare = bare(12.7, 3.6, 3.7) | {"profile": {}}
    assert [cold_up_parts(r) for r in (failed, no_gate, old_bare)] == [None, None, None]


def test_the_section_sets_the_medians_side_by_side_with_their_difference() -> None:
    runs = [ours(19.0, 1.6, 4.4, 11.9, 12.8, 6.0), ours(19.4, 1.7, 4.5, 12.0, 12.9, 6.1),
            ours(21.0, 1.8, 4.6, 12.1, 13.0, 7.6), bare(12.7, 3.6, 3.7), bare(13.0, 3.7, 3.6),
            bare(14.0, 4.0, 3.9)]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
            for line in cold_up_section(runs) if line.startswith("| ")}
    assert rows["checks"] == ["2.8", "–", "+2.8"]
    assert rows["gate"] == ["0.9", "–", "+0.9"]
    assert rows["Ray head + workers"] == ["7.5", "7.3", "+0.2"]
    assert rows["total"] == ["19.4", "13.0", "+6.4"]


def test_no_section_without_both_contenders() -> None:
    assert cold_up_section([ours(19.4, 1.7, 4.5, 12.0, 12.9, 6.1)]) == []
