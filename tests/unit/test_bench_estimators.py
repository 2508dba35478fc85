"""bench/estimators.py (the estimator section of the bench): the row arithmetic from given
numbers, and spark-vllm's own estimate in the rows against the committed recordings of real
vLLM 0.26.0. No peers' venv: kvfit and sparkrun run only in `python -m bench --only
estimators`."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from bench import estimators, estimators_cases, estimators_report

GiB = 1 << 30


def case(available: float | None, tokens: int | None, outcome: str = "started") -> dict[str, Any]:
    return {"id": "f:x", "fixture": "f", "model": "m", "set": "fitted", "tp": 1,
            "utilization": 0.5, "max_model_len": None, "max_num_seqs": 64,
            "max_num_batched_tokens": None, "kv_cache_dtype": "auto", "total_bytes": 100 * GiB,
            "free_bytes": 100 * GiB, "weight_bytes": GiB,
            "vllm": {"available_gib": available, "tokens": tokens, "outcome": outcome,
                     "refusal": "x" if outcome == "refused" else ""}}


def test_row_errors_are_signed_against_vllm() -> None:
    row = estimators.build_row(case(10.0, 1000), {
        "over": {"available_bytes": 12.5 * GiB, "tokens": 1100, "admits": True},
        "under": {"available_bytes": 9 * GiB, "tokens": 950, "admits": False},
        "none": {"available_bytes": None, "tokens": None, "admits": False, "error": "E"}})
    over, under, none = (row["tools"][k] for k in ("over", "under", "none"))
    assert over["available_gib"] == 12.5 and over["err_available_pct"] == pytest.approx(25.0)
    assert over["err_tokens_pct"] == pytest.approx(10.0)
    assert under["err_available_pct"] == pytest.approx(-10.0)
    assert under["err_tokens_pct"] == pytest.approx(-5.0)
    assert none["err_available_pct"] is None and none["error"] == "E"
    # vLLM started: refusing it is the false refusal, admitting it is no finding
    assert not over["admitted_refused"] and not over["refused_started"]
    assert under["refused_started"] and none["refused_started"]


def test_admitted_what_vllm_refused_and_the_summary() -> None:
    refused = estimators.build_row({**case(None, None, "refused"), "id": "f:r"}, {
        "a": {"available_bytes": 5 * GiB, "tokens": 10, "admits": True},
        "b": {"available_bytes": 5 * GiB, "tokens": 10, "admits": False}})
    assert refused["tools"]["a"]["admitted_refused"]
    assert not refused["tools"]["b"]["admitted_refused"]
    assert refused["tools"]["a"]["err_available_pct"] is None  # vLLM logged no KV cache
    rows = [refused] + [estimators.build_row({**case(10.0, 100), "id": f"f:{i}"}, {
        "a": {"available_bytes": a * GiB, "tokens": 100, "admits": True},
        "b": {"available_bytes": 10 * GiB, "tokens": 100, "admits": True}})
        for i, a in enumerate((9.0, 10.05, 13.0))]
    s = estimators.summary(rows, tools=("a", "b"))
    assert s["a"]["available"]["n"] == 3
    assert s["a"]["available"]["median_abs_pct"] == pytest.approx(10.0)
    assert s["a"]["available"]["max_pct"] == pytest.approx(30.0)
    assert s["a"]["available"]["min_pct"] == pytest.approx(-10.0)
    assert s["a"]["available"]["within_1pct"] == 1
    assert s["a"]["admitted_but_vllm_refused"] == ["f:r"] and s["b"][
        "admitted_but_vllm_refused"] == []


@functools.cache
def our_rows() -> tuple[dict[str, Any], ...]:
    return tuple(estimators.build_row(c, {"spark-vllm": c["spark-vllm"]})
                 for c in estimators_cases.cases())


def test_every_committed_recording_is_a_row() -> None:
    rows = our_rows()
    by_file: dict[str, int] = {}
    for r in rows:
        by_file[r["fixture"]] = by_file.get(r["fixture"], 0) + 1
    assert by_file == {"tests/fixtures/real-vllm/vllm-0.26.0.json": 11,
                       "tests/fixtures/real-vllm/vllm-0.26.0-qwen35.json": 11,
                       "tests/fixtures/real-vllm/vllm-0.26.0-real-scale.json": 9}
    refused = {r["id"]: r["vllm"]["refusal"] for r in rows if r["vllm"]["outcome"] == "refused"}
    assert refused == {
        "vllm-0.26.0-qwen35:heldout-call3.held_qwen35_util0066_auto":
            "max_num_seqs over the Mamba cache blocks",
        "vllm-0.26.0-real-scale:q122_u095_s1024_l8k":
            "CUDA out of memory (CUDA-graph memory profile)"}


def test_spark_vllms_estimate_in_the_rows_within_one_percent() -> None:
    """Every recording at a utilization of 0.2 or more (the memory tests' goal range): within
    +-1 % of vLLM's available KV and KV tokens. Below it (0.066, where vLLM's profile is the
    vision encoder's, a known gap): under vLLM's, never over."""
    rows = [r for r in our_rows() if r["vllm"]["available_gib"] is not None]
    assert len(rows) == 30
    for r in rows:
        ours = r["tools"]["spark-vllm"]
        if r["utilization"] >= 0.2:
            assert abs(ours["err_available_pct"]) <= 1, (r["id"], ours["err_available_pct"])
            if ours["err_tokens_pct"] is not None:
                assert abs(ours["err_tokens_pct"]) <= 1, (r["id"], ours["err_tokens_pct"])
        else:
            assert ours["err_available_pct"] < 0, (r["id"], ours["err_available_pct"])


def test_spark_vllm_admits_what_vllm_started_and_refuses_what_it_refused() -> None:
    for r in our_rows():
        ours = r["tools"]["spark-vllm"]
        assert not ours["admitted_refused"] and not ours["refused_started"], (
            r["id"], ours["raw"]["reason"])


def test_the_peers_get_no_input_they_cannot_express() -> None:
    """No --max-num-seqs, --max-num-batched-tokens or free memory is passed to kvfit or
    sparkrun (neither has an input for them); auto leaves kvfit the model's own context."""
    cases = estimators_cases.cases()
    given = [estimators_cases.peer_input(c) for c in cases]
    assert all(not {"max_num_seqs", "max_num_batched_tokens", "free_bytes"} & g.keys()
               for g in given)
    auto = next(g for c, g in zip(cases, given, strict=True) if c["max_model_len"] is None)
    assert auto["max_model_len"] is None and auto["context"] == 262144


def test_the_markdown_names_every_row_and_tool() -> None:
    peer = {"available_bytes": 1.0 * GiB, "tokens": 1, "admits": True}
    rows = [estimators.build_row(c, {"spark-vllm": c["spark-vllm"], "kvfit": peer,
                                     "sparkrun": {**peer, "admits": False}})
            for c in estimators_cases.cases()]
    text = estimators_report.markdown({
        "rows": rows, "summary": estimators.summary(rows),
        "versions": {"spark-vllm": "0", "kvfit": "0.3.0", "sparkrun": "0.4.2",
                     "python": "3.12", "vllm (recorded)": "0.26.0"},
        "machine": {"date": "d", "commit": "c", "python": "3.11"},
        "cannot_express": estimators.CANNOT_EXPRESS})
    for r in rows:
        start = f"| {estimators_report._short(r['id'])} |"
        assert sum(line.startswith(start) for line in text.splitlines()) == 3  # three tables
    assert "| kvfit | available KV | 30 |" in text
    assert "admits **(vLLM refused)**" in text and "refuses **(vLLM started)**" in text
