"""V2 mode: the driver and its node's ranks talk over ipc:// sockets under VLLM_RPC_BASE_PATH.

In the lab (and on the Sparks) the driver runs in its own container and the head's ranks in
the Ray head container: they share /dev/shm and Ray's temp dir, not /tmp. Here the head's
`ray start` runs in its own mount namespace (`unshare -Urm`) whose /tmp is a private directory,
with Ray's temp dir bound back in: the same split, without containers. The driver stays in the
host's /tmp. Nothing in the simulator knows about it: it binds and connects real Unix sockets.

vLLM 0.33.0: the driver binds `ipc://{VLLM_RPC_BASE_PATH}/{uuid4}` (default
tempfile.gettempdir(); shm_broadcast.py:542-544, network_utils.py:175-177), each local rank
connects to that path and binds its own reply socket under ITS VLLM_RPC_BASE_PATH, which it
takes from the driver unless its node sets it (ray_executor_v2.py:173-177, :193-212). The
driver then waits in wait_until_ready() (shm_broadcast.py:688-719): no timeout, no log.
"""

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import requests
import vllm_sim  # noqa: F401  (installed by make test)
from vsim_harness import (
    HEAD_IP,
    V2,
    RayCluster,
    Serve,
    can_unshare_mount,
    rank_lines,
    start_cluster,
    start_serve,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_unshare_mount(), reason="needs unshare -Urm (user namespaces)"),
    pytest.mark.skipif("TMPDIR" in os.environ, reason="the driver's default base must be /tmp"),
]

HANG_S = 20.0  # vLLM has no bound: the test only shows it is not healthy after this long
TP1 = ["--tensor-parallel-size", "1", "--distributed-executor-backend", "ray"]


def private_cluster(gpus: int, env: dict[str, str] | None = None) -> tuple[RayCluster, Path]:
    priv = Path(tempfile.mkdtemp(prefix="vsim-priv-", dir="/tmp"))
    return start_cluster(HEAD_IP, gpus=gpus, env=env, private_tmp=priv), priv


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("v2-ipc-logs")


def healthy(s: Serve) -> bool:
    try:
        return requests.get(f"{s.url}/health", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def assert_hangs_silently(s: Serve, started: float) -> str:
    while time.monotonic() - started < HANG_S:
        assert not healthy(s), "became healthy"
        assert s.proc.poll() is None, f"exited {s.proc.returncode}:\n{s.output()}"
        time.sleep(0.5)
    out = s.output()
    assert [(r, ip) for r, ip, _ in rank_lines(out)] == [(0, HEAD_IP)]  # placed and loaded ...
    assert "Model loading took" in out
    assert "Starting vLLM API server" not in out  # ... then nothing: the engine never readies
    assert "ERROR" not in out and "Traceback" not in out
    return out


def test_driver_tmp_not_visible_to_the_local_rank_hangs_shared_base_serves(logs):
    cluster, priv = private_cluster(gpus=2)
    try:
        shared = Path(cluster.temp_dir) / "rpc"  # visible to both, as /tmp/ray is in the lab
        shared.mkdir()
        started = time.monotonic()
        default = start_serve(cluster, "m", TP1, dict(V2), logs)
        fixed = start_serve(cluster, "m", TP1, {**V2, "VLLM_RPC_BASE_PATH": str(shared)}, logs)
        try:
            fixed.wait_ready()
            ranks = requests.get(f"{fixed.url}/sim/ranks", timeout=10).json()["ranks"]
            assert ranks[0]["env"]["VLLM_RPC_BASE_PATH"] == {"value": str(shared),
                                                             "source": "driver"}
            out = assert_hangs_silently(default, started)
            # The driver's socket exists in the driver's /tmp and nowhere the rank can see.
            path = out.split("over /dev/shm + ipc://", 1)[1].split(",", 1)[0]
            assert path.startswith("/tmp/") and Path(path).is_socket()
            assert not (priv / Path(path).name).exists()
        finally:
            default.stop()
            fixed.stop()
    finally:
        cluster.stop()
        shutil.rmtree(priv, ignore_errors=True)


def test_node_setting_its_own_base_path_hangs_even_with_a_shared_driver_base(logs):
    # The head container sets VLLM_RPC_BASE_PATH=/tmp itself: the driver's value is not carried
    # over, the rank binds its reply socket in its private /tmp, the driver cannot reach it.
    cluster, priv = private_cluster(gpus=1, env={"VLLM_RPC_BASE_PATH": "/tmp"})
    try:
        shared = Path(cluster.temp_dir) / "rpc"
        shared.mkdir()
        started = time.monotonic()
        s = start_serve(cluster, "m", TP1, {**V2, "VLLM_RPC_BASE_PATH": str(shared)}, logs)
        try:
            assert_hangs_silently(s, started)
        finally:
            s.stop()
    finally:
        cluster.stop()
        shutil.rmtree(priv, ignore_errors=True)
