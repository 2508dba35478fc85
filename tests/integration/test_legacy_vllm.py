"""The same program on a lab whose simulator plays vLLM 0.17.1 (the outage image's legacy Ray
executor: placement group pinned with `node:<VLLM_HOST_IP>`): fresh up, env change in order,
vLLM-only change, and a worker that cannot reach the head. The other modules run the default
image, which plays vLLM 0.33.0 (RayExecutorV2)."""

from __future__ import annotations

import time

import pytest

from lab import cluster, config
from tests.integration.engine import Lab, containers, failed_lines
from tests.integration.test_lifecycle import (
    CHAIN,
    NODES,
    RAY_ROLES,
    assert_ordered_replacement,
    assert_serving,
    lab_identities,
    ok,
)

pytestmark = pytest.mark.integration


def test_l1_legacy_fresh_up_serves_and_names_its_vllm(lab2_legacy: Lab) -> None:
    ok(lab2_legacy.up())
    assert_serving(lab2_legacy, lab_identities())
    versions = {p["vllm"] for p in lab2_legacy.outputs()["preflight"].values()}
    assert versions == {config.LEGACY_SIM_VLLM_VERSION}


def test_l2_legacy_env_change_replaces_the_chain_in_order(lab2_legacy: Lab) -> None:
    lab2_legacy.set("env", {"NCCL_DEBUG": "INFO"})
    before = containers(NODES)
    since = time.time()
    run = ok(lab2_legacy.up())
    assert_ordered_replacement(run, before, since, time.time(), CHAIN)
    assert_serving(lab2_legacy, lab_identities())


def test_l3_legacy_vllm_only_change_keeps_ray(lab2_legacy: Lab) -> None:
    lab2_legacy.set("vllmArgs", ["--max-model-len", "4096"])
    before = containers(NODES)
    run = ok(lab2_legacy.up())
    # the memory check runs again (vLLM's --max-model-len changed) and starts nothing
    assert set(run.changed()) == {"vllm-serve", "memory-check"}
    ray = {c.id: c.started for c in containers(NODES) if c.role in RAY_ROLES}
    assert ray == {c.id: c.started for c in before if c.role in RAY_ROLES}


def test_l4_legacy_worker_that_cannot_reach_the_head_fails_fast(lab2_legacy: Lab) -> None:
    # the image check and the staging cross the fabric too, and would name the block first
    # (test_staging): they ran while it was open; an env change replaces the Ray containers
    # alone, so the worker's own join meets the block
    # rayTimeout 60 s, so that a report in seconds is the worker's own check, not the bound
    ray_timeout = lab2_legacy.get("rayTimeout")
    lab2_legacy.set("rayTimeout", 60)
    lab2_legacy.set("env", {**lab2_legacy.get("env"), "SPARK_VLLM_TEST": "fabric-blocked"})
    cluster.block_fabric("node-1", "node-2")
    try:
        run = lab2_legacy.up()
        said = failed_lines(run, "node-2", "ray-worker")
        assert said and "cannot reach the Ray head node-1" in said[0], run.failure()
        assert "no answer within 2 s" in said[0], said  # the connect's own outcome, named
        worker = [s for s in run.steps if s.name == "ray-worker-node-2"]
        took = max(s.t for s in worker if s.phase == "failed") - min(
            s.t for s in worker if s.phase == "pre" and s.op.startswith("create"))
        # `ray start` logs its GCS line after 5 s; two connects 3 s apart, 2 s each: ~12 s
        assert took < 30, f"worker took {took:.1f} s to fail"
        assert containers(["node-2"]) == []
    finally:
        cluster.unblock_fabric("node-1", "node-2")
        lab2_legacy.set("rayTimeout", ray_timeout)
