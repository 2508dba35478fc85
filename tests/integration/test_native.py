"""Backend native (vLLM's own multi-node, no Ray) on the real engine against a 2-node lab, in
order: fresh up, env change in order, vLLM-only change, a dead headless rank repaired, a node
that cannot reach rank 0 named in seconds, the switch to Ray and back (each in order), destroy.
Each scenario asserts on the engine's steps and on what docker says on the nodes."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from pulumi import automation as auto

from lab import cluster
from tests.integration.conftest import API_KEY
from tests.integration.engine import (
    REPO,
    STACK,
    Lab,
    Run,
    captures_match,
    chat,
    containers,
    docker_events,
    engine_env,
    failed_lines,
    node_sh,
)

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
CHAIN = ["vllm-leader", "vllm-rank-node-2"]  # deepest first
LAYOUT = [("node-1", "vllm-leader"), ("node-2", "vllm-rank")]
RAY_LAYOUT = [("node-1", "ray-head"), ("node-1", "vllm"), ("node-2", "ray-worker")]


def ok(run: Run) -> Run:
    assert run.error is None, run.failure()
    return run


def identities() -> dict[str, str]:
    return {n.name: n.fabric_ip for n in cluster.info().nodes}


def layout() -> dict[tuple[str, str], str]:
    """(node, role) -> container id: the stack's two, running, nothing else (no Ray)."""
    found = containers(NODES)
    assert sorted((c.node, c.role) for c in found) == LAYOUT, found
    assert all(c.running for c in found), found
    return {(c.node, c.role): c.id for c in found}


def assert_serving(lab: Lab) -> None:
    out = lab.outputs()
    assert out["identityIps"] == identities()
    assert out["rayNodes"].startswith("none: backend native")
    reply = chat(out["endpoint"], out["servedModelName"], API_KEY)
    for ip in identities().values():  # vllm-sim names every rank's node in its answer
        assert ip in reply, reply
    layout()


def summary_of(lab: Lab) -> str:
    """`spark-vllm summary` of a real `pulumi preview --json`, as a PR comment shows it."""
    env = {**os.environ, **engine_env()}
    preview = subprocess.run(["pulumi", "preview", "--json", "--stack", STACK], cwd=REPO,
                             capture_output=True, text=True, env=env, timeout=300)
    assert preview.returncode == 0, preview.stderr[-2000:]
    summary = subprocess.run([sys.executable, "-m", "spark_vllm.summary", "--format", "text"],
                             input=preview.stdout, capture_output=True, text=True, cwd=REPO,
                             timeout=60)
    assert summary.returncode == 0, summary.stderr
    return summary.stdout


def assert_in_order(run: Run, chain: list[str], since: float, until: float,
                    before: dict[tuple[str, str], str]) -> None:
    deletes = [n for op, n in run.ops("done") if op == "delete-replaced" and n in chain]
    creates = [n for op, n in run.ops("done") if op == "create-replacement" and n in chain]
    assert deletes == chain and creates == list(reversed(chain)), run.ops("done")
    # on the nodes: both old ranks are gone before the first new one starts (the fabric
    # check's short-lived containers run before, with every old rank still up: no rank)
    events = docker_events(NODES, since, until)
    gone = [e.t_ns for e in events if e.id in set(before.values()) and e.action == "destroy"]
    started = [e.t_ns for e in events if e.action == "start" and e.role != "fabric-check"]
    assert len(gone) == len(before) and started, events
    assert max(gone) < min(started), events


def test_1_fresh_up_serves_without_ray(lab2n: Lab) -> None:
    run = ok(lab2n.up())
    created = {name for op, name in run.ops() if op == "create"}
    assert {"vllm-rank-node-2", "vllm-leader", "memory-check"} <= created
    assert not [n for n in created if n.startswith("ray-")], created
    # headless rank first, rank 0 after it
    t = {s.name: s.t for s in run.steps if s.phase == "done" and s.op == "create"}
    assert t["vllm-rank-node-2"] < t["vllm-leader"]
    assert any("every node joined rank 0 at" in line for line in run.output), run.output[-40:]
    assert_serving(lab2n)
    ids = lab2n.outputs()["containerIds"]
    assert set(ids) == {"node-1/vllm-leader", "node-2/vllm-rank"}
    print(f"native fresh up: {run.seconds:.1f} s")


def test_1c_the_native_pr_summary_captures_are_todays_plans(lab2n: Lab) -> None:
    captures_match("tests/fixtures/previews/native")


def test_1d_an_api_key_rotation_restarts_nothing_and_is_in_force_at_once(lab2n: Lab) -> None:
    """Rank 0 serves the API and a group forms once, so a restart of rank 0 restarts every
    rank: the key is no part of any member. A new apiKey previews one in-place update (the
    key's file on node-1) and no replacement; `up` rewrites the file and no container is
    replaced or restarted (same ids, same start times); the old key gets 401 at once and the
    new one is answered. Then back to the lab's key, the same way."""
    ok(lab2n.up())  # serving first (a no-op after test_1)
    before = {(c.node, c.role): (c.id, c.started) for c in containers(NODES)}
    assert sorted(before) == LAYOUT, before
    key_file = f"~/.spark-vllm/{STACK}/api-key/key"
    rotated = "sk-native-rotated-" + secrets.token_hex(8)
    for old, new in ((API_KEY, rotated), (rotated, API_KEY)):
        lab2n.stack.set_config("spark-vllm:apiKey", auto.ConfigValue(new, secret=True))
        preview = ok(lab2n.preview())
        assert preview.changed() == {"vllm-api-key": "update"}, preview.changed()
        summary = summary_of(lab2n)
        assert "Nothing restarts: the apiKey is rotated in place (its file on node-1" in summary, \
            summary
        assert new not in summary and old not in summary
        run = ok(lab2n.up())
        assert run.changed() == {"vllm-api-key": "update"}, run.changed()
        assert not [line for line in run.output if new in line or old in line]  # never printed
        after = {(c.node, c.role): (c.id, c.started) for c in containers(NODES)}
        assert after == before, (before, after)  # not replaced, not restarted
        # the file on the node: the new key, 0600, the SSH user's; nothing else beside it
        assert node_sh("node-1", f"stat -c '%a %U' {key_file}").split() == ["600", "root"]
        assert node_sh("node-1", f"sha256sum < {key_file}").split()[0] == \
            hashlib.sha256(new.encode()).hexdigest()
        assert node_sh("node-1", f"ls -A ~/.spark-vllm/{STACK}/api-key").split() == ["key"]
        out = lab2n.outputs()
        for path in ("chat", "/invocations"):
            with pytest.raises(urllib.error.HTTPError) as err:
                if path == "chat":
                    chat(out["endpoint"], out["servedModelName"], old)
                else:
                    invocations(out["endpoint"], old)
            assert err.value.code == 401, path
        assert chat(out["endpoint"], out["servedModelName"], new)
    assert_serving(lab2n)


def invocations(endpoint: str, api_key: str) -> None:
    """POST /invocations (SageMaker's route, outside vLLM's own guarded prefixes)."""
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    req = urllib.request.Request(endpoint.removesuffix("/v1") + "/invocations", data=body,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def test_2_an_env_change_replaces_the_ranks_in_order(lab2n: Lab) -> None:
    before = layout()
    lab2n.set("env", {**lab2n.get("env"), "SPARK_VLLM_TEST": "native-env"})
    summary = summary_of(lab2n)
    assert "What restarts (backend native, no Ray): vLLM's headless ranks on 1 node (node-2)" \
        in summary, summary
    since = time.time()
    run = ok(lab2n.up())
    assert_in_order(run, CHAIN, since, time.time(), before)
    assert not {n for op, n in run.ops("done") if op != "same"} & {"model-stage",
                                                                  "model-copy-node-2"}
    assert_serving(lab2n)
    print(f"native env change: {run.seconds:.1f} s")


def test_3_a_vllm_only_change_restarts_every_rank_and_nothing_else(lab2n: Lab) -> None:
    """Every rank runs vLLM's engine arguments: a vLLM change restarts them all (in order);
    the preflights, the staging and the copy do not run again."""
    before = layout()
    lab2n.set("vllmArgs", ["--max-num-seqs", "8"])
    since = time.time()
    run = ok(lab2n.up())
    assert_in_order(run, CHAIN, since, time.time(), before)
    changed = {n for op, n in run.ops("done") if op not in ("same", "refresh")}
    assert not {n for n in changed if n.endswith("-preflight")}, changed
    assert not changed & {"model-stage", "model-copy-node-2"}, changed
    assert_serving(lab2n)


def test_4_a_dead_headless_rank_is_seen_and_one_up_repairs_the_group(lab2n: Lab) -> None:
    before = layout()
    node_sh("node-2", f"docker kill spark-vllm-{STACK}-vllm-rank")
    env = {**os.environ, **engine_env()}
    proc = subprocess.run([sys.executable, "-m", "spark_vllm.status", "--stack", STACK,
                           "--json"], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=180)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and not report["serving"], report
    assert any("node-2 vllm-rank" in p for p in report["problems"]), report
    assert report["ray"] == {}  # no Ray to ask
    run = ok(lab2n.up(refresh=True))
    replaced = {n for op, n in run.ops("done") if op == "create-replacement"}
    assert {"vllm-rank-node-2", "vllm-leader"} <= replaced, run.ops("done")  # rank 0 with it
    after = layout()
    assert all(before[k] != after[k] for k in before)
    assert_serving(lab2n)


def test_4b_a_headless_rank_lost_while_rank_0_loads_is_named_within_seconds(lab2n: Lab) -> None:
    """joinTimeout 700 s, above torch's 600 s: every rank gets it as its rendezvous timeout
    (--distributed-timeout-seconds, which vllm-sim's rendezvous takes, as vLLM does). Then the
    headless rank is killed while rank 0 loads (40 s): rank 0's start names its node within
    seconds, where vLLM's rank 0 would wait in NCCL with no bound."""
    head_ip, worker_ip = (n["fabricIp"] for n in lab2n.get("nodes"))
    env = lab2n.get("env")
    lab2n.set("joinTimeout", 700)
    lab2n.set("env", {**env, "VLLM_SIM_LOAD_SECONDS": "40"})
    killed: dict[str, object] = {}
    leader, rank = f"spark-vllm-{STACK}-vllm-leader", f"spark-vllm-{STACK}-vllm-rank"

    def cid(node: str, name: str) -> str:
        return node_sh(node, f"docker inspect --format '{{{{.Id}}}}' {name} 2>/dev/null || true",
                       check=False).strip()

    # the containers this up replaces: their logs already hold the line the killer waits for
    old = {leader: cid("node-1", leader), rank: cid("node-2", rank)}

    def kill_the_rank_once_rank_0_loads() -> None:
        end = time.monotonic() + 240
        while time.monotonic() < end and "t" not in killed:
            new = cid("node-1", leader)
            logs = node_sh("node-1", f"docker logs {new} 2>&1 || true", check=False) if (
                new and new != old[leader]) else ""
            if "Loading weights (simulated) on rank 0" in logs:
                target = cid("node-2", rank)
                assert target and target != old[rank], (target, old)
                killed["args"] = node_sh("node-2", "docker inspect --format '{{join .Args \" \"}}' "
                                         f"{target}")
                node_sh("node-2", f"docker kill {target}")
                killed["t"] = time.monotonic()
            time.sleep(0.5)

    killer = threading.Thread(target=kill_the_rank_once_rank_0_loads, daemon=True)
    try:
        killer.start()
        run = lab2n.up()
        killer.join(10)
        assert run.error is not None and "t" in killed, (killed, run.output[-30:])
        assert "--distributed-timeout-seconds 700" in str(killed["args"]), killed["args"]
        failed = max(s.t for s in run.steps if s.name == "vllm-leader" and s.phase == "failed")
        took = failed - float(killed["t"])  # type: ignore[arg-type]
        # named while rank 0 still loads (40 s), where nothing else would name it before the
        # start's bound (700 s and more); the seconds include the failed command's cleanup and
        # the engine's report, which a busy CI machine stretches
        assert took < 20, f"the lost rank was named {took:.1f} s after it died"
        assert (f"the ranks on node-2 ({worker_ip}) lost their connection to rank 0 at "
                f"{head_ip}:29501 while it was loading; vLLM was loading the weights (its last "
                "step: ") in run.error, run.error[-2000:]
        assert containers(["node-1"]) == []  # rank 0 removed: nothing half-done
        print(f"a headless rank lost during rank 0's load named after {took:.1f} s")
    finally:
        lab2n.set("joinTimeout", 60)
        lab2n.set("env", env)
    ok(lab2n.up())
    assert_serving(lab2n)


def test_5_a_node_that_cannot_reach_rank_0_is_named_in_seconds(lab2n: Lab) -> None:
    lab2n.set("env", {**lab2n.get("env"), "SPARK_VLLM_TEST": "native-fabric-blocked"})
    head_ip, worker_ip = (n["fabricIp"] for n in lab2n.get("nodes"))
    cluster.block_fabric("node-1", "node-2")
    try:
        run = lab2n.up()
        assert run.error is not None
        rank = [s for s in run.steps if s.name == "vllm-rank-node-2"]
        started = min(s.t for s in rank if s.phase == "pre" and s.op.startswith("create"))
        failed = max(s.t for s in rank if s.phase == "failed")
        assert failed - started < 15, f"the rank took {failed - started:.1f} s to fail"
        said = failed_lines(run, "node-2", "vllm-rank")  # not the script's own text
        assert said and (f"cannot reach rank 0 (node-1) at {head_ip}:29501 from {worker_ip}"
                         in said[0]), run.failure()
        assert "no answer within" in said[0], said  # the connect's own outcome, named
        assert "Traceback" not in run.error
        assert not any(s.name == "vllm-leader" for s in run.steps
                       if s.phase == "pre" and s.op.startswith("create"))
        assert [c.role for c in containers(["node-2"])] == []  # nothing half-done there
        print(f"unreachable rank 0 named after {failed - started:.1f} s")
    finally:
        cluster.unblock_fabric("node-1", "node-2")
    ok(lab2n.up())
    assert_serving(lab2n)


def test_6_switching_to_ray_stops_the_native_ranks_before_ray_starts(lab2n: Lab) -> None:
    before = layout()
    lab2n.set("backend", "ray")
    summary = summary_of(lab2n)
    assert "The backend changes from native to ray" in summary, summary
    since = time.time()
    run = ok(lab2n.up())
    until = time.time()
    found = containers(NODES)
    assert sorted((c.node, c.role) for c in found) == RAY_LAYOUT, found
    events = docker_events(NODES, since, until)
    gone = [e.t_ns for e in events if e.id in set(before.values()) and e.action == "destroy"]
    started = [e.t_ns for e in events if e.action == "start" and e.role.startswith("ray-")]
    assert len(gone) == 2 and started and max(gone) < min(started), events
    out = lab2n.outputs()
    reply = chat(out["endpoint"], out["servedModelName"], API_KEY)
    assert all(ip in reply for ip in identities().values()), reply
    # the native resources' deletes ran last and found their containers gone
    assert {"vllm-leader", "vllm-rank-node-2"} <= {n for op, n in run.ops("done")
                                                   if op == "delete"}
    # the native key command's delete ran after Ray's vLLM started, and kept the key's file
    # that vLLM mounts (api_key_commands.api_key_remove_script): the same file, the same key
    assert ("delete", "vllm-api-key") in run.ops("done")
    node_sh("node-1", f"test -s ~/.spark-vllm/{STACK}/api-key/key")


def test_7_switching_back_to_native_stops_ray_on_each_node_first(lab2n: Lab) -> None:
    before = {(c.node, c.role): c.id for c in containers(NODES)}
    lab2n.set("backend", "native")
    since = time.time()
    ok(lab2n.up())
    until = time.time()
    events = docker_events(NODES, since, until)
    for node, role in (("node-2", "vllm-rank"), ("node-1", "vllm-leader")):
        mine = [e.t_ns for e in events if e.node == node and e.role == role
                and e.action == "start"]
        old = [e.t_ns for e in events if e.node == node and e.action == "destroy"
               and e.id in {cid for (n, _), cid in before.items() if n == node}]
        assert mine and old and max(old) < min(mine), (node, events)
    assert_serving(lab2n)
    assert not [n for n in lab2n.command_outputs() if n.startswith("ray-")]


def test_8_destroy_leaves_nothing(lab2n: Lab) -> None:
    ok(lab2n.destroy())
    assert containers(NODES) == []
    assert lab2n.state_resources() == []
    for node in NODES:
        assert node_sh(node, f"ls ~/.spark-vllm/{STACK} 2>/dev/null || true").strip() == ""
