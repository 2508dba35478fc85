"""The teardown of a stack with a node gone: which commands are forgotten, in which order, and
what must be destroyed before each (spark_vllm/teardown.py; the lab runs it for real)."""

from __future__ import annotations

import pytest

from spark_vllm import teardown

NODES = [{"name": "node-1"}, {"name": "node-2"}, {"name": "node-3"}]


def test_a_head_node_forgets_vllm_before_the_head_and_a_worker_only_its_worker() -> None:
    assert teardown.container_commands(NODES, "node-1") == ["vllm-serve", "vllm-api-key",
                                                            "ray-head"]
    native = [{"name": "node-1", "containers": {"vllm-leader": "id"}}, {"name": "node-2"}]
    assert teardown.container_commands(native, "node-1") == ["vllm-leader", "vllm-api-key"]
    assert teardown.container_commands(NODES, "node-3") == ["ray-worker-node-3"]
    with pytest.raises(LookupError, match="no node 'node-9'"):
        teardown.container_commands(NODES, "node-9")


def test_dependents_follow_dependencies_and_property_dependencies_transitively() -> None:
    u = "urn:pulumi:s::p::t::{}".format
    resources = [
        {"urn": u("head")},
        {"urn": u("worker"), "propertyDependencies": {"triggers": [u("head")]}},
        {"urn": u("gate"), "dependencies": [u("worker")]},
        {"urn": u("vllm"), "propertyDependencies": {"triggers": [u("gate"), u("head")]}},
        {"urn": u("other")},
    ]
    assert sorted(teardown.dependents(resources, u("worker"))) == [u("gate"), u("vllm")]
    assert sorted(teardown.dependents(resources, u("head"))) == [u("gate"), u("vllm"),
                                                                 u("worker")]
    assert teardown.dependents(resources, u("vllm")) == []
