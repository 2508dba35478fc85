"""vllm-sim (legacy mode, vLLM 0.17.1) across two and three real Ray nodes on loopback, one GPU each.

Each node's raylet gets its own VLLM_HOST_IP, as each Spark's container must: vLLM does not
copy VLLM_HOST_IP from the driver to the workers (vllm/v1/executor/ray_env_utils.py). Tests run in file order:
the third node, whose VLLM_HOST_IP was copied from the head, joins only for the last test.
"""

from pathlib import Path

import pytest
import ray  # noqa: F401  (installed by make test)
import requests
import vllm_sim  # noqa: F401  (installed by make test)
from vsim_harness import HEAD_IP, LEGACY, WORKER_IP, rank_lines, start_serve  # noqa: E402

pytestmark = pytest.mark.slow

BAD_WORKER_IP = "127.0.0.4"


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-logs")


def test_tp2_places_one_rank_on_each_node_and_serves(cluster, logs):
    s = start_serve(
        cluster,
        "m",
        ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"],
        {**LEGACY, "VLLM_HOST_IP": HEAD_IP},
        logs,
    )
    try:
        s.wait_ready()
        r = requests.post(
            f"{s.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "across nodes?"}]},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
    finally:
        s.stop()
    out = s.output()
    # Rank 0 is pinned to the driver's node by the `node:<VLLM_HOST_IP>` bundle.
    assert [(rank, ip) for rank, ip, _ in rank_lines(out)] == [(0, HEAD_IP), (1, WORKER_IP)]
    assert f"TP=2 PP=1 ranks on {HEAD_IP}, {WORKER_IP} \u2014 you said: across nodes?" in text
    # TP spread over 2 nodes: vLLM's interconnect warning, once per node.
    assert out.count("Tensor parallel workers can be spread out to 2+ nodes") == 2
    assert "Waiting for creating a placement group" not in out


def test_worker_with_the_heads_vllm_host_ip_breaks_the_unique_ip_rule(cluster, logs):
    # An operator copied the head's env to a new worker: its ranks report the head's IP.
    cluster.add_node(BAD_WORKER_IP, vllm_host_ip=HEAD_IP)
    s = start_serve(
        cluster,
        "m",
        ["--tensor-parallel-size", "3", "--distributed-executor-backend", "ray"],
        {**LEGACY, "VLLM_HOST_IP": HEAD_IP},
        logs,
    )
    try:
        assert s.wait_exit(60) == 1
    finally:
        s.stop()
    out = s.output()
    assert "RuntimeError: Every node should have a unique IP address. Got 3 nodes" in out
    assert "2 unique IP addresses" in out
    assert "If you set `VLLM_HOST_IP` environment variable, make sure it is unique" in out
    assert {ip for _, ip, _ in rank_lines(out)} == {HEAD_IP, WORKER_IP, BAD_WORKER_IP}
