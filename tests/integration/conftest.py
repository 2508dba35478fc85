"""Integration fixtures: one lab (2 nodes) shared by the lifecycle scenarios, torn down at the
end whatever happened, so a failing scenario never leaves containers behind."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from lab import cluster, config
from spark_vllm.components.spec import DEFAULT_RAY_TIMEOUT_S
from tests.integration.engine import Lab

pytestmark = pytest.mark.integration

API_KEY = "sk-itest-" + secrets.token_hex(8)
TEST_DIAL_TIMEOUT_S = 3
TEST_CANARY_S, TEST_WEDGE_WINDOW_S = 5, 10


def _teardown(lab: Lab | None) -> None:
    """Destroy the stack and remove the nodes; their image volumes go at the session's end."""
    if lab is not None and cluster.info().nodes:
        lab.destroy()
    if lab is not None:
        # the next module starts from no state: a destroy keeps pending operations (an
        # interrupted run's), and broken nodes may have refused it; `lab up` rewrites the config
        lab.stack.workspace.remove_stack(lab.stack.name, force=True)
    cluster.down(keep_volumes=True, quiet=True)


@pytest.fixture(scope="session", autouse=True)
def lab_removed_at_the_end() -> Iterator[None]:
    yield
    cluster.down(quiet=True)  # every lab container, network and volume, whatever happened


def start_lab(nodes: int, tp: int | None = None, pp: int = 1,
              ray_timeout: int = DEFAULT_RAY_TIMEOUT_S,
              sim_vllm_version: str = config.SIM_VLLM_VERSION) -> Lab:
    """The lab, with the tests' bounds: a small model (config.TEST_MODEL_BYTES), SSH dials of
    3 s (a cut node is named in ~15 s, not ~1 min), liveness windows of 5 s + 10 s, and
    vllm-sim's pretend load and compile short (Lab.TEST_ENV, kept under every `env` a test
    sets). rayTimeout stays the product's 60 s: no test waits for it to pass, and with the
    tests' former 20 s, Ray workers starting on a loaded 2-core CI machine missed it (all three
    of the 4-node lab's in CI13 and CI15; 2-node joins logged "10 s of 20 s" a dozen times)."""
    cluster.up(cluster.UpOptions(nodes=nodes, tp=tp, pp=pp, quiet=True,
                                 sim_vllm_version=sim_vllm_version,
                                 model_bytes=config.TEST_MODEL_BYTES))
    lab = Lab()
    # one CLI run for all of them (each `pulumi config set` is one)
    lab.set_all({
        "rayTimeout": ray_timeout, "vllmTimeout": 120, "sshDialTimeout": TEST_DIAL_TIMEOUT_S,
        # liveness: vllm-sim's one-token canary answers in well under a second; a rank that
        # died or froze is named after these instead of the defaults' 30 s + 60 s, on every
        # status and refresh that meets one (test_wedge sets its own, shorter still)
        "canaryTimeout": TEST_CANARY_S, "wedgeWindow": TEST_WEDGE_WINDOW_S,
        "env": lab.get("env"),  # with Lab.TEST_ENV under it
    }, Lab.secrets(API_KEY))
    return lab


@pytest.fixture(scope="module")
def lab2() -> Iterator[Lab]:
    lab = None
    try:
        lab = start_lab(2)
        yield lab
    finally:
        _teardown(lab)


@pytest.fixture(scope="module")
def lab2n() -> Iterator[Lab]:
    """Two nodes, the stack on backend native (vLLM's own multi-node, no Ray)."""
    lab = None
    try:
        lab = start_lab(2)
        lab.set("backend", "native")
        lab.set("joinTimeout", 60)
        yield lab
    finally:
        _teardown(lab)


@pytest.fixture(scope="module")
def lab2_legacy() -> Iterator[Lab]:
    """Two nodes whose simulator plays vLLM 0.17.1 (the outage image's legacy Ray executor)."""
    lab = None
    try:
        lab = start_lab(2, sim_vllm_version=config.LEGACY_SIM_VLLM_VERSION)
        yield lab
    finally:
        _teardown(lab)


@pytest.fixture(scope="module")
def lab4() -> Iterator[Lab]:
    lab = None
    try:
        lab = start_lab(4, tp=2, pp=2)
        yield lab
    finally:
        _teardown(lab)
