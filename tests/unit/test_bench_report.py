"""The serving benchmark's figures, its comparison with the baseline and its outputs, from
requests made up here (every timing known, so every figure can be checked by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_vllm import bench_report
from spark_vllm.bench_load import PROFILES, Profile, Request

PROFILE = Profile("t", prompt_tokens=64, output_tokens=4, concurrency=(1, 2), runs=2)


def req(concurrency: int, batch: int, start: float, first: float, gap: float, tokens: int = 4,
        error: str | None = None) -> Request:
    times = [first + i * gap for i in range(tokens)]
    return Request(concurrency, batch, start, times[-1], first, tokens, times, error)


def test_figures_are_medians_of_batches_and_percentiles_of_requests() -> None:
    requests = [
        # concurrency 1: two batches of one request, 4 tokens each
        req(1, 0, 0.0, 0.1, 0.01), req(1, 1, 1.0, 1.3, 0.01),
        # concurrency 2: batch 0 takes 0.5 s for 8 tokens; batch 1 1.0 s, one request failed
        req(2, 0, 10.0, 10.2, 0.1), req(2, 0, 10.0, 10.2, 0.1),
        req(2, 1, 20.0, 20.7, 0.1),
        Request(2, 1, 20.0, 21.0, None, 0, [], "HTTP 500: boom"),
    ]
    f = bench_report.figures(requests)
    one, two = f[1], f[2]
    # batch walls 0.13 s and 0.33 s for 4 tokens: median of 30.77 and 12.12 tok/s
    assert one["outputTokensPerS"] == pytest.approx((4 / 0.13 + 4 / 0.33) / 2)
    assert one["ttftP50Ms"] == pytest.approx(200.0)  # 100 and 300 ms
    assert one["itlP50Ms"] == pytest.approx(10.0) and one["itlP99Ms"] == pytest.approx(10.0)
    # batch 0: 8 tokens / 0.5 s; batch 1: the 4 good tokens / 1.0 s (its wall is the batch's)
    assert two["outputTokensPerS"] == pytest.approx((16.0 + 4.0) / 2)
    assert two["requestsPerS"] == pytest.approx((4.0 + 1.0) / 2)
    assert two["errors"] == 1 and two["requests"] == 4
    assert two["ttftP99Ms"] == pytest.approx(700.0, rel=0.02)


def run_of(figures: dict[int, dict[str, float]], image: str = "img:a",
           env: dict[str, str] | None = None) -> dict:
    return {"stack": "lab", "when": "20261206T000000Z", "endpoint": "http://h:8000/v1",
            "model": "m", "profile": PROFILE.name, "profileText": PROFILE.describe(),
            "llamaBenchy": "0.4.0", "benchyTable": "| model | test |\n|---|---|",
            "figures": {str(k): v for k, v in figures.items()},
            "deployment": {"image": {"name": image, "id": f"sha256:{image[-1] * 64}"},
                           "config": {"vllmArgs": ["--max-num-seqs", "64"],
                                      "env": env or {"A": "d1"}}}}


FAST = {"outputTokensPerS": 400.0, "requestsPerS": 10.0, "ttftP50Ms": 50.0, "ttftP99Ms": 60.0,
        "itlP50Ms": 2.5, "itlP99Ms": 3.0, "requests": 4.0, "errors": 0.0}


def test_a_planted_regression_is_named_with_both_figures_and_what_changed() -> None:
    base = run_of({1: FAST, 2: FAST})
    slow = {**FAST, "outputTokensPerS": 200.0, "itlP50Ms": 5.0}
    now = run_of({1: FAST, 2: slow}, image="img:b", env={"A": "d2", "B": "d3"})
    found = bench_report.regressions(base, now, PROFILE)
    assert [(r.concurrency, r.figure) for r in found] == [(2, "outputTokensPerS"),
                                                          (2, "itlP50Ms")]
    assert found[0].text() == "concurrency 2: output 400.0 → 200.0 tok/s (-50 %)"
    changed = bench_report.changes(base["deployment"], now["deployment"])
    assert changed[0].startswith("image img:a (sha256:aaaaaaaaaaaa) → img:b (sha256:bbbbbbbbbbbb)")
    assert changed[1:] == ["env A changed", "env B added"]
    # within the margins: nothing
    near = {**FAST, "outputTokensPerS": 370.0, "ttftP50Ms": 60.0}
    assert bench_report.regressions(base, run_of({1: near, 2: near}), PROFILE) == []
    # new errors are a regression of their own
    failing = {**FAST, "errors": 2.0}
    assert [r.figure for r in bench_report.regressions(base, run_of({1: failing}), PROFILE)] \
        == ["errors"]


def test_the_markdown_the_json_and_the_chart(tmp_path: Path) -> None:
    base = run_of({1: FAST, 2: FAST})
    now = run_of({1: FAST, 2: {**FAST, "outputTokensPerS": 200.0}}, image="img:b")
    found = bench_report.regressions(base, now, PROFILE)
    text = bench_report.markdown(now, base, found, bench_report.changes(
        base["deployment"], now["deployment"]))
    assert "| 2 | 200.0 (400.0) |" in text
    assert "- concurrency 2: output 400.0 → 200.0 tok/s (-50 %)" in text
    assert "- image img:a" in text and "llama-benchy's own table" in text
    first = bench_report.markdown(base, None, [], [])
    assert "Baseline: this run" in first and "Regressions" not in first
    png = tmp_path / "run.png"
    bench_report.chart(now, base, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    json.dumps(now)  # every figure is plain JSON


def test_the_profiles_are_fixed_and_named() -> None:
    assert set(PROFILES) == {"spark", "quick"}
    spark = PROFILES["spark"]
    assert (spark.prompt_tokens, spark.output_tokens, spark.concurrency, spark.runs,
            spark.seed) == (2048, 128, (1, 2, 4, 8), 3, 0)


def test_the_deployment_snapshot_keeps_no_secret_and_no_env_value() -> None:
    """What a run keeps of the stack: the image and every non-secret config key; the three
    secrets (and any value the CLI marks secret) never, env values only as digests."""
    from dataclasses import dataclass

    from spark_vllm import bench

    @dataclass
    class Value:
        value: str
        secret: bool = False

    class Stack:
        def get_all_config(self) -> dict[str, Value]:
            return {"spark-vllm:image": Value("img:a"),
                    "spark-vllm:vllmArgs": Value('["--max-num-seqs", "64"]'),
                    "spark-vllm:env": Value('{"NCCL_DEBUG": "WARN", "MY_TOKEN": "hunter2"}'),
                    "spark-vllm:apiKey": Value("sk-live-1", secret=True),
                    "spark-vllm:sshPrivateKey": Value("-----BEGIN", secret=True),
                    "spark-vllm:somethingSecret": Value("s3", secret=True),
                    "aws:region": Value("us-east-1")}

    snap = bench.deployment(Stack(), {"image": {"name": "img:a", "id": "sha256:1"}})
    assert snap["image"] == {"name": "img:a", "id": "sha256:1"}
    assert set(snap["config"]) == {"image", "vllmArgs", "env"}
    assert snap["config"]["vllmArgs"] == ["--max-num-seqs", "64"]
    text = json.dumps(snap)
    for secret in ("sk-live-1", "-----BEGIN", "s3", "hunter2", "WARN"):
        assert secret not in text
    assert set(snap["config"]["env"]) == {"NCCL_DEBUG", "MY_TOKEN"}
