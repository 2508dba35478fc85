"""The lifecycle on the real engine against a 2-node lab, in order: fresh up, no-op, env change,
identity change, vLLM-only change, destroy, fail-fast (preflight, a worker that cannot join). Each scenario asserts
on the engine's step events and on what docker and Ray on the nodes say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from lab import cluster, config
from tests.integration.conftest import API_KEY
from tests.integration.engine import (
    REMEASURED,
    REPO,
    STACK,
    Container,
    Lab,
    Run,
    captures_match,
    chat,
    containers,
    docker_events,
    engine_env,
    failed_lines,
    node_sh,
    nodes_snapshot,
    planned,
    ray_nodes,
)

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]


def assert_unchanged(before: list[Container]) -> None:
    """The same containers, ids and start times, all running; else what the nodes hold (each
    container's state, exit code and last log lines)."""
    now = containers(NODES)
    assert now == before, f"{now}\n!= {before}\n{nodes_snapshot()}"
CHAIN = ["vllm-serve", "ray-gate", "ray-worker-node-2", "ray-head"]  # deepest first
RAY_ROLES = ("ray-head", "ray-worker")


def ok(run: Run) -> Run:
    assert run.error is None, run.failure()
    return run


def assert_serving(lab: Lab, identities: dict[str, str]) -> None:
    out = lab.outputs()
    assert out["identityIps"] == identities
    seen = ray_nodes("node-1")
    assert seen == sorted(({"ip": ip, "gpus": 1.0} for ip in identities.values()),
                          key=lambda n: n["ip"])
    reply = chat(out["endpoint"], out["servedModelName"], API_KEY)
    # vllm-sim names the node of every rank: one rank per node, on its identity
    for ip in identities.values():
        assert ip in reply, reply


def lab_identities() -> dict[str, str]:
    return {n.name: n.fabric_ip for n in cluster.info().nodes}


def assert_ordered_replacement(run: Run, before: list, since: float, until: float,
                               chain: list[str]) -> None:
    deletes = [name for op, name in run.ops("done") if op == "delete-replaced"]
    creates = [name for op, name in run.ops("done") if op == "create-replacement"]
    assert [n for n in deletes if n in chain] == chain, run.ops("done")
    assert [n for n in creates if n in chain] == list(reversed(chain)), run.ops("done")
    # the chain's old containers are all gone before its first new one is created (a preflight
    # replaced alongside may run any time: it starts nothing)
    last_delete = max(s.t for s in run.steps
                      if s.phase == "done" and s.op == "delete-replaced" and s.name in chain)
    first_create = min(s.t for s in run.steps
                       if s.phase == "pre" and s.op == "create-replacement" and s.name in chain)
    assert last_delete <= first_create
    # On the nodes: every old Ray container is destroyed before any new one starts, on every
    # node (docker's own event times: one kernel clock for all lab nodes).
    events = docker_events(NODES, since, until)
    old_ids = {c.id for c in before if c.role in RAY_ROLES}
    gone = [e.t_ns for e in events if e.id in old_ids and e.action == "destroy"]
    started = [e.t_ns for e in events if e.action == "start" and e.role in RAY_ROLES]
    assert len(gone) == len(old_ids) and started, events
    assert max(gone) < min(started), events


def test_0_a_bad_config_is_one_error_naming_the_field(lab2: Lab) -> None:
    """Before anything exists: the engine shows the program's one error, with the path of the
    bad value, and no second "unhandled error" or traceback of its own."""
    lab2.set("vllmArgs[1]", 4096, path=True)  # --path makes it a number: vLLM args are strings
    try:
        run = lab2.preview()
        assert run.error is not None
        assert "vllmArgs[1]: Input should be a valid string" in run.error
        assert "unhandled" not in run.error and "Traceback" not in run.error, run.error[-2000:]
    finally:
        lab2.set("vllmArgs", [])


def test_1_fresh_up(lab2: Lab) -> None:
    run = ok(lab2.up())
    created = {name for op, name in run.ops() if op == "create"}
    assert {"node-1-preflight", "node-2-preflight", "ray-head", "ray-worker-node-2",
            "ray-gate", "vllm-serve"} <= created
    assert_serving(lab2, lab_identities())
    now = containers(NODES)
    assert sorted((c.node, c.role) for c in now if c.running) == [
        ("node-1", "ray-head"), ("node-1", "vllm"), ("node-2", "ray-worker")]
    out = lab2.outputs()
    assert {p["vllm"] for p in out["preflight"].values()} == {config.SIM_VLLM_VERSION}
    ids = out["containerIds"]
    assert {c.id for c in now} == set(ids.values())
    # the real plugins are what ran: nothing the engine loads comes from $PATH (stand-ins did)
    assert not [line for line in run.output if "from $PATH" in line], run.output
    print(f"fresh up: {run.seconds:.1f} s")


def http_status(url: str, key: str | None = None, body: dict | None = None) -> int:
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                    timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:  # nothing listens (yet)
        return 0


def test_1b_the_api_key_guards_every_inference_route(lab2: Lab) -> None:
    """vLLM's --api-key leaves /invocations open (it serves inference with no key); with
    apiKey set the deployment answers 401 there too, and on /v1, without or with a wrong key."""
    out = lab2.outputs()
    base = out["endpoint"].removesuffix("/v1")
    chat = {"model": out["servedModelName"], "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (("/invocations", chat), ("/v1/chat/completions", chat),
                       ("/v1/models", None)):
        assert http_status(base + path, None, body) == 401, path
        assert http_status(base + path, "sk-wrong", body) == 401, path
        assert http_status(base + path, API_KEY, body) == 200, path
    assert http_status(base + "/health") == 200


def test_1c_the_pr_summary_captures_are_todays_plans(lab2: Lab) -> None:
    captures_match()


def test_2_noop_up_runs_nothing(lab2: Lab) -> None:
    before = containers(NODES)
    since = time.time()
    run = ok(lab2.up())
    assert run.changed() == {}
    assert_unchanged(before)  # same ids, same start times
    assert docker_events(NODES, since, time.time()) == []
    print(f"no-op up: {run.seconds:.1f} s")


def test_2b_refresh_keeps_a_healthy_stack(lab2: Lab) -> None:
    """`pulumi refresh`, then `pulumi up --refresh`, on a healthy stack. pulumi-command 1.2.1 has
    no Read (pulumi/pulumi-command#432: its state comes back as stored) and #1377 reports refresh
    wiping `stdout`, which this program reads (container ids in triggers, the preflight JSON).
    What a user needs: nothing replaced or restarted, the state unchanged, outputs that decode."""
    before = containers(NODES)
    state_before = lab2.command_outputs()
    outputs_before = lab2.outputs()
    since = time.time()

    refresh = ok(lab2.refresh())
    refreshed = [s for s in refresh.steps if s.phase == "done"]
    assert {s.op for s in refreshed} <= {"refresh", "same"}, refresh.ops("done")
    assert {s.name for s in refreshed} >= set(CHAIN)
    assert [(s.name, s.diffs) for s in refreshed if s.diffs] == []
    assert lab2.command_outputs() == state_before  # stdout and stderr kept, byte for byte

    up = ok(lab2.up(refresh=True))
    assert {s.op for s in up.steps} <= {"refresh", "same"}, up.ops("done")
    assert [(s.name, s.diffs) for s in up.steps if s.diffs] == []

    assert_unchanged(before)  # same ids, same start times
    # the reads ran: vLLM's liveness asked the server (a `docker exec` of the probe); nothing
    # else happened to any container
    events = docker_events(NODES, since, time.time())
    assert [e for e in events if not e.action.startswith("exec_")] == []
    assert {(e.node, e.role) for e in events} == {("node-1", "vllm")}
    out = lab2.outputs()
    assert out == outputs_before
    assert {c.id for c in before} == set(out["containerIds"].values())
    assert all(p["image_id"].startswith("sha256:") for p in out["preflight"].values())
    assert_serving(lab2, lab_identities())
    print(f"refresh: {refresh.seconds:.1f} s, up --refresh: {up.seconds:.1f} s")


def test_3_env_change_replaces_the_chain_in_order(lab2: Lab) -> None:
    lab2.set("env", {"NCCL_DEBUG": "INFO"})
    preview = ok(lab2.preview())
    assert planned(preview) == {*CHAIN, REMEASURED}, preview.changed()
    before = containers(NODES)
    since = time.time()
    run = ok(lab2.up())
    until = time.time()
    assert planned(run) == {*CHAIN, REMEASURED}, run.changed()
    assert run.changed()[REMEASURED] == "update"  # measured again; no new id
    assert_ordered_replacement(run, before, since, until, CHAIN)
    after = containers(NODES)
    assert not {c.id for c in before} & {c.id for c in after}
    assert_serving(lab2, lab_identities())
    print("env change step order:", [f"{op}:{name}" for op, name in run.ops("done")
                                     if op != "same"])
    print(f"env change: {run.seconds:.1f} s")


def test_3b_a_refused_fabric_stops_the_up_before_any_container_changes(lab2: Lab) -> None:
    """The fabric check gates every container (components/fabric_check.py): the lab's image has
    no torch, so with `onUnavailable: refuse` an env change (which would replace the whole
    chain) stops at the gate, with the check's own message and no traceback; the deployment
    that serves keeps serving, untouched. The next `up` measures again (its last run refused)
    and goes on."""
    before = containers(NODES)
    since = time.time()
    lab2.set("fabricCheck", {"onUnavailable": "refuse"})
    lab2.set("env", {"NCCL_DEBUG": "WARN"})
    try:
        run = lab2.up()
        assert run.error is not None
        text = run.error
        assert "fabric check could not run (node-1: torch is not importable" in text, text[-3000:]
        assert "Nothing started" in text and "fabricCheck.onUnavailable" in text
        assert "Traceback" not in text and "unhandled exception" not in text, text[-3000:]
        assert_unchanged(before)  # nothing stopped, nothing started
        events = docker_events(NODES, since, time.time())
        assert [e for e in events if e.role != "fabric-check"] == [], events
        # the check's short-lived container ran on each node and is gone
        assert {e.node for e in events if e.action == "destroy"} == set(NODES), events
        assert node_sh("node-1", "docker ps -aq --filter label=spark-vllm.role=fabric-check")\
            .strip() == ""
        assert_serving(lab2, lab_identities())
        assert lab2.outputs()["fabric"]["outcome"] == "warn"  # the last up's: the stack's
    finally:  # outputs are those of the last successful `up`
        lab2.set("fabricCheck", {"onUnavailable": "warn"})
        lab2.set("env", {"NCCL_DEBUG": "INFO"})
    again = ok(lab2.up())  # the triggers are the old ones: it runs because it refused
    assert planned(again) == {REMEASURED}, again.changed()
    assert_unchanged(before)
    fabric = lab2.outputs()["fabric"]
    assert fabric["outcome"] == "warn" and "onUnavailable: warn" in fabric["message"]
    # on demand, beside the serving stack: no verdict here (no torch), said, and nothing touched
    proc = subprocess.run([sys.executable, "-m", "spark_vllm.status", "--stack", STACK,
                           "--fabric"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **engine_env()}, timeout=300)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "fabric check could not run (node-1: torch is not importable" in proc.stdout
    assert_unchanged(before)


def test_4_identity_change_moves_the_head(lab2: Lab) -> None:
    head = cluster.find_node("node-1")
    lab2.set("nodes[0].fabricIp", head.spare_ip, path=True)
    before = containers(NODES)
    since = time.time()
    run = ok(lab2.up())
    until = time.time()
    # the image and memory checks ask the nodes at their identity: they run again, and pass
    assert planned(run) == {*CHAIN, REMEASURED, "node-1-preflight", "image-check",
                            "memory-check"}, run.changed()
    assert_ordered_replacement(run, before, since, until, CHAIN)
    identities = {**lab_identities(), "node-1": head.spare_ip}
    assert_serving(lab2, identities)
    after = containers(NODES)
    assert all(c.identity != head.fabric_ip for c in after)
    assert {c.identity for c in after if c.node == "node-1"} == {head.spare_ip}


def test_5_vllm_only_change_keeps_ray(lab2: Lab) -> None:
    lab2.set("vllmArgs", ["--max-model-len", "4096"])
    before = containers(NODES)
    run = ok(lab2.up())
    # the memory check runs again (vLLM's --max-model-len changed) and starts nothing
    assert set(run.changed()) == {"vllm-serve", "memory-check"}
    after = containers(NODES)
    ray_before = {c.id: c.started for c in before if c.role in RAY_ROLES}
    ray_after = {c.id: c.started for c in after if c.role in RAY_ROLES}
    assert ray_before == ray_after
    vllm_before = [c.id for c in before if c.role == "vllm"]
    vllm_after = [c.id for c in after if c.role == "vllm"]
    assert vllm_before != vllm_after and len(vllm_after) == 1
    assert "--max-model-len 4096" in node_sh(
        "node-1", f"docker inspect --format '{{{{join .Args \" \"}}}}' {vllm_after[0]}")


def test_5b_a_cold_start_past_vllm_timeout_and_a_slow_first_request_serve(lab2: Lab) -> None:
    """Each old bound, passed on the lab with small ones: a start of 12 s against vllmTimeout
    10 s on a cleared compile cache (the bound grows: 10 s + the cold allowance), a first
    request of 5 s against a per-step limit of 10 s (the old fixed bound, 120 s of vLLM's 300,
    is 4 s here; the smoke bound is 10 + 60 s), on nodes whose load fills their memory
    (vllm-sim's memory monitor kills a rank there unless its raylet's env turns it off)."""
    from spark_vllm.components.render.start_clocks import COLD_COMPILE_S
    for node in NODES:  # as an image change does: the node's compile cache is cleared
        node_sh(node, f"rm -rf /root/.cache/spark-vllm-compile/{STACK}/vllm/torch_compile_cache")
    lab2.set("vllmTimeout", 10)
    lab2.set("env", {"VLLM_SIM_LOAD_SECONDS": "12", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "10",
                     "VLLM_SIM_FIRST_REQUEST_S": "5", "VLLM_SIM_NODE_MEMORY_USAGE": "0.97"})
    try:
        run = ok(lab2.up())
        out = "\n".join(run.output)
        # the test model's weights (512 MiB over 2 nodes) add a few seconds, the cleared cache
        # its allowance
        said = re.search(r"bound of this start: (\d+) s \(vllmTimeout 10 s \+ (\d+) s to read "
                         r"[0-9.]+ GiB of weights over 2 nodes at 100 MiB/s \+ (\d+) s for a "
                         r"cold compile cache\); of its smoke request: 70 s "
                         r"\(VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS 10 s \+ 60 s\)", out)
        assert said, out[-3000:]
        bound, weights, cold = (int(g) for g in said.groups())
        assert cold == COLD_COMPILE_S and bound == 10 + weights + cold and weights < 10
        assert "smoke request answered" in out
        serve = [s.t for s in run.steps if s.name == "vllm-serve" and s.op.startswith("create")]
        assert max(serve) - min(serve) >= 12 + 5, serve  # past both old bounds, and serving
        # the stack's identities (test_4 moved the head to its spare address)
        assert_serving(lab2, {n["name"]: n["fabricIp"] for n in lab2.get("nodes")})
        for c in containers(NODES):
            env = node_sh(c.node, "docker inspect --format '{{join .Config.Env \" \"}}' " + c.id)
            if c.role in RAY_ROLES:  # the monitor off, the checks as patient as vLLM's limit
                assert "RAY_memory_monitor_refresh_ms=0" in env.split(), env
                assert "RAY_health_check_timeout_ms=2000" in env.split(), env
            else:  # the API server: vLLM's engine-ready clock is the start's bound
                assert f"VLLM_ENGINE_READY_TIMEOUT_S={bound}" in env.split(), env
        print(f"cold start past the old bounds: {run.seconds:.1f} s")
    finally:
        lab2.set("vllmTimeout", 120)
        lab2.set("env", {})


# A Ray driver in node-2's worker container that holds the node's GPU (an actor pinned to the
# node) for argv[1] seconds, then lets it go: a group that needs that GPU is slow, not impossible.
GPU_HOLDER = """
import sys, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
here = ray.get_runtime_context().get_node_id()
@ray.remote(num_gpus=1)
class Hold:
    def ping(self):
        return "ok"
hold = Hold.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
ray.get(hold.ping.remote(), timeout=120)  # once the GCS has removed the old vLLM's group
print("held", flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_5c_a_placement_group_slow_to_place_is_waited_for(lab2: Lab) -> None:
    """Issue 46: an actor holds node-2's GPU for 60 s while vLLM is replaced; vLLM logs that it
    waits for its placement group (after 10 s, then 30 s), the vLLM command asks Ray, which says
    the group is pending on GPUs in use outside placement groups, and keeps waiting: once the
    actor ends vLLM places its group and serves, and the up succeeds."""
    # vLLM's own placement group holds node-2's GPU while it serves: the actor could have it
    # only once the up removed vLLM, in a race with the new vLLM's group. So vLLM goes first,
    # out of band (an operator's `docker rm`; the up's delete finds it gone), and the actor
    # takes the GPU once Ray has removed the dead driver's group.
    ok(lab2.up())  # what test_5b set back (env, vllmTimeout) first: Ray must stay as it is
    stack = containers(NODES)
    vllm = next(c for c in stack if c.role == "vllm")
    node_sh(vllm.node, f"docker rm --force {vllm.name} >/dev/null")
    worker = next(c.name for c in stack if c.role == "ray-worker")
    holder = subprocess.Popen(cluster.ssh_argv("node-2", f"docker exec -i {worker} python3 - 60"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdin and holder.stdout
        holder.stdin.write(GPU_HOLDER)
        holder.stdin.close()
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(holder.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(150)
        assert line and line[0].strip() == "held", line
        lab2.set("vllmArgs", ["--max-model-len", "2048"])
        t0 = time.monotonic()
        run = ok(lab2.up())
        out = "\n".join(run.output)
        assert set(run.changed()) == {"vllm-serve", "memory-check"}
        assert "vLLM waits for its Ray placement group; Ray says: GPUs free:" in out, out[-3000:]
        assert "outside placement groups" in out and "cannot place" not in out
        assert time.monotonic() - t0 > 20  # it waited for the GPU, past vLLM's first line
        assert_serving(lab2, {n["name"]: n["fabricIp"] for n in lab2.get("nodes")})
    finally:
        holder.kill()
        holder.wait(30)


def assert_nothing_on_nodes() -> None:
    assert containers(NODES) == []
    for node in NODES:
        assert node_sh(node, f"ls -A ~/.spark-vllm/{STACK} 2>/dev/null || true").strip() == ""
        # bracketed so the pattern does not match the shell that runs pgrep
        procs = node_sh(node, "pgrep -af '[r]aylet|[g]cs_server|[v]llm' || true").strip()
        assert procs == "", procs


def test_6_destroy_leaves_nothing(lab2: Lab) -> None:
    run = ok(lab2.destroy())
    assert {name for op, name in run.ops("done") if op == "delete"} >= set(CHAIN)
    assert_nothing_on_nodes()
    assert [r for r in lab2.state_resources() if r["type"] != "pulumi:pulumi:Stack"] == []
    again = ok(lab2.destroy())
    assert again.changed() == {}


def test_7a_preflight_refuses_a_wrong_fabric_ip(lab2: Lab) -> None:
    node2 = cluster.find_node("node-2")
    wrong = node2.fabric_ip.rsplit(".", 1)[0] + ".222"  # on the fabric's subnet, on no node
    lab2.set("nodes[1].fabricIp", wrong, path=True)
    try:
        run = lab2.up()
        assert run.error is not None
        text = run.error
        assert "node-2" in text and f"fabricIp {wrong} is not on enp1s0f1np1" in text
        assert node2.fabric_ip in text  # the address actually there
        # the failed command's message is what the operator reads: the program, ended by the
        # engine (SIGINT, or a registration it cancels), adds no Python traceback under it
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
        assert "unhandled exception" not in text, text[-3000:]
        assert containers(NODES) == []  # refused before any container started
    finally:  # the next tests need the lab's own address back, whatever happened here
        lab2.set("nodes[1].fabricIp", node2.fabric_ip, path=True)
    ok(lab2.up())
    assert_serving(lab2, {"node-1": lab2.get("nodes")[0]["fabricIp"], "node-2": node2.fabric_ip})


def test_7b_a_worker_that_cannot_reach_the_head_fails_fast(lab2: Lab) -> None:
    """The fabric between the nodes drops everything: the worker's own command sees `ray start`
    fail to reach the head's GCS and says so within seconds (not rayTimeout, not vLLM's 1800 s),
    removing its container; nothing downstream starts."""
    # the image check and the staging cross the fabric too, and would name the block first
    # (test_staging): they ran while it was open; an env change replaces the Ray containers
    # alone, so the worker's own join meets the block
    # rayTimeout 60 s, so that a report in seconds is the worker's own check, not the bound
    ray_timeout = lab2.get("rayTimeout")
    lab2.set("rayTimeout", 60)
    lab2.set("env", {**lab2.get("env"), "SPARK_VLLM_TEST": "fabric-blocked"})
    head_ip, worker_ip = (n["fabricIp"] for n in lab2.get("nodes"))
    cluster.block_fabric("node-1", "node-2")
    try:
        run = lab2.up()
        assert run.error is not None
        worker = [s for s in run.steps if s.name == "ray-worker-node-2"]
        started = min(s.t for s in worker if s.phase == "pre" and s.op.startswith("create"))
        failed = max(s.t for s in worker if s.phase == "failed")
        # `ray start` logs its GCS line after 5 s; two connects 3 s apart, 2 s each: ~12 s.
        # Or it gives up and exits first (once in a CI run, 4 s in): one connect, then
        assert failed - started < 30, f"worker took {failed - started:.1f} s to fail"
        said = failed_lines(run, "node-2", "ray-worker")
        assert said, run.failure()
        assert f"cannot reach the Ray head node-1 at {head_ip}:6379 from {worker_ip}" in said[0]
        assert "no answer within 2 s" in said[0], said  # the connect's own outcome, named
        # the worker's own log, shown under it
        assert any(ln.strip().startswith("|") and f"Local node IP: {worker_ip}" in ln
                   for ln in run.error.splitlines()), run.failure()
        assert "Traceback" not in run.error
        assert not any(s.name in ("ray-gate", "vllm-serve") for s in run.steps
                       if s.phase == "pre" and s.op.startswith("create"))  # deleted, not started
        assert [c.role for c in containers(["node-2"])] == []  # nothing half-done on node-2
        print(f"worker reported the unreachable head after {failed - started:.1f} s "
              f"(rayTimeout {lab2.get('rayTimeout')} s; vLLM would wait 1800 s)")
    finally:
        cluster.unblock_fabric("node-1", "node-2")
        lab2.set("rayTimeout", ray_timeout)
    ok(lab2.up())
    nodes = lab2.get("nodes")
    assert_serving(lab2, {n["name"]: n["fabricIp"] for n in nodes})
