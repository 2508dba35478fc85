import pytest
from vsim_harness import HEAD_IP, WORKER_IP, start_cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: starts real Ray nodes and vllm-sim servers on loopback (seconds each)"
    )


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
