"""The serving benchmark's load (llama-benchy, in process) against vllm-sim on loopback: every
request recorded with its tokens, the API key sent (and a wrong one seen as failures), and a
slower build played (VLLM_SIM_STEP_S) named as a regression against the first run."""

from __future__ import annotations

from pathlib import Path

import pytest
from vsim_harness import start_serve

from lab import model_gen
from spark_vllm import bench_load, bench_report

pytestmark = pytest.mark.slow

KEY = "sk-bench-test-key"
PROFILE = bench_load.Profile("t", prompt_tokens=64, output_tokens=32, concurrency=(1, 4),
                             runs=2)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The lab model's tokenizer (lab/model_gen.py): what the bench reads from a lab's head."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_bytes(model_gen.small_files("Qwen/X", 1000, 1, [])["tokenizer.json"])
    return str(path)


def bench(tmp_path: Path, tokenizer: str, env: dict[str, str], key: str = KEY
          ) -> bench_load.Load:
    tmp_path.mkdir(parents=True, exist_ok=True)
    serve = start_serve(None, "m", ["--api-key", KEY], env, tmp_path)
    try:
        serve.wait_ready(60)
        text = (Path(__file__).parents[2] / "README.md").read_text()
        return bench_load.run(serve.url + "/v1", key, "m", tokenizer, text, PROFILE,
                              progress=lambda s: None)
    finally:
        serve.stop()


def test_every_request_is_recorded_and_a_slower_build_is_named(tmp_path: Path,
                                                               tokenizer: str) -> None:
    fast = bench(tmp_path / "fast", tokenizer, {})
    assert [(r.concurrency, r.batch) for r in fast.requests] == (
        [(1, 0), (1, 1)] + [(4, 0)] * 4 + [(4, 1)] * 4)
    # every answer is the profile's 32 tokens (ignore_eos); llama-benchy counts those whose
    # chunk has text (vllm-sim: one chunk per token, as vLLM) and times each
    assert all(r.error is None and r.tokens == 32 and 28 <= r.counted <= 32
               and len(r.token_times) == r.counted
               and r.start < (r.first_token or 0) <= r.end for r in fast.requests)
    assert "pp64 (c4)" in fast.benchy_table and fast.benchy_version == "0.4.0"
    assert KEY not in fast.log + fast.benchy_table
    slow = bench(tmp_path / "slow", tokenizer, {"VLLM_SIM_STEP_S": "0.08"})
    base = {"figures": {str(k): v for k, v in bench_report.figures(fast.requests).items()}}
    now = {"figures": {str(k): v for k, v in bench_report.figures(slow.requests).items()}}
    found = {(r.concurrency, r.figure) for r in bench_report.regressions(base, now, PROFILE)}
    assert {(1, "outputTokensPerS"), (4, "outputTokensPerS")} <= found, found


def test_a_wrong_api_key_stops_it_with_the_servers_answer(tmp_path: Path,
                                                          tokenizer: str) -> None:
    with pytest.raises(bench_load.LoadError) as stopped:
        bench(tmp_path, tokenizer, {}, key="sk-wrong")
    assert "HTTP 401" in str(stopped.value) and "sk-wrong" not in str(stopped.value)
