"""The stacks committed in stacks/ (the seeds' two Sparks, a four-Spark layout) as the program
meets them: each file passes the program's own spec validation with the config as Pulumi hands
it over, holds no secret, and previews under Pulumi mocks, through the same entry point as
`__main__.py`, with stand-in secrets this test supplies."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_vllm.components.secret_check import SECRET_KEYS
from spark_vllm.components.spec import ClusterSpec, SpecError, decode_config, parse_spec
from tests.unit.harness import API_KEY, HF_TOKEN, SECRET_SIG, pinned, run_main, unwrap

ROOT = Path(__file__).resolve().parents[2]
STACKS = ROOT / "stacks"
# written by the lab and the benchmarks, ignored by git (.gitignore): not the committed ones
GENERATED = ("Pulumi.lab.yaml", "Pulumi.lab[2-9].yaml", "Pulumi.bench*.yaml")
COMMITTED = sorted(p for p in STACKS.glob("Pulumi.*.yaml")
                   if not any(fnmatch.fnmatch(p.name, g) for g in GENERATED))
SSH_KEY = (ROOT / "tests" / "fixtures" / "keys" / "clear_ed25519").read_text()  # test-only


def stack_name(path: Path) -> str:
    return path.name.removeprefix("Pulumi.").removesuffix(".yaml")


def flat_config(path: Path, pin: bool = True) -> dict[str, str]:
    """The stack file's config the way Pulumi hands it to a program: structured values as JSON
    text, scalars as their text. `pin`: with a test host key in each node, as a site pins its
    nodes' own (the committed files cannot know them)."""
    doc = yaml.safe_load(path.read_text())["config"]
    if pin:
        doc["spark-vllm:nodes"] = pinned(doc["spark-vllm:nodes"])
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in doc.items()}


def spec_of(path: Path) -> ClusterSpec:
    raw, secrets = decode_config(flat_config(path))
    assert secrets == frozenset()  # no secret in the committed file
    # the deploy key is set per stack (`pulumi config set --secret`); here: said present
    return parse_spec(raw, stack_name(path), secrets | {"sshPrivateKey"})


def test_the_seeds_stacks_are_committed() -> None:
    assert {"spark-duo", "spark-quad"} <= {stack_name(p) for p in COMMITTED}


@pytest.mark.parametrize("path", COMMITTED, ids=stack_name)
def test_a_committed_stack_passes_the_spec_and_holds_no_secret(path: Path) -> None:
    spec = spec_of(path)
    assert spec.tensor_parallel_size * spec.pipeline_parallel_size == spec.world_size
    # one identity per node: the fabric address, on the named interface, with its HCA
    assert all(n.fabric_ip and n.fabric_interface and n.ib_hca for n in spec.nodes)
    text = path.read_text()
    doc = yaml.safe_load(text)
    # no stack's salt (`pulumi stack init` writes one where it is used) and no encrypted value
    assert set(doc) == {"config"} and '"secure"' not in json.dumps(doc)
    for key in SECRET_KEYS:
        assert f"spark-vllm:{key}" not in doc["config"], key
        # the comments say how to set it, encrypted
        assert f"--secret spark-vllm:{key}" in text, key


@pytest.mark.parametrize("path", COMMITTED, ids=stack_name)
def test_a_committed_stack_as_it_is_asks_for_each_nodes_host_key_and_says_how(
        path: Path) -> None:
    """The examples cannot hold a site's host keys: as committed, each node is refused by name
    with the ssh-keyscan that prints its key, and for nothing else."""
    raw, secrets = decode_config(flat_config(path, pin=False))
    with pytest.raises(SpecError) as err:
        parse_spec(raw, stack_name(path), secrets | {"sshPrivateKey"})
    nodes = raw["nodes"]
    assert len(err.value.problems) == len(nodes)
    for i, (node, problem) in enumerate(zip(nodes, err.value.problems, strict=True)):
        assert problem.startswith(f"nodes[{i}].hostKey: required: {node['name']} ")
        assert f"`ssh-keyscan -t ed25519 {node['host']}`" in problem
    assert "ssh-keyscan -t ed25519" in path.read_text()  # the file says so too


def test_spark_duo_is_the_seeds_deployment() -> None:
    spec = spec_of(STACKS / "Pulumi.spark-duo.yaml")
    assert [(n.name, n.host, n.identity_ip, n.user) for n in spec.nodes] == [
        ("spark-a", "10.1.230.180", "192.168.200.12", "aurora"),
        ("spark-b", "10.1.230.181", "192.168.200.13", "aurora")]
    assert {(n.fabric_interface, n.ib_hca) for n in spec.nodes} == {("enp1s0f1np1", "rocep1s0f1")}
    assert (spec.image, spec.model) == ("hellohal2064/vllm-qwen3.5-gb10:latest",
                                        "Qwen/Qwen3.5-122B-A10B-FP8")
    assert (spec.tensor_parallel_size, spec.pipeline_parallel_size) == (2, 1)


def test_spark_quad_is_four_sparks_at_tp2_pp2() -> None:
    spec = spec_of(STACKS / "Pulumi.spark-quad.yaml")
    assert [n.name for n in spec.nodes] == ["spark-a", "spark-b", "spark-c", "spark-d"]
    assert len({n.identity_ip for n in spec.nodes}) == 4
    assert (spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.world_size) == (2, 2, 4)


def _strip_secrets(value: Any) -> Any:
    """The registered inputs with every secret-wrapped value left out."""
    if isinstance(value, dict) and value.get(SECRET_SIG):
        return "[secret]"
    if isinstance(value, dict):
        return {k: _strip_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_secrets(v) for v in value]
    return value


def preview(path: Path) -> tuple[int | None, list[str], dict[str, Any]]:
    """The program as `__main__.py` runs it, in a preview under mocks, on the stack file's
    config and stand-in secrets: (exit code, errors logged, registered inputs by name)."""
    from google.protobuf.json_format import MessageToDict

    secrets = {"spark-vllm:sshPrivateKey": SSH_KEY, "spark-vllm:hfToken": HF_TOKEN,
               "spark-vllm:apiKey": API_KEY}
    code, errors, monitor = run_main({**flat_config(path), **secrets}, list(secrets),
                                     stack=stack_name(path))
    return code, errors, {name: MessageToDict(req.object)
                          for name, req in monitor.requests.items()}


@pytest.mark.parametrize("path", COMMITTED, ids=stack_name)
def test_a_committed_stack_previews_under_mocks(path: Path) -> None:
    spec = spec_of(path)
    code, errors, inputs = preview(path)
    assert (code, errors) == (None, [])
    head, workers = spec.nodes[0].name, [n.name for n in spec.nodes[1:]]
    assert {f"{n.name}-preflight" for n in spec.nodes} | {f"ray-worker-{w}" for w in workers} | {
        "image-check", "memory-check", "ray-head", "ray-gate", "vllm-serve"} <= set(inputs)
    # vLLM on the head, at the stack's layout, each worker on its fabric identity
    facts = unwrap(inputs["vllm-serve"]["triggers"])[0]
    assert (facts["node"], facts["identityIp"]) == (head, spec.nodes[0].fabric_ip)
    assert (facts["tensorParallelSize"], facts["pipelineParallelSize"]) == (
        spec.tensor_parallel_size, spec.pipeline_parallel_size)
    for node in spec.nodes[1:]:
        worker = unwrap(inputs[f"ray-worker-{node.name}"]["triggers"])[0]
        assert worker["identityIp"] == node.fabric_ip
    # the stand-in secrets reach no input outside a secret
    seen = json.dumps(_strip_secrets(inputs))
    assert API_KEY not in seen and HF_TOKEN not in seen and "PRIVATE KEY" not in seen
