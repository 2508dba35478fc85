"""Day 2 on the real engine against a 2-node lab: a container dies or a node reboots, and
`pulumi preview --refresh` names what is gone, one `pulumi up --refresh` replaces exactly that
and what depends on it, in order, and the stack serves again. Each scenario asserts which
containers were recreated (docker's ids), that no container is duplicated or left over, what
`python -m spark_vllm.status` says before and after, and that a chat completion works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from lab import cluster
from tests.integration.engine import (
    REPO,
    STACK,
    Lab,
    containers,
    engine_env,
    node_sh,
    watch_until_repaired,
)
from tests.integration.test_lifecycle import assert_serving, lab_identities, ok

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
HEAD, WORKER, VLLM = ("node-1", "ray-head"), ("node-2", "ray-worker"), ("node-1", "vllm")
LAYOUT = {HEAD, WORKER, VLLM}
LIVENESS = {HEAD: "ray-head-liveness", WORKER: "ray-worker-node-2-liveness",
            VLLM: "vllm-serve-liveness"}
COMMAND = {HEAD: "ray-head", WORKER: "ray-worker-node-2", VLLM: "vllm-serve"}
GATE = "ray-gate"


def status() -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "spark_vllm.status", "--stack", STACK, "--json"],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **engine_env()}, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_role() -> dict[tuple[str, str], str]:
    """(node, role) -> container id; no duplicate, nothing but the stack's three, all running."""
    found = containers(NODES)
    keys = [(c.node, c.role) for c in found]
    assert sorted(keys) == sorted(LAYOUT), found  # no duplicate, no orphan, none missing
    assert all(c.running for c in found), found
    return {(c.node, c.role): c.id for c in found}


def kill(node: str, role: str) -> Callable[[], None]:
    return lambda: node_sh(node, f"docker kill spark-vllm-{STACK}-{role}") and None


def reboot(*nodes: str) -> Callable[[], None]:
    return lambda: cluster.reboot(list(nodes), quiet=True) and None


@pytest.fixture(scope="module")
def served(lab2: Lab) -> Lab:
    ok(lab2.up())
    assert_serving(lab2, lab_identities())
    code, report = status()
    assert code == 0 and report["serving"], report
    return lab2


@pytest.mark.parametrize(("fault", "dead", "recreated"), [
    ("kill vLLM", kill(*VLLM), {VLLM}),
    ("kill the worker container", kill(*WORKER), {WORKER, VLLM}),
    ("reboot the worker node", reboot("node-2"), {WORKER, VLLM}),
    ("reboot the head node", reboot("node-1"), {HEAD, VLLM}),
    ("reboot both nodes", reboot("node-1", "node-2"), LAYOUT),
], ids=["kill-vllm", "kill-worker", "reboot-worker-node", "reboot-head-node", "reboot-both"])
def test_refresh_sees_it_and_one_up_repairs_it(served: Lab, fault: str, dead: Callable[[], None],
                                               recreated: set[tuple[str, str]]) -> None:
    """`dead`: containers that stop for certain. `recreated`: must be exactly these plus what
    depends on them: a worker takes vLLM (its ranks) along, the head takes everything."""
    lab = served
    before = by_role()
    dead()
    t0 = time.monotonic()

    # status names what is down and exits 1
    code, report = status()
    assert code == 1 and not report["serving"], report
    down = {(c["node"], c["role"]) for c in report["containers"] if not c["ok"]}
    assert down & recreated and down <= recreated, report

    # preview --refresh: the refreshed liveness of each dead container reads state "running" =>
    # something else, and the plan replaces exactly the chain below it
    preview = ok(lab.preview(refresh=True))
    gone = {s.name for s in preview.steps if s.op == "refresh" and "state" in s.diffs}
    assert gone & {LIVENESS[k] for k in recreated} and gone <= {LIVENESS[k] for k in recreated}, [
        (s.op, s.name, s.phase, s.diffs) for s in preview.steps]
    expect = {COMMAND[k] for k in (recreated | {VLLM})}
    if recreated != {VLLM}:
        expect |= {GATE}
    if HEAD in recreated:
        expect |= {COMMAND[WORKER]}
    planned = {n for n, op in preview.changed().items() if op != "refresh" and n in
               {*COMMAND.values(), GATE}}
    assert planned == expect, preview.changed()

    # one up --refresh: the same replacements, the rest untouched
    run = ok(lab.up(refresh=True))
    replaced = {s.name for s in run.steps if s.phase == "done" and s.op == "create-replacement"}
    assert replaced & {*COMMAND.values(), GATE} == expect, run.ops("done")
    after = by_role()
    changed = {k for k in LAYOUT if before[k] != after[k]}
    want = recreated | ({WORKER} if HEAD in recreated else set())
    assert changed == want, (fault, changed)
    assert_serving(lab, lab_identities())
    code, report = status()
    assert code == 0 and report["serving"], report
    print(f"{fault}: serving again {time.monotonic() - t0:.1f} s after the fault "
          f"(preview --refresh {preview.seconds:.1f} s, up --refresh {run.seconds:.1f} s); "
          f"recreated {sorted(r for _, r in changed)}")


def test_a_node_switched_off_is_named_and_the_watcher_repairs_once_it_is_back(
        served: Lab) -> None:
    """node-2 off: plain `pulumi preview` needs no SSH (PR previews) and plans nothing;
    `preview --refresh` fails within the SSH bound naming the node and its address, changing
    nothing; `status --watch` gives up after its one allowed failed repair. Node back on: the
    watcher repairs on its own, recreating only the worker and vLLM."""
    lab = served
    before = by_role()
    node2 = cluster.find_node("node-2")
    cluster.power_off(["node-2"])
    try:
        plain = ok(lab.preview())
        assert plain.changed() == {}, plain.changed()
        t0 = time.monotonic()
        refreshed = lab.preview(refresh=True)
        named_after = time.monotonic() - t0
        assert refreshed.error is not None
        assert f"node-2 (root@{node2.mgmt_ip}:22)" in refreshed.error, refreshed.error[-2000:]
        assert named_after < 30, named_after
        print(f"node-2 off: preview --refresh failed naming it after {named_after:.1f} s")
        code, report = status()
        assert code == 1 and "node-2" in report["unreachable"], report
        watch = subprocess.run(
            [sys.executable, "-m", "spark_vllm.status", "--stack", STACK, "--watch",
             "--interval", "1", "--max-repairs", "1"], capture_output=True, text=True,
            cwd=REPO, env={**os.environ, **engine_env()}, timeout=300)
        assert watch.returncode == 3, watch.stdout[-2000:]  # stopped for a person
        assert "node-2: unreachable" in watch.stdout
        assert "stopping: 1 repairs in the last 60 min" in watch.stdout, watch.stdout[-2000:]
    finally:
        cluster.power_on(["node-2"])
    # the failed runs changed nothing on node-1
    assert {k: v for k, v in by_role_loose().items() if k[0] == "node-1"} == {
        k: v for k, v in before.items() if k[0] == "node-1"}

    lines = watch_until_repaired("--interval", "2", "--max-repairs", "2")
    assert any("repaired: serving again" in ln for ln in lines), "".join(lines)[-3000:]
    after = by_role()
    assert {k for k in LAYOUT if before[k] != after[k]} == {WORKER, VLLM}
    assert_serving(lab, lab_identities())


def by_role_loose() -> dict[tuple[str, str], str]:
    """(node, role) -> container id of the nodes that answer, whatever their state."""
    return {(c.node, c.role): c.id for c in containers(["node-1"])}
