"""The fabric check in the graph (components/fabric_check.py): where it sits on both backends,
what its resource holds, when an `up` runs it again, how its verdict reaches the nodes' ranks
(the gate) and the stack's outputs. The script and the verdict have their own tests
(test_fabric_script.py, test_fabric_verdict.py; the CPU tier runs them with real torch)."""

from __future__ import annotations

import base64
import json
import pickletools
import subprocess
from typing import Any

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from spark_vllm.components import fabric_check as fc
from spark_vllm.components import ssh
from spark_vllm.components.render import fabric_commands as fabric
from tests.unit.harness import SSH_KEY, Registered, lab_nodes, run, spec_from
from tests.unit.test_fabric_verdict import reports

DYNAMIC = "pulumi-python:dynamic:Resource"


def graph(n: int = 2, **top: Any) -> dict[str, Registered]:
    return run(spec_from(lab_nodes(n), **top))


def deps(r: Registered) -> set[str]:
    return set(r.dependencies)


def trigger_deps(r: Registered) -> set[str]:
    return {u for urns in r.property_dependencies.values() for u in urns}


# --- where it sits ---------------------------------------------------------------------------

def test_ray_backend_the_check_runs_before_the_copies_and_gates_every_container() -> None:
    g = graph(2)
    check, gate = g["fabric-check"], g["fabric-gate"]
    assert check.type == DYNAMIC
    # after the image check (it runs the serving image) and beside the head's staging, which
    # does not use the fabric: a cold up does not wait for one after the other
    assert {g["image-check"].urn, g["node-1-preflight"].urn, g["node-2-preflight"].urn
            } <= deps(check)
    assert g["model-stage"].urn not in deps(check)
    # before the memory check reads each node's free memory (the check's NCCL buffers would
    # read as used), which then runs beside the gate
    assert {check.urn, g["model-stage"].urn} <= deps(g["memory-check"])
    assert g["memory-check"].urn not in deps(check)
    assert check.urn in deps(gate)
    assert g["memory-check"].urn not in deps(gate)
    # every container waits for the verdict, so a refusal stops nothing that runs: a change
    # that replaces Ray replaces vLLM too, and Ray's old containers would go first
    for name in ("model-copy-node-2", "ray-head", "ray-worker-node-2", "vllm-api-key"):
        assert gate.urn in deps(g[name]), name  # (Ray's gate waits for Ray's containers)
        assert g["memory-check"].urn in deps(g[name]), name
    # the apiKey's file is written beside Ray's containers, not after Ray's gate
    assert g["ray-gate"].urn not in deps(g["vllm-api-key"])
    # in no container's triggers: a new verdict restarts nothing
    for name in ("ray-head", "ray-worker-node-2", "ray-gate", "vllm-serve"):
        assert not {gate.urn, check.urn} & trigger_deps(g[name]), name


def test_native_backend_every_rank_waits_for_the_verdict() -> None:
    g = graph(2, backend="native")
    gate = g["fabric-gate"]
    ranks = [n for n in g if (n.startswith("vllm-rank-") or n == "vllm-leader")
             and g[n].type == "command:remote:Command"]
    assert len(ranks) == 2
    for name in ranks:
        assert gate.urn in deps(g[name]), name
        assert gate.urn not in trigger_deps(g[name]), name


def test_one_node_has_no_fabric_to_check() -> None:
    g = graph(1)
    assert "fabric-check" not in g and "fabric-gate" not in g


def test_what_the_check_resource_holds() -> None:
    """Each node's command (the rendered node script: no secret in it), the key as a secret,
    and the triggers a reviewer reads in a diff."""
    spec = spec_from(lab_nodes(2))
    g = run(spec)
    check = g["fabric-check"]
    assert check.inputs["privateKey"] != SSH_KEY  # wrapped as a secret
    assert check.plain("privateKey") == SSH_KEY
    nodes = check.plain("nodes")
    assert [n["node"] for n in nodes] == ["node-1", "node-2"]
    assert nodes[1]["script"] == fabric.node_script(spec, spec.nodes[1])
    assert nodes[1]["hostKey"].startswith("ssh-ed25519 ")
    assert SSH_KEY not in json.dumps(nodes)
    assert check.plain("triggers") == [fabric.triggers(spec)]
    assert g["fabric-gate"].plain("triggers") == [{"check": "fabric"}]


def test_the_state_holds_a_reference_to_the_provider_not_its_code() -> None:
    blob = base64.b64decode(serialize_provider(fc._Provider()))
    strings = [arg for op, arg, _ in pickletools.genops(blob) if isinstance(arg, str)]
    assert "spark_vllm.components.fabric_check" in strings and "_Provider" in strings
    assert len(blob) < 200


# --- when it runs --------------------------------------------------------------------------

OLD = {"triggers": [{"image": "a", "settings": {}}], "nodes": [{"node": "n1", "host": "h"}],
       "privateKey": "k1", "outcome": "pass", "message": "ok", "pairs": [],
       "baseline": {"version": 1}, "checkedAt": "t0"}
NEW = {k: v for k, v in OLD.items() if k not in fc.RESULT_KEYS}


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """run_check's calls, each answering a pass whose baseline is the one it was given."""
    calls: list[dict[str, Any]] = []

    def fake(props: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
        calls.append({"props": props, "baseline": baseline})
        return {**props, "outcome": "pass", "message": "again", "pairs": [],
                "baseline": baseline or {"version": 1, "new": True}, "checkedAt": "t1"}

    monkeypatch.setattr(fc, "run_check", fake)
    return calls


def test_a_noop_up_runs_nothing() -> None:
    assert not fc._Provider().diff("id", OLD, NEW).changes


def test_a_changed_trigger_runs_it_again_against_the_baseline(measured: list) -> None:
    new = {**NEW, "triggers": [{"image": "b", "settings": {}}]}
    p = fc._Provider()
    d = p.diff("id", OLD, new)
    assert d.changes and not d.replaces  # an update: its id, and nothing downstream, stays
    out = p.update("id", OLD, new).outs or {}
    assert measured[0]["baseline"] == {"version": 1} and out["checkedAt"] == "t1"


def test_a_refused_run_runs_again_on_the_next_up(measured: list) -> None:
    """A refusal is no verdict to keep: the operator fixed the MTU, nothing in the config."""
    old = {**OLD, "outcome": "refuse"}
    p = fc._Provider()
    assert p.diff("id", old, NEW).changes
    assert (p.update("id", old, NEW).outs or {})["outcome"] == "pass" and len(measured) == 1


def test_a_new_key_or_address_is_stored_without_running_it(measured: list) -> None:
    p = fc._Provider()
    for key, value in (("privateKey", "k2"), ("nodes", [{"node": "n1", "host": "h2"}])):
        new = {**NEW, key: value}
        assert p.diff("id", OLD, new).changes, key
        out = p.update("id", OLD, new).outs or {}
        assert out[key] == value and out["checkedAt"] == "t0" and out["outcome"] == "pass"
    assert measured == []


# --- a run ---------------------------------------------------------------------------------

def props_for(n: int = 2, **fabric_check: Any) -> dict[str, Any]:
    spec = spec_from(lab_nodes(n), fabricCheck=fabric_check)
    return {**fc.inputs(spec), "privateKey": SSH_KEY}


def fake_ssh(monkeypatch: pytest.MonkeyPatch, answer: Any) -> list[tuple[ssh.Target, str]]:
    seen: list[tuple[ssh.Target, str]] = []

    def run_(t: ssh.Target, script: str, stdin: str = "", timeout: float = 60) -> Any:
        seen.append((t, stdin))
        return answer(t, script, timeout)

    monkeypatch.setattr(ssh, "run", run_)
    return seen


def test_every_node_runs_its_own_command_with_the_script_on_stdin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    by_node = {r["node"]: r for r in reports(nodes=("node-1", "node-2"), hca="rocep1s0f1")}

    def answer(t: ssh.Target, script: str, timeout: float) -> Any:
        assert f"node={t.node}" in script and timeout >= 90 + fabric.DOCKER_MARGIN_S
        return subprocess.CompletedProcess([], 0, json.dumps(by_node[t.node]) + "\n", "")

    seen = fake_ssh(monkeypatch, answer)
    out = fc.run_check(props_for(), None)
    assert sorted(t.node for t, _ in seen) == ["node-1", "node-2"]
    assert all(stdin == fabric.script() and t.private_key == SSH_KEY for t, stdin in seen)
    assert out["outcome"] == "pass" and out["baseline"]["pairs"]
    assert out["privateKey"] == SSH_KEY and out["checkedAt"].endswith("Z")


def test_a_node_ssh_cannot_reach_refuses_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(t: ssh.Target, script: str, timeout: float) -> Any:
        if t.node == "node-2":
            raise ssh.NodeUnreachableError(f"{t.where()}: Connection refused")
        return subprocess.CompletedProcess([], 0, "", "")

    fake_ssh(monkeypatch, answer)
    out = fc.run_check(props_for(), None)
    assert out["outcome"] == "refuse"
    assert "node-2" in out["message"] and "Connection refused" in out["message"]


@pytest.mark.parametrize(("on", "outcome"), [("refuse", "refuse"), ("warn", "warn"),
                                            ("skip", "skip")])
def test_an_image_without_torch_decides_by_on_unavailable(
        monkeypatch: pytest.MonkeyPatch, on: str, outcome: str) -> None:
    """The lab's image: never a silent pass."""
    def answer(t: ssh.Target, script: str, timeout: float) -> Any:
        line = {"check": "fabric", "node": t.node, "status": "unavailable",
                "reason": "no torch in the image (No module named 'torch')"}
        return subprocess.CompletedProcess([], 0, json.dumps(line) + "\n",
                                           "the check ended with exit 4")

    fake_ssh(monkeypatch, answer)
    out = fc.run_check(props_for(onUnavailable=on), None)
    assert out["outcome"] == outcome and "no torch" in out["message"]


# --- the gate ------------------------------------------------------------------------------

@pytest.mark.parametrize(("outcome", "rc"), [("pass", 0), ("skip", 0),
                                            ("refuse", 1)])
def test_the_gate_fails_only_on_a_refusal_with_the_table(outcome: str, rc: int) -> None:
    spec = spec_from(lab_nodes(2))
    message = "fabric check: below its floors\n  pair  8 KiB  …\nWhat to check: MTU 'it's'"
    proc = subprocess.run(["sh", "-c", fc.gate_script(spec, outcome, message)],
                          capture_output=True, text=True, timeout=10)
    assert proc.returncode == rc
    assert message in (proc.stderr if rc else proc.stdout)


def test_settings_come_back_from_the_engine_as_floats() -> None:
    """protobuf's Value has no int: the provider reads 90.0 as the timeout 90."""
    props = props_for(timeout=45, bandwidthMessage=8)
    settings = props["triggers"][0]["settings"]
    props["triggers"][0]["settings"] = {k: float(v) if isinstance(v, int) and
                                        not isinstance(v, bool) else v
                                        for k, v in settings.items()}
    cfg = fc.settings_of(props)
    assert (cfg.timeout, cfg.bandwidth_message) == (45, 8)


def test_the_gate_leaves_a_warning_to_the_checks_diagnostic() -> None:
    spec = spec_from(lab_nodes(2))
    proc = subprocess.run(["sh", "-c", fc.gate_script(spec, "warn", "degraded")],
                          capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0 and "degraded" not in proc.stdout + proc.stderr


# --- `spark-vllm status --fabric` ----------------------------------------------------------

class _Value:
    def __init__(self, value: str) -> None:
        self.value = value


class _Deployment:
    def __init__(self, resources: list[dict[str, Any]]) -> None:
        self.deployment = {"resources": resources}


class FakeStack:
    """What status reads of a stack: its config (the key) and its exported state."""

    name = "lab"

    def __init__(self, props: dict[str, Any], outputs: dict[str, Any]) -> None:
        self.resources = [{"urn": "urn:pulumi:lab::spark-vllm::spark-vllm:fabric:FabricCheck$"
                                  "pulumi-python:dynamic:Resource::fabric-check",
                           "type": DYNAMIC, "inputs": props, "outputs": outputs}]

    def get_config(self, key: str) -> _Value:
        assert key == "spark-vllm:sshPrivateKey"
        return _Value(SSH_KEY)

    def export_stack(self) -> _Deployment:
        return _Deployment(self.resources)


@pytest.mark.parametrize(("bw", "code", "outcome"), [(20.0, 0, "pass"), (12.0, 1, "warn")])
def test_status_fabric_measures_against_the_stacks_baseline_and_keeps_it(
        monkeypatch: pytest.MonkeyPatch, bw: float, code: int, outcome: str) -> None:
    from spark_vllm import status
    from spark_vllm.components.fabric_verdict import verdict
    from tests.unit.test_fabric_verdict import DEFAULT, pair

    nodes = ("node-1", "node-2")
    baseline = verdict(reports([pair(0, 1, nodes=nodes)], nodes=nodes), DEFAULT, None,
                       "2026-11-30T10:00:00Z").baseline
    now = {r["node"]: r for r in reports([pair(0, 1, bw=bw, nodes=nodes)], nodes=nodes)}
    fake_ssh(monkeypatch, lambda t, script, timeout: subprocess.CompletedProcess(
        [], 0, json.dumps(now[t.node]) + "\n", ""))
    props = props_for()
    props["privateKey"] = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270",
                           "ciphertext": "v1:xyz"}  # as an export holds it: not this key
    got, report, text = status.fabric(FakeStack(props, {"baseline": baseline,
                                                        "outcome": "pass"}))
    assert (got, report["outcome"]) == (code, outcome), text
    assert report["baseline"] == baseline  # read, never written
    assert "node-1-node-2" in text and "beside the deployment" in text
    if outcome == "warn":
        assert "bus bandwidth" in text and "baseline" in text


def test_status_fabric_on_a_stack_without_the_check_says_why() -> None:
    from spark_vllm import status

    stack = FakeStack({}, {})
    stack.resources = []
    with pytest.raises(LookupError, match="no fabric check: one node"):
        status.fabric(stack)
