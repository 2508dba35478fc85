"""V2 mode (vLLM 0.33.0 RayExecutorV2) on a real two-node Ray on loopback: placement without
the `node:` pin, the driver's environment carried to every rank, a dead rank ends the server.

The worker node's `ray start` sets NCCL_SOCKET_IFNAME itself (its container's fabric setting);
the head's does not. vllm/v1/executor/ray_env_utils.py:10-20 + ray_executor_v2.py:173-177.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import requests
import vllm_sim  # noqa: F401  (installed by make test)
from vsim_harness import (
    HEAD_IP,
    LEGACY,
    V2,
    WORKER_IP,
    RayCluster,
    rank_lines,
    start_cluster,
    start_serve,
)

pytestmark = pytest.mark.slow

WORKER_NCCL_IF = "enp1s0f1np1"  # what the worker's container sets
DRIVER_ENV = {
    "NCCL_SOCKET_IFNAME": "head-if0",
    "GLOO_SOCKET_IFNAME": "head-gloo0",
    "UCX_NET_DEVICES": "head-mlx5_0:1",
    "HF_TOKEN": "hf_secret_value_9",
    "VLLM_API_KEY": "api-secret-value-9",
}
TP2 = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(head_vllm_host_ip=HEAD_IP)
    try:
        c.add_node(WORKER_IP, vllm_host_ip=WORKER_IP, env={"NCCL_SOCKET_IFNAME": WORKER_NCCL_IF})
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("v2-serve-logs")


def ranks_of(cluster: RayCluster, logs: Path, env: dict[str, str]) -> tuple[list[dict], str]:
    s = start_serve(cluster, "m", TP2, {**V2, "VLLM_HOST_IP": HEAD_IP, **env}, logs)
    try:
        s.wait_ready()
        auth = {"Authorization": f"Bearer {env['VLLM_API_KEY']}"} if "VLLM_API_KEY" in env else {}
        ranks = requests.get(f"{s.url}/sim/ranks", timeout=10).json()["ranks"]
        chat = requests.post(f"{s.url}/v1/chat/completions", headers=auth, timeout=10,
                             json={"model": "m", "messages": [{"role": "user", "content": "e"}]})
        assert chat.status_code == 200, chat.text
        return ranks, chat.json()["choices"][0]["message"]["content"]
    finally:
        s.stop()


def test_v2_places_without_the_pin_where_legacy_waits(cluster, logs):
    # The seed incident's driver: VLLM_HOST_IP names no Ray node.
    env = {"VLLM_HOST_IP": "127.0.0.9", "VLLM_SIM_PG_WAIT_TIMEOUT": "11"}

    def run(mode: dict[str, str]):  # type: ignore[no-untyped-def]
        s = start_serve(cluster, "m", ["-tp", "1", "--distributed-executor-backend", "ray"],
                        {**mode, **env}, logs)
        try:
            if mode is V2:
                s.wait_ready()
                return "ready", s.output()
            return s.wait_exit(60), s.output()
        finally:
            s.stop()

    legacy = run(LEGACY)
    v2 = run(V2)
    assert legacy[0] == 1
    assert "'node:127.0.0.9': 0.001" in legacy[1]
    assert "Cannot provide a placement group" in legacy[1]
    assert v2[0] == "ready"
    assert "'node:" not in v2[1]
    assert "Waiting for creating a placement group" not in v2[1]
    assert "Every node should have a unique IP" not in v2[1]
    assert len(rank_lines(v2[1])) == 1


def test_env_is_carried_unless_the_node_sets_it(cluster, logs):
    ranks, text = ranks_of(cluster, logs, DRIVER_ENV)
    head, worker = ranks
    assert (head["node_ip"], head["driver_node"]) == (HEAD_IP, True)
    assert (worker["node_ip"], worker["driver_node"]) == (WORKER_IP, False)
    # The head's fabric values land on the worker wherever its container is silent ...
    assert worker["env"]["GLOO_SOCKET_IFNAME"] == {"value": "head-gloo0", "source": "driver"}
    assert worker["env"]["UCX_NET_DEVICES"] == {"value": "head-mlx5_0:1", "source": "driver"}
    # ... but not where it sets the variable itself.
    assert worker["env"]["NCCL_SOCKET_IFNAME"] == {"value": WORKER_NCCL_IF, "source": "node"}
    assert head["env"]["NCCL_SOCKET_IFNAME"] == {"value": "head-if0", "source": "driver"}
    # VLLM_HOST_IP is worker-specific: never copied (ray_utils.py:17-25).
    assert worker["env"]["VLLM_HOST_IP"] == {"value": WORKER_IP, "source": "node"}
    # The secrets reach every rank process; reported by presence only.
    for rank in ranks:
        assert rank["env"]["HF_TOKEN"] == {"present": True, "source": "driver"}
        assert rank["env"]["VLLM_API_KEY"] == {"present": True, "source": "driver"}
    assert "hf_secret_value_9" not in json.dumps(ranks) + text
    assert f"r1@{WORKER_IP}[GLOO_SOCKET_IFNAME=head-gloo0(driver) NCCL_SOCKET_IFNAME=" \
           f"{WORKER_NCCL_IF}(node)" in text


def test_non_carry_over_file_excludes_names(cluster, logs, tmp_path):
    root = tmp_path / "vllm-config"
    root.mkdir()
    (root / "ray_non_carry_over_env_vars.json").write_text(
        json.dumps(["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "HF_TOKEN",
                    "VLLM_API_KEY"]))
    ranks, _ = ranks_of(cluster, logs, {**DRIVER_ENV, "VLLM_CONFIG_ROOT": str(root)})
    head, worker = ranks
    assert "GLOO_SOCKET_IFNAME" not in worker["env"]
    assert "NCCL_SOCKET_IFNAME" not in head["env"]
    assert worker["env"]["NCCL_SOCKET_IFNAME"] == {"value": WORKER_NCCL_IF, "source": "node"}
    for rank in ranks:
        assert rank["env"]["HF_TOKEN"] == {"present": False}
        assert rank["env"]["VLLM_API_KEY"] == {"present": False}


def test_non_carry_over_file_under_xdg_config_home_and_a_bad_file(cluster, logs, tmp_path):
    # Default VLLM_CONFIG_ROOT = $XDG_CONFIG_HOME/vllm (vllm/envs.py:705-710, 347-351); a file
    # that is not JSON excludes nothing, with vLLM's warning (vllm/ray/ray_env.py:24-29).
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "ray_non_carry_over_env_vars.json").write_text("[not json")
    s = start_serve(cluster, "m", TP2, {**V2, **DRIVER_ENV, "XDG_CONFIG_HOME": str(tmp_path)},
                    logs)
    try:
        s.wait_ready()
        head, worker = requests.get(f"{s.url}/sim/ranks", timeout=10).json()["ranks"]
    finally:
        s.stop()
    assert worker["env"]["GLOO_SOCKET_IFNAME"]["source"] == "driver"
    assert worker["env"]["HF_TOKEN"] == {"present": True, "source": "driver"}
    assert "Failed to parse" in s.output()
    assert "Using an empty set for non-carry-over env vars." in s.output()


def test_a_killed_rank_ends_the_server(cluster, logs):
    s = start_serve(cluster, "m", TP2, {**V2, "VLLM_HOST_IP": HEAD_IP}, logs)
    try:
        s.wait_ready()
        ranks = rank_lines(s.output())
        assert [(r, ip) for r, ip, _ in ranks] == [(0, HEAD_IP), (1, WORKER_IP)]
        killed_at = time.monotonic()
        os.kill(ranks[1][2], signal.SIGKILL)  # the worker node's rank actor: a lost node
        # Monitor polls every 5 s, the watchdog every 5 s: the process is gone well within 30 s.
        rc = s.wait_exit(30)
        took = time.monotonic() - killed_at
    finally:
        s.stop()
    out = s.output()
    assert "RayWorkerProc rank=[1] died unexpectedly, shutting down executor." in out
    assert "EngineCore encountered a fatal error." in out
    assert "RuntimeError: Executor failed." in out
    # vLLM 0.33.0 exits 0 here (issue #48966): nothing re-raises after the graceful shutdown.
    assert rc == 0
    assert took < 30


MONITOR = """
import os, sys
from vllm_sim.ray_executor_v2 import _memory_monitor
_memory_monitor(dict(a.split("=", 1) for a in sys.argv[1:]))
print("alive")
"""


@pytest.mark.parametrize(("raylet_env", "usage", "killed"), [
    ([], "0.97", True),  # Ray's default: the monitor on, 0.95
    (["RAY_memory_monitor_refresh_ms=0"], "0.97", False),  # what spark-vllm's containers set
    (["RAY_memory_usage_threshold=0.98"], "0.97", False),
    ([], "0.90", False),
    ([], "", False),  # the simulator's knob unset: no pressure played
])
def test_the_memory_monitor_is_the_raylets(raylet_env, usage, killed):
    """Without Ray: the rank's check reads the raylet's env (the rank process's own at start),
    kills itself with the raylet's message when the node is over the threshold."""
    import subprocess
    import sys
    env = {**os.environ, "VLLM_SIM_NODE_MEMORY_USAGE": usage,
           "RAY_memory_monitor_refresh_ms": "0"}  # the driver's copy: never read
    done = subprocess.run([sys.executable, "-c", MONITOR, *raylet_env], env=env,
                          capture_output=True, text=True, timeout=60)
    if killed:
        assert done.returncode == -signal.SIGKILL, done
        assert "1 worker(s) were killed due to the node running low on memory" in done.stderr
    else:
        assert done.returncode == 0 and "alive" in done.stdout, done


def test_rays_memory_monitor_kills_a_rank_whose_node_leaves_it_on(cluster, logs):
    """The load fills the node's memory (VLLM_SIM_NODE_MEMORY_USAGE 0.97 > Ray's 0.95): with
    the monitor as this cluster's `ray start` left it (on, Ray's default), the rank is killed
    with the raylet's message and vLLM does not start. The driver's own env turns nothing off:
    the monitor is the raylet's (spark-vllm sets RAY_memory_monitor_refresh_ms=0 in every Ray
    container, and the lab's test_lifecycle starts a loaded node under it)."""
    s = start_serve(cluster, "m", TP2, {**V2, "VLLM_HOST_IP": HEAD_IP,
                                        "VLLM_SIM_NODE_MEMORY_USAGE": "0.97",
                                        "RAY_memory_monitor_refresh_ms": "0"}, logs)
    try:
        rc = s.wait_exit(60)
    finally:
        s.stop()
    out = s.output()
    assert rc != 0, out[-3000:]
    assert "worker(s) were killed due to the node running low on memory" in out, out[-3000:]
    assert "set the environment variable `RAY_memory_monitor_refresh_ms` to zero" in out


def test_waiting_line_now_means_the_gpus_are_busy(cluster, logs):
    # One GPU held by a running engine; TP=2 asks for two: the same waiting line and error as
    # legacy (ray_utils.py:201-263), specs without a pin, no "Current node has no GPU".
    holder = start_serve(cluster, "m", ["-tp", "1", "--distributed-executor-backend", "ray"],
                         dict(V2), logs)
    try:
        holder.wait_ready()
        s = start_serve(cluster, "m", TP2, {**V2, "VLLM_SIM_PG_WAIT_TIMEOUT": "11"}, logs)
        try:
            assert s.wait_exit(60) == 1
        finally:
            s.stop()
    finally:
        holder.stop()
    out = s.output()
    assert ("Waiting for creating a placement group of specs for 10 seconds. "
            "specs=[{'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status`") in out
    assert "Cannot provide a placement group requiring 2.0 GPUs" in out
    assert "Current node has no GPU" not in out
