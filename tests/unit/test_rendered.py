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
}


def rendered(n: int, top: dict[str, Any]) -> dict[str, Any]:
    graph = run(spec_from(lab_nodes(n), stack="snap", **top))
    return {name: {"type": r.type, "inputs": unwrap(r.inputs), "dependencies": sorted(
        d.rsplit("::", 1)[-1] for d in r.dependencies)} for name, r in sorted(graph.items())}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_commands_are_the_committed_ones(case: str) -> None:
    n, top = CASES[case]
    got = rendered(n, top)
    path = FIXTURES / f"{case}.json"
    if os.environ.get("SPARK_VLLM_UPDATE_RENDERED") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert sorted(got) == sorted(want), "resources added or removed"
    for name in want:
        assert got[name] == want[name], f"{name} renders differently: its resource is replaced"
