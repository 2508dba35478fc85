"""The resource graph under mocks: names, replace options, the input-linked chain, per-node
env, secrets. Mocks cannot show the engine's ordering; tests/integration does, for real."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import patch

import pulumi
import pytest

from spark_vllm.components.program import BAIL_EXIT_CODE, Secrets
from spark_vllm.components.render import commands as c
from spark_vllm.components.render.backends import ray
from tests.unit.harness import (
    API_KEY,
    CMD,
    HF_TOKEN,
    IMAGE_ID,
    SECRET_SIG,
    SSH_KEY,
    TEST_HOST_KEY,
    RecordingMonitor,
    Registered,
    lab_nodes,
    pinned,
    run,
    spec_from,
)
from tests.unit.harness import (
    run_main as harness_run_main,
)


def graph(n: int, **top: object) -> dict[str, Registered]:
    if n == 4 and "pipelineParallelSize" not in top:
        top.update(tensorParallelSize=2, pipelineParallelSize=2)
    return run(spec_from(lab_nodes(n), **top))


CONTAINERS = ("ray-head", "ray-gate", "vllm-serve")
KEY = "vllm-api-key"  # the API key's file on the head (node.py api_key_command)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_graph_shape(n: int) -> None:
    g = graph(n)
    commands = sorted(name for name, r in g.items() if r.type == CMD)
    expected = sorted([f"node-{i}-preflight" for i in range(1, n + 1)]
                      + [f"ray-worker-node-{i}" for i in range(2, n + 1)] + list(CONTAINERS)
                      + ["image-check", "memory-check", "model-stage", KEY]
                      + [f"model-copy-node-{i}" for i in range(2, n + 1)]
                      + (["fabric-gate"] if n > 1 else []))
    assert commands == expected
    assert {g[f"node-{i}"].type for i in range(1, n + 1)} == {"spark-vllm:node:SparkNode"}
    assert g["ray"].type == "spark-vllm:ray:RayCluster"
    assert g["vllm"].type == "spark-vllm:vllm:VllmService"


CONTAINER_ROLES = {"ray-head": c.HEAD, "ray-worker-node-2": c.WORKER, "vllm-serve": c.VLLM}


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_command_is_replaced_on_its_triggers_only(n: int) -> None:
    """What a command is lives in its triggers; any other change is an update. A container's
    update keeps it (commands.keep_script); a check has none, so it runs again."""
    for name, r in graph(n).items():
        if r.type == CMD:
            assert r.delete_before_replace, name
            assert set(r.replace_on_changes) == {"triggers", "triggers[*]"}, name
            role = CONTAINER_ROLES.get(name) or (c.WORKER if name.startswith("ray-worker-")
                                                 else None)
            if role:
                assert "docker inspect --format '{{.Id}}'" in r.plain("update"), name
                assert c.container_name(spec_from(lab_nodes(n)), role) in r.plain("update")
            else:
                assert r.plain("update") is None, name


def test_the_memory_check_runs_after_the_staging_before_any_container_and_restarts_nothing(
        ) -> None:
    g = graph(2)
    check = g["memory-check"]
    # the model's config is read on the head: the copies to other nodes run beside it
    assert {g["model-stage"].urn, g["node-1-preflight"].urn,
            g["node-2-preflight"].urn} <= set(check.dependencies)
    assert check.urn in g["ray-head"].dependencies
    for name in ("ray-head", "ray-worker-node-2", "ray-gate", "vllm-serve"):
        deps = {u for urns in g[name].property_dependencies.values() for u in urns}
        assert check.urn not in deps, name  # in no container's triggers
    # it re-runs when what it estimates changes: the layout and vLLM's memory flags
    facts = check.plain("triggers")[0]
    assert (facts["tp"], facts["utilization"], facts["model"]) == (2, 0.9, "org/model")


def test_no_command_ignores_a_change() -> None:
    """An ignored input is reused by a later replacement (pulumi/pulumi step_generator.go,
    processIgnoreChanges runs before the diff): an old SSH key or an old program would run
    then. A new gate program is an update (the gate runs again, its id stays)."""
    ignored = {name: r.ignore_changes for name, r in graph(2).items() if r.type == CMD}
    assert set(map(tuple, ignored.values())) == {()}


@pytest.mark.parametrize("n", [2, 4])
def test_chain_is_linked_through_trigger_inputs(n: int) -> None:
    g = graph(n)
    head = g["ray-head"].urn
    workers = [g[f"ray-worker-node-{i}"].urn for i in range(2, n + 1)]
    for i in range(2, n + 1):
        w = g[f"ray-worker-node-{i}"]
        live = g[f"ray-worker-node-{i}-liveness"].urn
        assert sorted(w.property_dependencies["triggers"]) == sorted([head, live])
        # the head command's resource id: kept by an update, new on a replacement
        assert w.plain("triggers")[1]["rayHead"] == "ray-head-id"
    assert sorted(g["ray-gate"].property_dependencies["triggers"]) == sorted([head, *workers])
    serve_deps = g["vllm-serve"].property_dependencies["triggers"]
    assert g["ray-gate"].urn in serve_deps and head in serve_deps
    assert set(workers) <= set(serve_deps)
    # preflights gate the head by ordering only (a preflight rerun must not restart Ray); its
    # one input-linked dependency is its own liveness companion
    assert g["ray-head"].property_dependencies["triggers"] == [g["ray-head-liveness"].urn]
    assert {g[f"node-{i}-preflight"].urn for i in range(1, n + 1)} <= set(g["ray-head"].dependencies)


def test_triggers_carry_readable_facts() -> None:
    """A diff names the cause in the user's terms: the env as a map, the identity, the image,
    vLLM's args; then what the container runs on, by name (invariant 3)."""
    g = graph(2, env={"NCCL_DEBUG": "WARN"}, vllmArgs=["--max-model-len", "8192"])
    head, links = g["ray-head"].plain("triggers")
    spec = spec_from(lab_nodes(2), env={"NCCL_DEBUG": "WARN"})
    assert head == {"node": "node-1", "host": "10.231.0.11", "user": "root",
                    "identityIp": "192.168.231.11",
                    "image": "vllm/image:1", "rayPort": 6379,
                    "compileCache": "/root/.cache/spark-vllm-compile/test",
                    "env": c.node_env(spec, spec.head),
                    "argv": ray.head_run_argv(spec)}
    assert head["env"]["NCCL_DEBUG"] == "WARN" and head["env"]["VLLM_HOST_IP"] == "192.168.231.11"
    assert links == {"liveness": "ray-head-liveness-id"}
    worker, wlinks = g["ray-worker-node-2"].plain("triggers")
    assert (worker["node"], worker["identityIp"]) == ("node-2", "192.168.231.12")
    assert wlinks == {"rayHead": "ray-head-id", "liveness": "ray-worker-node-2-liveness-id"}
    vllm, vlinks = g["vllm-serve"].plain("triggers")
    assert vllm["vllmArgs"] == ["--max-model-len", "8192"]
    assert (vllm["servedModelName"], vllm["tensorParallelSize"], vllm["port"]) == (
        "org/model", 2, 8000)
    # the apiKey is in no container's triggers, not even as a digest: its rotation is an
    # update of its own command, which replaces nothing
    assert set(vlinks) == {"gate", "rayHead", "rayWorker@node-2", "liveness"}
    assert "apiKey" not in json.dumps(g["vllm-serve"].inputs["triggers"])
    key_facts = g[KEY].plain("triggers")
    assert key_facts == [{"node": "node-1", "host": "10.231.0.11", "user": "root",
                          "file": "~/.spark-vllm/test/api-key/key"}]
    assert g[KEY].urn in g["vllm-serve"].dependencies  # written before vLLM starts
    # the key's directory, read-only, and where the middleware finds it
    assert vllm["argv"][vllm["argv"].index("~/.spark-vllm/test/api-key:/spark-vllm-key:ro") - 1] \
        == "--volume"
    assert "SPARK_VLLM_API_KEY_FILE=/spark-vllm-key/key" in vllm["argv"]
    for name in ("ray-head", "ray-worker-node-2"):  # no other container sees it
        assert "spark-vllm-key" not in json.dumps(g[name].plain("triggers"))
    # the files vLLM runs besides the image, by content; not the scripts around them
    assert set(vllm["files"]) == {"spark_vllm_auth.py", "ray_non_carry_over_env_vars.json"}
    assert vllm["argv"] == ray.vllm_run_argv(spec_from(lab_nodes(2), env={"NCCL_DEBUG": "WARN"},
                                                       vllmArgs=["--max-model-len", "8192"]))
    assert g["ray-gate"].plain("triggers") == [{"rayHead": "ray-head-id",
                                               "rayWorker@node-2": "ray-worker-node-2-id"}]


def test_env_change_changes_every_container_trigger_and_nothing_else() -> None:
    a, b = graph(2), graph(2, env={"NCCL_DEBUG": "INFO"})
    changed = {name for name, r in a.items()
               if r.type == CMD and r.plain("triggers") != b[name].plain("triggers")}
    assert changed == {"ray-head", "ray-worker-node-2", "vllm-serve"}
    assert a["node-1-preflight"].plain("create") == b["node-1-preflight"].plain("create")


def test_per_node_env_comes_from_each_node() -> None:
    g = graph(4)
    for i in range(1, 5):
        name = "ray-head" if i == 1 else f"ray-worker-node-{i}"
        create = g[name].plain("create")
        assert f"VLLM_HOST_IP=192.168.231.{10 + i}" in create
        assert f"NCCL_SOCKET_IFNAME=enp{i}s0f1np1" in create
        assert f"NCCL_IB_HCA=rocep{i}s0f1" in create
        others = [j for j in range(1, 5) if j != i]
        assert not any(f"enp{j}s0f1np1" in create or f"192.168.231.{10 + j} " in create
                       for j in others if j != 1), name
        assert f"--node-ip-address=192.168.231.{10 + i}" in create
        if i > 1:
            assert "--address=192.168.231.11:6379" in create


def test_four_nodes_tp2_pp2_serve_args() -> None:
    create = graph(4)["vllm-serve"].plain("create")
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 2" in create


def _leaks(value: object, secrets: list[str], path: str = "") -> list[str]:
    if isinstance(value, dict):
        if value.get(SECRET_SIG):
            return []  # wrapped as a secret: stored encrypted, shown as [secret]
        return [x for k, v in value.items() for x in _leaks(v, secrets, f"{path}.{k}")]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _leaks(v, secrets, f"{path}[{i}]")]
    return [f"{path} holds a secret" for s in secrets if isinstance(value, str) and s in value]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_no_secret_value_in_any_plain_input(n: int) -> None:
    g = graph(n)
    secrets = [SSH_KEY, "secret-ssh-key-material", HF_TOKEN, API_KEY]
    leaks = [f"{name}{leak}" for name, r in g.items() for leak in _leaks(r.inputs, secrets)]
    assert leaks == []
    # and the secrets do reach the nodes, wrapped: key in connection, tokens in stdin
    serve = g["vllm-serve"]
    assert serve.inputs["stdin"][SECRET_SIG]
    assert "VLLM_API_KEY=" not in serve.plain("stdin") and API_KEY not in serve.plain("stdin")
    assert g[KEY].inputs["stdin"][SECRET_SIG] and g[KEY].plain("stdin") == API_KEY
    assert g["ray-head"].plain("connection")["privateKey"] == SSH_KEY
    assert g["ray-head"].inputs["connection"][SECRET_SIG]


def test_outputs_name_every_node_and_container() -> None:
    captured: dict[str, object] = {}
    from spark_vllm.components import program

    real_deploy = program.deploy

    def spy(spec, secrets):  # type: ignore[no-untyped-def]
        out = real_deploy(spec, secrets)
        pulumi.Output.all(**out).apply(lambda v: captured.update(v))
        return out

    program.deploy = spy
    try:
        import tests.unit.harness as h
        h.deploy = spy
        run(spec_from(lab_nodes(2)))
    finally:
        program.deploy = real_deploy
        h.deploy = real_deploy
    assert captured["endpoint"] == "http://10.231.0.11:8000/v1"
    assert captured["identityIps"] == {"node-1": "192.168.231.11", "node-2": "192.168.231.12"}
    assert captured["containerIds"] == {"node-1/ray-head": "cid-ray-head",
                                        "node-2/ray-worker": "cid-ray-worker-node-2",
                                        "node-1/vllm": "cid-vllm-serve"}
    assert captured["servedModelName"] == "org/model"
    assert captured["preflight"]["node-2"] == {"node": "node-2", "image_id": IMAGE_ID}


GOOD_CONFIG = {
    "spark-vllm:nodes": json.dumps(pinned([{"name": "a", "host": "10.0.0.1"},
                                           {"name": "b", "host": "10.0.0.2"}])),
    "spark-vllm:image": "img", "spark-vllm:model": "org/m", "spark-vllm:tensorParallelSize": "2",
    # a real (test-only, passphrase-less) key: the program checks the key's form
    "spark-vllm:sshPrivateKey": (Path(__file__).resolve().parents[1] / "fixtures" / "keys"
                                 / "clear_ed25519").read_text(),
}


def run_main(config: dict[str, str]) -> tuple[int | None, list[str], RecordingMonitor]:
    """The program as `__main__.py` runs it, under mocks: (exit code, errors logged, monitor)."""
    return harness_run_main(config, secret_keys=["spark-vllm:sshPrivateKey"])


def test_bad_config_is_one_error_and_no_resource() -> None:
    """Every problem in one error naming the fields, exit 32 ("already reported"), and the
    program stops before registering anything: no command can reach a node."""
    bad = {**GOOD_CONFIG,
           "spark-vllm:nodes": json.dumps([{"name": "a", "host": "10.0.0.1",
                                            "fabricIp": "10.9.0.1"}]),
           "spark-vllm:env": json.dumps({"VLLM_HOST_IP": "x"})}
    del bad["spark-vllm:sshPrivateKey"]
    code, errors, monitor = run_main(bad)
    assert code == BAIL_EXIT_CODE
    assert len(errors) == 1
    for expected in ("sshPrivateKey: required", "nodes[0].fabricInterface: required",
                     "tensorParallelSize: ", "env.VLLM_HOST_IP: set by the program"):
        assert expected in errors[0]
    assert [r.type for r in monitor.requests.values() if r.type != "pulumi:pulumi:Stack"] == []


def test_the_same_program_with_a_good_config_registers_the_graph() -> None:
    """The counterpart of the test above: the entry point does register resources."""
    code, errors, monitor = run_main(GOOD_CONFIG)
    assert (code, errors) == (None, [])
    assert {"a-preflight", "ray-head", "ray-worker-b", "ray-gate",
            "vllm-serve"} <= set(monitor.requests)


def test_a_node_without_a_host_key_stops_the_program_before_any_resource() -> None:
    config = {**GOOD_CONFIG, "spark-vllm:nodes": json.dumps(
        [{"name": "a", "host": "10.0.0.1", "hostKey": TEST_HOST_KEY},
         {"name": "b", "host": "10.0.0.2"}])}
    code, errors, monitor = run_main(config)
    assert code == BAIL_EXIT_CODE and not monitor.requests
    (error,) = errors
    assert "nodes[1].hostKey: required: b has no pinned host key" in error
    assert "`ssh-keyscan -t ed25519 10.0.0.2`" in error


def test_the_labs_opt_out_is_said_on_every_run_naming_the_unpinned_nodes() -> None:
    config = {**GOOD_CONFIG, "spark-vllm:insecureAcceptAnyHostKey": "true",
              "spark-vllm:nodes": json.dumps([{"name": "a", "host": "10.0.0.1"},
                                              {"name": "b", "host": "10.0.0.2",
                                               "hostKey": TEST_HOST_KEY}])}
    warnings: list[str] = []
    with patch.object(pulumi.log, "warn", side_effect=lambda m, *a, **k: warnings.append(m)):
        code, errors, monitor = run_main(config)
    assert (code, errors) == (None, []) and "ray-head" in monitor.requests
    (warning,) = warnings
    assert warning.startswith("insecureAcceptAnyHostKey is set: a accepts any host key")


def test_secrets_optional() -> None:
    g = run(spec_from(lab_nodes(2)), Secrets(ssh_private_key=pulumi.Output.secret(SSH_KEY)))
    env_part = g["vllm-serve"].plain("stdin").split(c.PROBE_SEPARATOR)[0]
    assert "VLLM_API_KEY" not in env_part and "HF_TOKEN" not in env_part
    assert "HF_TOKEN" not in g["ray-head"].plain("stdin")


DYN = "pulumi-python:dynamic:Resource"


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_container_and_only_containers_have_a_liveness_companion(n: int) -> None:
    """A refresh sees a dead container through its companion (invariant 7); the companion's
    id is in the container command's triggers, so replacing it replaces the container."""
    g = graph(n)
    containers = {"ray-head": c.HEAD, "vllm-serve": c.VLLM,
                  **{f"ray-worker-node-{i}": c.WORKER for i in range(2, n + 1)}}
    assert sorted(name for name, r in g.items() if r.type == DYN) == sorted(
        [*(f"{name}-liveness" for name in containers), "model-stage-liveness",
         *(f"model-copy-node-{i}-liveness" for i in range(2, n + 1)),
         *(["fabric-check"] if n > 1 else [])])  # the fabric check's (fabric_check.py)
    for name, role in containers.items():
        live = g[f"{name}-liveness"]
        assert live.plain("triggers") is None
        assert g[name].plain("triggers")[-1]["liveness"] == f"{name}-liveness-id"
        assert live.plain("container") == f"spark-vllm-test-{role}"
        node = "node-1" if role != c.WORKER else name.removeprefix("ray-worker-")
        assert live.plain("node") == node
        assert SECRET_SIG in json.dumps(live.inputs["privateKey"])  # the key stays a secret
        # only vLLM is asked to serve, as a client would: HOST PORT NAME, then the canary's
        # bound and the wedge window (defaults)
        assert live.plain("serving") == (["127.0.0.1", "8000", "org/model", "30", "60"]
                                         if role == c.VLLM else [])
    assert "ray-gate-liveness" not in g


def test_a_registration_the_engine_cancels_ends_the_program_quietly() -> None:
    """When a step fails the engine cancels the registrations still waiting; one can return
    (gRPC CANCELLED) before the language host's SIGINT. The program then exits 32 ("error
    already shown") without a word, instead of the SDK's "unhandled exception" traceback;
    every other gRPC error is the SDK's own. Run in a child: the handler calls os._exit."""
    child = """
import grpc, sys
from pulumi.runtime import resource
from spark_vllm.components.program import exit_quietly_when_interrupted

class Err(grpc.RpcError):
    def __init__(self, code): self._code = code
    def code(self): return self._code
    def details(self): return "context canceled"

exit_quietly_when_interrupted()
try:
    resource.handle_grpc_error(Err(grpc.StatusCode.UNAVAILABLE))
except Exception as e:
    print("raised:", e, flush=True)
resource.handle_grpc_error(Err(grpc.StatusCode.CANCELLED))
print("not reached", flush=True)
"""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == BAIL_EXIT_CODE, out
    assert out.stdout == "raised: Resource monitor has terminated, shutting down\n"
    assert out.stderr == ""


def test_new_script_text_changes_no_trigger_and_a_new_middleware_only_the_api_servers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade of spark-vllm that rewords the scripts around the containers (their logs,
    the readiness probe) changes `create` and `stdin`, an update; only what a container runs
    (here the API-key middleware, by content) is in its triggers, and replaces it."""
    before = graph(2)
    real = c.script_text
    def prelude(spec: object, node: c.NodeSpec, what: str) -> list[str]:
        return ["set -eu", 'PATH="$PATH:/usr/sbin:/sbin"', f"node={node.name}",
                f'log() {{ echo "[spark-vllm] {what} on $node: $*" >&2; }}']
    monkeypatch.setattr(c, "prelude", prelude)
    monkeypatch.setattr(ray, "prelude", prelude)
    monkeypatch.setattr(c, "script_text", lambda name: real(name) + (
        "# reworded\n" if name == "vllm_probe.py" else ""))
    reworded = graph(2)
    containers = ("ray-head", "ray-worker-node-2", "ray-gate", "vllm-serve")
    for name in containers:
        assert reworded[name].plain("create") != before[name].plain("create"), name
        assert reworded[name].plain("triggers") == before[name].plain("triggers"), name
    assert reworded["vllm-serve"].plain("stdin") != before["vllm-serve"].plain("stdin")
    monkeypatch.setattr(c, "script_text", lambda name: real(name) + (
        "# a fix\n" if name == "spark_vllm_auth.py" else ""))
    fixed = graph(2)
    changed = {n for n in containers
               if fixed[n].plain("triggers") != before[n].plain("triggers")}
    assert changed == {"vllm-serve"}
    assert fixed["vllm-serve"].plain("triggers")[0]["files"]["spark_vllm_auth.py"] != \
        before["vllm-serve"].plain("triggers")[0]["files"]["spark_vllm_auth.py"]


@pytest.mark.parametrize("backend", ["ray", "native"])
def test_an_api_key_rotation_changes_only_the_key_files_stdin(backend: str) -> None:
    """A new apiKey is an update of the key's own command (its stdin, a secret): no command's
    triggers change, so nothing is replaced; no container command's inputs change at all, so
    no container is even updated (vLLM reads no key: the middleware reads the file)."""
    from tests.unit.harness import HF_TOKEN, unwrap

    def with_key(key: str) -> dict[str, Registered]:
        return run(spec_from(lab_nodes(2), backend=backend), Secrets(
            ssh_private_key=pulumi.Output.secret(SSH_KEY), hf_token=pulumi.Output.secret(HF_TOKEN),
            api_key=pulumi.Output.secret(key)))

    old, new = with_key("sk-old-1"), with_key("sk-new-2")
    assert {n for n, r in old.items() if r.type == CMD} == {n for n, r in new.items()
                                                              if r.type == CMD}
    changed = {name for name, r in old.items() if r.type == CMD
               and json.dumps(unwrap(r.inputs), sort_keys=True)
               != json.dumps(unwrap(new[name].inputs), sort_keys=True)}
    assert changed == {KEY}
    assert (old[KEY].plain("stdin"), new[KEY].plain("stdin")) == ("sk-old-1", "sk-new-2")
    assert old[KEY].plain("triggers") == new[KEY].plain("triggers")


def test_without_an_api_key_there_is_no_key_file_nor_mount() -> None:
    import dataclasses

    spec = dataclasses.replace(spec_from(lab_nodes(2)), secrets_set=frozenset({"sshPrivateKey"}))
    g = run(spec, Secrets(ssh_private_key=pulumi.Output.secret(SSH_KEY)))
    assert KEY not in g
    assert not [w for w in g["vllm-serve"].plain("triggers")[0]["argv"] if "spark-vllm-key" in w
                or "SPARK_VLLM_API_KEY_FILE" in w]
