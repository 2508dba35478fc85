"""Same program, same result on a 4-node lab with TP 2 × PP 2: fresh up and an env change."""

from __future__ import annotations

import time

import pytest

from tests.integration.engine import REMEASURED, Lab, containers, docker_events, planned
from tests.integration.test_lifecycle import assert_serving, lab_identities, ok

pytestmark = pytest.mark.integration

NODES = [f"node-{i}" for i in range(1, 5)]
CHAIN = ["vllm-serve", "ray-gate", "ray-head"]
WORKERS = {f"ray-worker-node-{i}" for i in range(2, 5)}


def test_8_four_nodes_up_and_env_change(lab4: Lab) -> None:
    run = ok(lab4.up())
    assert_serving(lab4, lab_identities())
    assert len([c for c in containers(NODES) if c.role == "ray-worker"]) == 3
    print(f"4-node fresh up: {run.seconds:.1f} s")
    lab4.set("env", {"NCCL_DEBUG": "INFO"})
    before = containers(NODES)
    since = time.time()
    run = ok(lab4.up())
    until = time.time()
    assert planned(run) == {*CHAIN, *WORKERS, REMEASURED}, run.changed()
    done = [name for op, name in run.ops("done") if op == "delete-replaced"]
    assert done[:2] == ["vllm-serve", "ray-gate"] and done[-1] == "ray-head"
    assert set(done[2:-1]) == WORKERS
    creates = [name for op, name in run.ops("done") if op == "create-replacement"]
    assert creates[0] == "ray-head" and creates[-2:] == ["ray-gate", "vllm-serve"]
    events = docker_events(NODES, since, until)
    old = {c.id for c in before if c.role in ("ray-head", "ray-worker")}
    gone = [e.t_ns for e in events if e.id in old and e.action == "destroy"]
    started = [e.t_ns for e in events if e.action == "start" and e.role.startswith("ray-")]
    assert len(gone) == 4 and max(gone) < min(started)
    assert_serving(lab4, lab_identities())
    print(f"4-node env change: {run.seconds:.1f} s")
