"""The liveness read's line as `spark-vllm status` names it, and a node's free GPU memory as
the watcher reads it before a repair (tables; pure functions)."""

from __future__ import annotations

import pytest

from spark_vllm.components import node_memory
from spark_vllm.status import classify


@pytest.mark.parametrize(("line", "seen", "state"), [
    ("running", ["serving: first token in 0.01 s"], "serving"),
    ("running", ["busy: the canary waited 30 s; 84384 tokens generated in 31 s"], "busy"),
    ("running", ["unknown: no token for the canary in 30 s and no counter"], "serving"),
    ("wedged: no token for the canary in 30 s, none generated in 60 s", [], "wedged"),
    ("running, not serving: /health answered 503", [], "not serving"),
    ("exited (0)", [], "dead"),  # a rank that died makes vLLM exit 0: dead, not a clean stop
    ("exited (137)", [], "dead"),
    ("gone", [], "dead"),
])
def test_each_line_reads_as_its_state(line: str, seen: list[str], state: str) -> None:
    assert classify(line, seen)[0] == state


def test_dead_says_what_the_container_is() -> None:
    assert classify("exited (0)", []) == ("dead", "its container is exited (0)")


@pytest.mark.parametrize(("text", "want"), [
    ("none\n", None),  # no nvidia-smi: the lab, not checked
    ("nvidia-smi 143771, 142000\n", [node_memory.GpuMemory("nvidia-smi", 143771, 142000)]),
    ("nvidia-smi 81559, 100\nnvidia-smi 81559, 81000\n",
     [node_memory.GpuMemory("nvidia-smi", 81559, 100),
      node_memory.GpuMemory("nvidia-smi", 81559, 81000)]),
    ("meminfo 124620, 106000\n", [node_memory.GpuMemory("meminfo", 124620, 106000)]),
])
def test_the_memory_script_output_parses(text: str, want: list | None) -> None:
    assert node_memory.parse(text) == want


@pytest.mark.parametrize(("args", "util"), [
    ((), 0.9), (("--gpu-memory-utilization", "0.85"), 0.85),
    (("--gpu-memory-utilization=0.5",), 0.5), (("--gpu_memory_utilization", "0.7"), 0.7),
    (("--max-model-len", "4096"), 0.9),
])
def test_the_utilization_comes_from_vllm_args(args: tuple[str, ...], util: float) -> None:
    assert node_memory.utilization(args) == util


def test_a_node_short_of_memory_is_named_with_its_numbers() -> None:
    gpus = [node_memory.GpuMemory("meminfo", 124620, 20480)]
    assert node_memory.shortfall("spark-b", gpus, 0.85) == (
        "spark-b: GPU 0: 20.0 GiB free of 121.7 GiB (meminfo); vLLM needs 0.85 × 121.7 = "
        "103.4 GiB free to start")
    assert node_memory.shortfall("spark-b", [node_memory.GpuMemory("meminfo", 124620, 110000)],
                                 0.85) is None
