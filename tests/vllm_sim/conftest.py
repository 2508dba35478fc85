import pytest
from vsim_harness import HEAD_IP, WORKER_IP, start_cluster

# the `slow` marker is declared in pyproject.toml ([tool.pytest.ini_options]), with the others


@pytest.fixture(scope="module")
def cluster():
    """A real two-node Ray on loopback (head 127.0.0.2, worker 127.0.0.3, one GPU each), each
    raylet with its own VLLM_HOST_IP; one per test module, stopped after it."""
    c = start_cluster(head_vllm_host_ip=HEAD_IP)
    try:
        c.add_node(WORKER_IP, vllm_host_ip=WORKER_IP)
        yield c
    finally:
        c.stop()
