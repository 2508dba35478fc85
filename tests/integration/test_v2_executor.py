"""vLLM >= 0.18's Ray executor (RayExecutorV2, simulated as 0.33.0 by the lab's default image)
against the program: the ipc:// channel between the driver and its local rank, and the
driver's environment that V2 copies to every rank."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from pulumi import automation as auto

from lab import cluster
from spark_vllm.components.render.backends import ray as ray_backend
from spark_vllm.components.render.commands import sh_join
from spark_vllm.components.spec import parse_spec
from tests.integration.conftest import API_KEY
from tests.integration.engine import STACK, Lab, node_sh
from tests.integration.test_lifecycle import http_status, ok

pytestmark = pytest.mark.integration


def ranks(lab: Lab) -> list[dict[str, Any]]:
    base = lab.outputs()["endpoint"].removesuffix("/v1")
    req = urllib.request.Request(f"{base}/sim/ranks",
                                 headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return list(json.load(resp)["ranks"])


def test_v1_mixed_fabric_no_head_value_or_secret_reaches_the_workers_rank(lab2: Lab) -> None:
    """node-2 is reached and identified by its management address, with no fabric keys of its
    own (cabled differently: sparkrun#135). V2 would copy the head's NCCL/GLOO/TP/UCX values,
    the API key and the HF token to its rank; the program's non-carry-over list stops them."""
    nodes = lab2.get("nodes")
    worker = {k: v for k, v in nodes[1].items() if k not in ("fabricIp", "fabricInterface")}
    lab2.stack.set_config("spark-vllm:hfToken", auto.ConfigValue("hf-itest-secret", secret=True))
    for key in ("fabricIp", "fabricInterface"):
        lab2.stack.remove_config(f"spark-vllm:nodes[1].{key}", path=True)
    ok(lab2.up())
    by_node = {r["node_ip"]: r["env"] for r in ranks(lab2)}
    head_env, worker_env = by_node[nodes[0]["fabricIp"]], by_node[worker["host"]]
    assert head_env["NCCL_SOCKET_IFNAME"] == {"value": "enp1s0f1np1", "source": "node"}
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                "UCX_NET_DEVICES"):
        assert key not in worker_env, (key, worker_env)
    assert worker_env["VLLM_API_KEY"] == {"present": False}
    # HF_TOKEN: the worker's own container has it (its env-file), never the driver's copy
    assert worker_env["HF_TOKEN"].get("source", "node") == "node"
    assert worker_env["VLLM_HOST_IP"] == {"value": worker["host"], "source": "node"}


def test_v2_without_a_shared_rpc_path_vllm_hangs_and_the_program_does_not(lab2: Lab) -> None:
    """The program's own vLLM serves (the fixture's stack is up). Started as before the fix —
    VLLM_RPC_BASE_PATH left at the container's private /tmp — a driver never serves: its rank on
    the head node cannot reach the driver's ipc:// socket, and vLLM waits without a word."""
    ok(lab2.up())
    spec = parse_spec({k.split(":", 1)[1]: v for k, v in _config(lab2).items()}, STACK,
                      frozenset({"sshPrivateKey", "apiKey"}))
    served = f"spark-vllm-{STACK}-vllm"
    base = lab2.outputs()["endpoint"].removesuffix(f":{spec.port}/v1")
    node_sh("node-1", f"docker stop -t 1 {served}")  # frees the GPUs; restarted below
    try:
        argv = ray_backend.vllm_run_argv(spec)
        argv[argv.index("--name") + 1] = "itest-v2-hang"
        at = argv.index("VLLM_RPC_BASE_PATH=/tmp/ray")
        del argv[at - 1:at + 1]  # the --env and its value: the driver keeps its own /tmp
        at = argv.index("--env-file")
        del argv[at:at + 2]  # no secrets needed for this
        argv[argv.index("--port") + 1] = "8011"
        node_sh("node-1", sh_join(argv))  # as the program sends it: `~/` expanded by the node
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert http_status(f"{base}:8011/health") != 200
            time.sleep(1)
        logs = node_sh("node-1", "docker logs itest-v2-hang 2>&1")
        assert "rank 0 -> node" in logs and "Starting vLLM API server" not in logs, logs[-2000:]
        assert "ERROR" not in logs  # silent, as vLLM is
    finally:
        node_sh("node-1", "docker rm -f itest-v2-hang >/dev/null 2>&1 || true", check=False)
        node_sh("node-1", f"docker start {served}")
    # the program's container, same id, serves again (its command waited the same way)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if http_status(f"{base}:{spec.port}/health") == 200:
            break
        time.sleep(1)
    else:
        raise AssertionError("the program's vLLM did not serve again")
    assert lab2.preview().changed() == {}
    assert cluster.info().nodes


def _config(lab: Lab) -> dict[str, Any]:
    return {k: lab.get(k.split(":", 1)[1]) for k in lab.stack.get_all_config()
            if k.startswith("spark-vllm:") and k not in ("spark-vllm:sshPrivateKey",
                                                          "spark-vllm:apiKey",
                                                          "spark-vllm:hfToken")}
