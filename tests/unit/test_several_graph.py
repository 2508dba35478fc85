"""The graph of a stack with several models, under mocks: each model its own group under its
own names, the gateway apart from them, a change to one model (args, env, placement) reaching
only its own containers' triggers, and a node's identity every model on that node."""

from __future__ import annotations

from typing import Any

from spark_vllm.components.render import commands as c
from spark_vllm.components.spec import ClusterSpec, parse_spec
from tests.unit.harness import lab_nodes, pinned, run, run_outputs

CMD = "command:remote:Command"


def two(**change: Any) -> ClusterSpec:
    raw: dict[str, Any] = {
        "nodes": pinned(lab_nodes(2)), "image": "vllm/image:1", "backend": "native",
        "gateway": {"image": "ghcr.io/berriai/litellm:v1.105.7"},
        "models": [
            {"name": "big", "model": "org/big", "tensorParallelSize": 2,
             "vllmArgs": ["--gpu-memory-utilization", "0.5"]},
            {"name": "small", "model": "org/small", "tensorParallelSize": 1,
             "nodes": ["node-2"], "vllmArgs": ["--gpu-memory-utilization", "0.3"]},
        ]}
    for i, kv in change.get("models", {}).items():
        raw["models"][i].update(kv)
    for i, kv in change.get("nodes", {}).items():
        raw["nodes"][i].update(kv)
    return parse_spec(raw, "test", frozenset({"sshPrivateKey", "hfToken", "apiKey"}))


def containers(g: dict[str, Any]) -> dict[str, Any]:
    """Every container command (its update keeps the running container), by name."""
    return {n: r for n, r in g.items() if r.type == CMD
            and "docker inspect --format '{{.Id}}'" in (r.plain("update") or "")}


def test_each_model_is_its_own_group_and_the_gateway_is_on_the_head() -> None:
    g = run(two())
    assert set(containers(g)) == {"vllm-big-leader", "vllm-big-rank-node-2",
                                  "vllm-small-leader", "gateway"}
    # each model's weights fetched on the stack's head and copied to its nodes, before any
    # model starts
    assert {"model-big-stage", "model-small-stage", "model-big-copy-node-2",
            "model-small-copy-node-2"} <= set(g)
    assert g["model-small-stage"].plain("triggers")[0]["node"] == "node-1"
    stages = {g["model-big-stage"].urn, g["model-small-stage"].urn}
    for name in ("vllm-big-leader", "vllm-small-leader", "vllm-big-rank-node-2"):
        assert stages <= set(g[name].dependencies), name
    # one memory admission over the set, before every container
    assert all(g["memory-check"].urn in g[n].dependencies for n in containers(g))
    facts = g["memory-check"].plain("triggers")[0]
    assert [(m["key"], m["utilization"], sorted(m["containers"])) for m in facts["models"]] == [
        ("big", 0.5, ["node-1", "node-2"]), ("small", 0.3, ["node-2"])]
    # container names carry the model; the stack's label stays the stack's
    big = g["vllm-big-leader"].plain("triggers")[0]["argv"]
    assert "spark-vllm-test.big-vllm-leader" in big
    assert "spark-vllm.stack=test" in big and "spark-vllm.model=big" in big
    small = g["vllm-small-leader"].plain("triggers")[0]
    assert small["node"] == "node-2" and "--port" in small["argv"]
    assert small["argv"][small["argv"].index("--port") + 1] == "8002"


def test_the_gateway_routes_to_every_model_and_depends_on_none() -> None:
    g = run(two())
    gw = g["gateway"]
    facts = gw.plain("triggers")[0]
    assert facts["routes"] == [
        {"model": "org/big", "key": "big", "apiBase": "http://192.168.231.11:8001/v1"},
        {"model": "org/small", "key": "small", "apiBase": "http://192.168.231.12:8002/v1"}]
    assert facts["port"] == 8000 and facts["image"] == "ghcr.io/berriai/litellm:v1.105.7"
    model_urns = {g[n].urn for n in containers(g) if n != "gateway"}
    assert not model_urns & set(gw.dependencies)
    # the key LiteLLM sends upstream is a secret digest in its triggers, never the key
    assert "upstreamKey" in gw.plain("triggers")[1]
    assert "sk-" not in str(gw.inputs.get("triggers"))


def test_a_change_to_one_model_reaches_only_its_own_containers() -> None:
    before = run(two())
    after = run(two(models={1: {"vllmArgs": ["--gpu-memory-utilization", "0.3",
                                             "--enforce-eager"]}}))
    changed = {n for n in containers(before)
               if before[n].plain("triggers")[0] != after[n].plain("triggers")[0]}
    assert changed == {"vllm-small-leader"}
    # and the other way: the big model's args reach its two ranks, not small, not the gateway
    after = run(two(models={0: {"vllmArgs": ["--gpu-memory-utilization", "0.5",
                                             "--max-num-seqs", "8"]}}))
    changed = {n for n in containers(before)
               if before[n].plain("triggers")[0] != after[n].plain("triggers")[0]}
    assert changed == {"vllm-big-leader", "vllm-big-rank-node-2"}


def changed_by(**change: Any) -> set[str]:
    """The containers whose facts a change reaches (or that it adds or removes)."""
    before, after = run(two()), run(two(**change))
    return {n for n in containers(before) | containers(after)
            if n not in before or n not in after
            or before[n].plain("triggers")[0] != after[n].plain("triggers")[0]}


def test_one_models_env_or_placement_reaches_only_it_and_an_identity_every_model_there() -> None:
    # its env: its own server only
    assert changed_by(models={1: {"env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}}) == {
        "vllm-small-leader"}
    # its placement: small moves to node-1 (its server there, the gateway's route to it)
    assert changed_by(models={1: {"nodes": ["node-1"]}}) == {"vllm-small-leader", "gateway"}
    # node-2's identity: every container there (big's rank, small's server) and the gateway,
    # which routes to small at that address; big's rank 0 on node-1 is replaced with its rank
    # (its triggers link the rank's id: rank 0 never outlives a rank it formed its group with)
    assert changed_by(nodes={1: {"fabricIp": "192.168.231.99"}}) == {
        "vllm-big-rank-node-2", "vllm-small-leader", "gateway"}
    links = run(two())["vllm-big-leader"].plain("triggers")[1]
    assert links["rank@node-2"] == "vllm-big-rank-node-2-id"  # the mocks' id of that rank


def test_outputs_list_every_model_and_the_one_endpoint() -> None:
    out = run_outputs(two())
    assert out["endpoint"] == "http://10.231.0.11:8000/v1"
    assert out["servedModelName"] == ["org/big", "org/small"]
    assert set(out["models"]) == {"big", "small"}
    assert out["models"]["small"]["nodes"] == ["node-2"]
    node2 = next(n for n in out["nodes"] if n["name"] == "node-2")
    assert node2["containers"] == {"big/vllm-rank": "spark-vllm-test.big-vllm-rank",
                                   "small/vllm-leader": "spark-vllm-test.small-vllm-leader"}
    # each container's id under its node and role, as status compares them
    assert set(out["containerIds"]) == {"node-1/gateway", "node-1/big/vllm-leader",
                                        "node-2/big/vllm-rank", "node-2/small/vllm-leader"}
    node1 = next(n for n in out["nodes"] if n["name"] == "node-1")
    assert node1["containers"]["gateway"] == "spark-vllm-test-gateway"
    assert c.container_name(two().views()[0], c.LEADER) == "spark-vllm-test.big-vllm-leader"
