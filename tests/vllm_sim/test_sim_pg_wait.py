"""The placement-group wait keeps vLLM's schedule and text, on a fake clock (no Ray cluster)."""

import logging
import types

import pytest
import ray
import vllm_sim  # noqa: F401  (installed by make test)
from vllm_sim import ray_utils  # noqa: E402

SPECS = [{"GPU": 1.0, "node:192.168.200.12": 0.001}]


class FakePG:
    def __init__(self, specs):
        self.bundle_specs = specs

    def ready(self):
        return "ready-ref"


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    """A clock that only ray.wait advances, and a group that becomes ready at `ready_at`."""
    state = types.SimpleNamespace(now=1000.0, start=1000.0, ready_at=None, waits=[])

    def wait(refs, timeout):
        state.waits.append(timeout)
        if state.ready_at is not None and state.now + timeout >= state.start + state.ready_at:
            state.now = state.start + state.ready_at
            return refs, []
        state.now += timeout
        return [], refs

    def get(ref, timeout=None):
        if state.ready_at is None:
            raise ray.exceptions.GetTimeoutError("not ready")
        return True

    monkeypatch.setattr(ray_utils, "time", types.SimpleNamespace(time=lambda: state.now))
    monkeypatch.setattr(ray_utils.ray, "wait", wait)
    monkeypatch.setattr(ray_utils.ray, "get", get)
    monkeypatch.delenv("VLLM_SIM_PG_WAIT_TIMEOUT", raising=False)
    # vllm_sim's logger stops at its own stdout handler once configured: let caplog see it.
    monkeypatch.setattr(logging.getLogger("vllm_sim"), "propagate", True)
    caplog.set_level(logging.INFO, logger="vllm_sim")
    return state


def waited_seconds(caplog: pytest.LogCaptureFixture) -> list[int]:
    prefix = "Waiting for creating a placement group of specs for "
    return [
        int(r.getMessage().removeprefix(prefix).split()[0])
        for r in caplog.records
        if r.getMessage().startswith(prefix)
    ]


def test_vllm_backoff_schedule_then_vllm_error_at_1800_s(fake_ray, caplog):
    with pytest.raises(ValueError) as err:
        ray_utils._wait_until_pg_ready(FakePG(SPECS))
    assert waited_seconds(caplog) == [10, 30, 70, 150, 310, 630, 1270, 1800]
    assert fake_ray.now - fake_ray.start == 1800
    assert str(err.value) == (
        f"Cannot provide a placement group of placement_group_specs={SPECS!r} within 1800 "
        "seconds. See `ray status` and `ray list nodes` to make sure the cluster has enough "
        "resources."
    )
    message = next(r.getMessage() for r in caplog.records if "Waiting for" in r.getMessage())
    assert message.endswith(
        f"specs={SPECS!r}. Check `ray status` and `ray list nodes` to see if you have enough "
        "resources, and make sure the IP addresses used by ray cluster are the same as "
        "VLLM_HOST_IP environment variable specified in each node if you are running on a "
        "multi-node."
    )


def test_env_shortens_the_bound(fake_ray, caplog, monkeypatch):
    monkeypatch.setenv("VLLM_SIM_PG_WAIT_TIMEOUT", "12")
    with pytest.raises(ValueError, match="within 12 seconds"):
        ray_utils._wait_until_pg_ready(FakePG(SPECS))
    assert waited_seconds(caplog) == [10, 12]


def test_multi_gpu_request_gets_vllms_tensor_parallel_hint(fake_ray):
    specs = [{"GPU": 1.0, "node:192.168.200.12": 0.001}, {"GPU": 1.0}]
    with pytest.raises(ValueError) as err:
        ray_utils._wait_until_pg_ready(FakePG(specs))
    assert str(err.value).startswith(
        f"Cannot provide a placement group requiring 2.0 GPUs (placement_group_specs={specs!r}) "
        "within 1800 seconds.\nTensor parallel size may exceed available GPUs in your cluster."
    )


def test_ready_group_returns_without_a_waiting_line(fake_ray, caplog):
    fake_ray.ready_at = 45.0  # e.g. a worker joined late
    ray_utils._wait_until_pg_ready(FakePG(SPECS))
    assert waited_seconds(caplog) == [10, 30]
    assert fake_ray.now - fake_ray.start == 45.0
