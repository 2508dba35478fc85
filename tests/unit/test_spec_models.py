"""The several-models config (`models:`): what it accepts, what each model's view is, and each
refusal with its path, all problems reported together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_vllm.components.spec import SpecError, decode_config, parse_spec
from tests.unit.harness import TEST_HOST_KEY

ROOT = Path(__file__).resolve().parents[2]
SECRETS = frozenset({"sshPrivateKey"})


def two_models() -> dict[str, Any]:
    return {
        "nodes": [
            {"name": "spark-a", "host": "10.1.230.180", "hostKey": TEST_HOST_KEY,
             "fabricIp": "192.168.200.12", "fabricInterface": "enp1s0f1np1"},
            {"name": "spark-b", "host": "10.1.230.181", "hostKey": TEST_HOST_KEY,
             "fabricIp": "192.168.200.13", "fabricInterface": "enp1s0f1np1"},
        ],
        "image": "vllm/vllm-openai:v0.26.0",
        "backend": "native",
        "env": {"NCCL_DEBUG": "WARN"},
        "gateway": {"image": "ghcr.io/berriai/litellm:v1.105.7"},
        "models": [
            {"name": "big", "model": "Qwen/Qwen3.5-122B-A10B-FP8", "tensorParallelSize": 2,
             "servedModelName": "qwen-122b",
             "vllmArgs": ["--gpu-memory-utilization", "0.6"]},
            {"name": "small", "model": "Qwen/Qwen3-0.6B", "tensorParallelSize": 1,
             "nodes": ["spark-b"], "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
             "vllmArgs": ["--gpu-memory-utilization", "0.2"]},
        ],
    }


def problems(mutate: Any) -> list[str]:
    raw = two_models()
    mutate(raw)
    with pytest.raises(SpecError) as err:
        parse_spec(raw, "t", SECRETS)
    return err.value.problems


def test_each_model_is_a_view_of_its_own_nodes_settings_and_ports() -> None:
    spec = parse_spec(two_models(), "t", SECRETS)
    assert spec.several
    big, small = spec.views()
    assert (big.model_key, small.model_key) == ("big", "small")
    assert [n.name for n in big.nodes] == ["spark-a", "spark-b"]
    assert [n.name for n in small.nodes] == ["spark-b"]
    assert (big.world_size, small.world_size) == (2, 1)
    assert (big.served_name, small.served_name) == ("qwen-122b", "Qwen/Qwen3-0.6B")
    # ports: the stack's port is the gateway's; each model's default follows it by index
    assert (spec.port, big.port, small.port) == (8000, 8001, 8002)
    assert (big.master_port, small.master_port) == (29502, 29503)
    # the stack's env under each model's own
    assert small.user_env == {"NCCL_DEBUG": "WARN", "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert big.user_env == {"NCCL_DEBUG": "WARN"}
    assert small.vllm_args == ("--gpu-memory-utilization", "0.2")
    # what the models share stays the stack's
    assert small.image == spec.image and small.stack == spec.stack


def test_a_stack_without_models_is_its_own_one_view() -> None:
    raw = two_models()
    del raw["models"], raw["gateway"]
    raw.update(model="Qwen/Qwen3-0.6B", tensorParallelSize=2)
    spec = parse_spec(raw, "t", SECRETS)
    assert not spec.several and spec.views() == [spec] and spec.model_key is None


def test_models_arrive_as_pulumi_config_json() -> None:
    import json
    flat = {f"spark-vllm:{k}": v if isinstance(v, str) else json.dumps(v)
            for k, v in two_models().items()}
    raw, _ = decode_config(flat)
    assert [v.model_key for v in parse_spec(raw, "t", SECRETS).views()] == ["big", "small"]


REFUSALS = [
    ("top-level model with models", lambda r: r.update(model="x/y"),
     "model: with models, each model sets its own (models[].model)"),
    ("top-level vllmArgs with models", lambda r: r.update(vllmArgs=["--enforce-eager"]),
     "vllmArgs: with models, each model sets its own"),
    ("ray backend", lambda r: r.update(backend="ray"),
     "backend: several models are served on backend native only"),
    ("no gateway image", lambda r: r.pop("gateway"), "gateway.image: required with models"),
    ("empty list", lambda r: r.update(models=[]), "models: an empty list"),
    ("name twice", lambda r: r["models"][1].update(name="big"),
     "models[1].name: 'big' already used by models[0]"),
    ("name shape", lambda r: r["models"][1].update(name="Small_1"),
     "models[1].name: 'Small_1' must be 1-20 of [a-z0-9-]"),
    ("served name twice", lambda r: r["models"][1].update(servedModelName="qwen-122b"),
     "models[1].servedModelName: 'qwen-122b' is also models[0]'s"),
    ("unknown node", lambda r: r["models"][1].update(nodes=["spark-c"]),
     "models[1].nodes[0]: 'spark-c' is not a node (spark-a, spark-b)"),
    ("node twice", lambda r: r["models"][0].update(nodes=["spark-a", "spark-a"]),
     "models[0].nodes[1]: 'spark-a' listed twice"),
    ("layout against its nodes", lambda r: r["models"][1].update(tensorParallelSize=2),
     "models[1].tensorParallelSize: tensorParallelSize × pipelineParallelSize = 2 × 1 = 2 must "
     "equal the GPUs of its nodes (1)"),
    ("owned flag in a model's args", lambda r: r["models"][0]["vllmArgs"].append("--port=9"),
     "models[0].vllmArgs[2]: --port is set by the program from port"),
    ("owned env in a model's env", lambda r: r["models"][1]["env"].update(VLLM_HOST_IP="1.2.3.4"),
     "models[1].env.VLLM_HOST_IP: set by the program"),
    ("a model's port is the gateway's", lambda r: r["models"][0].update(port=8000),
     "models[0].port: 8000 on spark-a is already the gateway (port)'s"),
    ("two models' ports on one node", lambda r: r["models"][1].update(port=8001, nodes=["spark-a"]),
     "models[1].port: 8001 on spark-a is already models[0] (big) port's"),
    ("unknown key in a model", lambda r: r["models"][0].update(tp=2),
     "models[0].tp: unknown key (a typo?)"),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in REFUSALS],
                         ids=[n for n, _, _ in REFUSALS])
def test_refusals_name_the_field(mutate: Any, expected: str) -> None:
    found = problems(mutate)
    assert any(p.startswith(expected) for p in found), found


def test_two_models_on_distinct_nodes_may_share_a_port() -> None:
    raw = two_models()
    raw["models"][0].update(nodes=["spark-a"], tensorParallelSize=1, port=8100)
    raw["models"][1].update(port=8100)
    assert parse_spec(raw, "t", SECRETS).views()[1].port == 8100


def test_every_problem_at_once() -> None:
    def mutate(r: dict[str, Any]) -> None:
        r.update(backend="ray", model="x/y")
        r["models"][1].update(nodes=["nope"])
    found = problems(mutate)
    assert {p.split(":")[0] for p in found} >= {"backend", "model", "models[1].nodes[0]"}


def test_without_models_model_and_tp_are_still_required() -> None:
    raw = two_models()
    del raw["models"]
    found = problems(lambda r: (r.pop("models"), r.pop("gateway")))
    assert any(p.startswith("model: required") for p in found), found
    assert any(p.startswith("tensorParallelSize: required") for p in found), found
    assert raw  # the mutation above worked on its own copy


def test_the_models_example_parses_and_documents_every_key() -> None:
    text = (ROOT / "spark_vllm" / "template" / "stack.models.example.yaml").read_text()
    doc = yaml.safe_load(text)["config"]
    raw = {k.split(":", 1)[1]: v for k, v in doc.items()}
    lower = {n["name"]: n["name"].lower().replace("_", "-") for n in raw["nodes"]}
    for i, node in enumerate(raw["nodes"]):
        node.update(name=lower[node["name"]], host=f"10.0.0.{i + 1}", hostKey=TEST_HOST_KEY,
                    fabricIp=f"192.168.0.{i + 1}", fabricInterface="enp1s0f1np1")
    for m in raw["models"]:
        m["model"] = "org/" + m["name"]
        m["nodes"] = [lower[n] for n in m["nodes"]]
    raw["gateway"]["image"] = "ghcr.io/berriai/litellm:v1.105.7"
    spec = parse_spec(raw, "t", SECRETS)
    from pydantic.alias_generators import to_camel

    from spark_vllm.components.spec_models import GatewaySettings, ServedModel
    assert set(raw["models"][0]) == {to_camel(f) for f in ServedModel.model_fields}
    assert set(raw["gateway"]) == {to_camel(f) for f in GatewaySettings.model_fields}
    assert [v.model_key for v in spec.views()] == ["big", "small"]
