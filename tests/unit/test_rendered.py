"""What the program sends to the nodes, resource by resource, against a committed rendering.

Every remote command's create/delete/stdin and every trigger is what the engine diffs: a byte
that changes here replaces that resource (and its dependents) on every operator's next `up`.
So a change here must be on purpose: regenerate with
`SPARK_VLLM_UPDATE_RENDERED=1 python -m pytest tests/unit/test_rendered.py` and say in the
commit why the containers restart.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit.harness import lab_nodes, run, spec_from, unwrap

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rendered"

CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "one-node": (1, {}),
    "duo": (2, {"env": {"NCCL_DEBUG": "WARN"}, "vllmArgs": ["--enforce-eager"]}),
    "four-tp2-pp2": (4, {"tensorParallelSize": 2, "pipelineParallelSize": 2}),
    "duo-unstaged-nocache": (2, {"modelStaging": "none", "compileCache": "none"}),
    "duo-tcp-digest-len": (2, {"copyTransport": "tcp", "copyStreams": 4, "maxModelLen": 8192,
                               "imageDigest": "sha256:" + "ab" * 32}),
    "duo-native": (2, {"backend": "native", "env": {"NCCL_DEBUG": "WARN"}}),
    "duo-image-copy": (2, {"imageStaging": "copy", "imagePull": "always",
                           "copyTransport": "tcp"}),
    "four-native-pp2": (4, {"backend": "native", "tensorParallelSize": 2,
                            "pipelineParallelSize": 2, "masterPort": 29600}),
    "duo-two-models": (2, {"backend": "native", "gateway": {"image": "litellm:1"}, "models": [
        {"name": "big", "model": "org/big", "tensorParallelSize": 2,
         "vllmArgs": ["--gpu-memory-utilization", "0.5"]},
        {"name": "small", "model": "org/small", "tensorParallelSize": 1, "nodes": ["node-2"],
         "env": {"NCCL_DEBUG": "INFO"}, "vllmArgs": ["--gpu-memory-utilization", "0.3"]}]}),
}


DYNAMIC = "pulumi-python:dynamic:Resource"


def rendered(n: int, top: dict[str, Any]) -> dict[str, Any]:
    """Every resource's type, inputs and dependencies; a dynamic resource's inputs without its
    pickled provider (the provider's code is not diffed: its inputs are)."""
    graph = run(spec_from(lab_nodes(n), stack="snap", **top))
    out = {}
    for name, r in sorted(graph.items()):
        if r.type == "pulumi:pulumi:Stack":
            continue
        inputs = {k: v for k, v in unwrap(r.inputs).items() if k != "__provider"}
        out[name] = {"type": r.type, "inputs": inputs,
                     "dependencies": sorted(d.rsplit("::", 1)[-1] for d in r.dependencies)}
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_commands_are_the_committed_ones(case: str) -> None:
    n, top = CASES[case]
    got = rendered(n, top)
    path = FIXTURES / f"{case}.json"
    if os.environ.get("SPARK_VLLM_UPDATE_RENDERED") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())

    def fixed(graph: dict[str, Any]) -> list[str]:
        # a dynamic resource may register after the mocked program returns: only the others
        # are counted (each dynamic one present is compared below)
        return sorted(k for k, v in graph.items() if v["type"] != DYNAMIC)

    assert fixed(got) == fixed(want), "resources added or removed"
    for name in got:
        assert got[name] == want[name], f"{name} renders differently: its resource is replaced"
