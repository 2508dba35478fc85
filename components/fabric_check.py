"""FabricCheck: the fabric measured before any rank starts, gated on its verdict.

Where it sits (program.py): after the image check (it runs the serving image), beside the
head's staging (which does not use the fabric), before the memory check (its ranks' NCCL
buffers would read as used memory), before the copies (nothing else moves bulk data over the
fabric while it measures) and before every container of both backends, Ray's included: a
change that re-measures (an env value, an identity, the image) replaces the Ray containers too,
and their old ones, with vLLM on them, would otherwise be stopped before the verdict. Two
resources:

- `fabric-check`, a dynamic resource (served by Pulumi's own pulumi-resource-pulumi-python, as
  liveness.py's). Its create runs the check: on every node at once, over SSH (ssh.py, the
  stack's key and pinned host keys), the node command of render/fabric_commands.py (a
  short-lived `--rm` container of the serving image running scripts/fabric_check.py with the
  env that node's ranks get). It reads the reports and the verdict (fabric_verdict.py) against
  the baseline its previous outputs hold, and records outcome, message, figures and baseline.
  It runs again only when what it measures changes (its `triggers`: identities, interfaces,
  HCAs, the image, each node's env, its settings and script), or when its last verdict refused;
  a new SSH key, host address or program text is stored without running it. Preview never
  touches a node.
- `fabric-gate`, a command on the head that passes or fails with the verdict's message. Every
  container and copy depends on it: a refused fabric stops the `up` there, with the per-pair
  table, before anything that runs is stopped (the deployment keeps serving).

A verdict is never raised from the dynamic provider: the engine would show it under a Python
traceback. The gate's failure is a command's failure, like every other refusal of the program.
"""

from __future__ import annotations

import datetime
import shlex
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulumi
from pulumi import dynamic

from . import ssh
from .fabric_verdict import Verdict, parse_report, verdict
from .node import SparkNode, node_command
from .render import commands
from .render import fabric_commands as fabric
from .spec import ClusterSpec, FabricCheckSettings

# what a run records (outputs); the rest are inputs
RESULT_KEYS = ("outcome", "message", "pairs", "baseline", "checkedAt")
NONE = "none"  # one node: no fabric to check


def inputs(spec: ClusterSpec) -> dict[str, Any]:
    """The check resource's inputs but the key: what it measures (`triggers`) and, per node,
    how to reach it and the command to run there (also what `spark-vllm status --fabric`
    reads back from the state)."""
    return {"triggers": [fabric.triggers(spec)],
            "nodes": [{"node": n.name, "host": n.host, "port": n.port, "user": n.user,
                       "hostKey": n.host_key or "", "script": fabric.node_script(spec, n)}
                      for n in spec.nodes]}


def targets(props: dict[str, Any], private_key: str) -> list[tuple[ssh.Target, str]]:
    """Each node's SSH target and its command, from the resource's `nodes` input."""
    return [(ssh.Target(node=n["node"], host=n["host"], port=int(n["port"]), user=n["user"],
                        private_key=private_key, host_key=n.get("hostKey") or None),
             n["script"]) for n in props["nodes"]]


def settings_of(props: dict[str, Any]) -> FabricCheckSettings:
    # the engine hands numbers back as floats (protobuf's Value): pydantic's lax mode reads
    # them as the settings' types (90.0 is the timeout 90; 90.5 is still refused)
    return FabricCheckSettings.model_validate(props["triggers"][0]["settings"], strict=False)


def ssh_timeout(cfg: FabricCheckSettings) -> float:
    """The longest a node's command may take: the container's own bound, then SSH's dial."""
    return cfg.timeout + fabric.DOCKER_MARGIN_S + 10 + 2 * ssh.CONNECT_TIMEOUT_S


def measure(nodes: list[tuple[ssh.Target, str]], cfg: FabricCheckSettings,
            baseline: dict[str, Any] | None) -> tuple[Verdict, str]:
    """Run the check on every node at once; its verdict against `baseline`, and when it ran."""
    recorded = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    stdin = fabric.script()

    def one(item: tuple[ssh.Target, str]) -> dict[str, Any]:
        target, script = item
        try:
            proc = ssh.run(target, script, stdin=stdin, timeout=ssh_timeout(cfg))
        except ssh.NodeUnreachableError as err:
            return {"check": "fabric", "node": target.node, "status": "error", "phase": "ssh",
                    "error": str(err)}
        return parse_report(target.node, proc.stdout, proc.returncode, proc.stderr)

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        reports = list(pool.map(one, nodes))
    return verdict(reports, cfg, baseline, recorded), recorded


def run_check(props: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """The resource's outputs after a run: its inputs and what the run found."""
    found, recorded = measure(targets(props, props["privateKey"]), settings_of(props), baseline)
    return {**props, "outcome": found.outcome, "message": found.message, "pairs": found.pairs,
            "baseline": found.baseline, "checkedAt": recorded}


def reruns(olds: dict[str, Any], news: dict[str, Any]) -> bool:
    """Whether an `up` runs the check again: what it measures changed, or it last refused."""
    return olds.get("outcome") == "refuse" or olds.get("triggers") != news.get("triggers")


class _Provider(dynamic.ResourceProvider):
    # by reference (spark_vllm.components.fabric_check._Provider): no code in the state
    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(f"fabric-{uuid.uuid4().hex[:8]}", run_check(props, None))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        inputs = ("triggers", "nodes", "privateKey")
        changed = reruns(olds, news) or any(olds.get(k) != news.get(k) for k in inputs)
        return dynamic.DiffResult(changes=changed, replaces=[])

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if reruns(olds, news):
            return dynamic.UpdateResult(run_check(news, olds.get("baseline") or None))
        # a new key, address or program text: stored; the last run's findings stand
        return dynamic.UpdateResult({**news, **{k: olds.get(k) for k in RESULT_KEYS}})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # its containers never outlive a run (render/fabric_commands.py)


_Provider.__module__ = "spark_vllm.components.fabric_check"


def gate_script(spec: ClusterSpec, outcome: str, message: str) -> str:
    """The gate's create: a failure with the verdict's message when it refused; the message
    in `up`'s progress when it passed or skipped."""
    lines = [*commands.prelude(spec, spec.head, "fabric gate"),
             f"msg={shlex.quote(message)}"]
    if outcome == "refuse":
        lines += ['printf "%s\\n" "$msg" >&2', "exit 1"]
    elif outcome != "warn":  # a warning is the check's own diagnostic already
        lines += ['printf "%s\\n" "$msg"']
    return "\n".join(lines) + "\n"


class _Check(dynamic.Resource):
    outcome: pulumi.Output[str]
    message: pulumi.Output[str]
    checkedAt: pulumi.Output[str]  # noqa: N815 (the output's name)

    def __init__(self, name: str, props: dict[str, Any],
                 opts: pulumi.ResourceOptions) -> None:
        super().__init__(_Provider(), name, props, opts)


class FabricCheck(pulumi.ComponentResource):
    """The check and its gate (module docstring); `gate` is what every rank waits for."""

    summary: pulumi.Output[Any]
    gate: pulumi.Resource | None
    measured: list[pulumi.Resource]  # the run itself: what must be over before the memory check

    def __init__(self, name: str, spec: ClusterSpec, nodes: list[SparkNode],
                 ssh_private_key: pulumi.Input[str], after: list[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:fabric:FabricCheck", name, None, opts)
        if not fabric.needed(spec):
            self.gate, self.measured = None, []
            self.summary = pulumi.Output.from_input(
                {"outcome": NONE, "message": "one node: no fabric to check"})
            self.register_outputs({"summary": self.summary})
            return
        props = {**inputs(spec), "privateKey": pulumi.Output.secret(ssh_private_key),
                 **{k: None for k in RESULT_KEYS}}
        self.check = check = _Check(f"{name}-check", props, pulumi.ResourceOptions(
            parent=self, additional_secret_outputs=["privateKey"],
            depends_on=[*after, *(n.preflight for n in nodes)]))
        self.measured = [check]
        self.gate = node_command(
            f"{name}-gate", self, nodes[0],
            create=pulumi.Output.all(check.outcome, check.message).apply(
                lambda v: gate_script(spec, v[0], v[1])),
            triggers=[{"check": "fabric"}], depends_on=[check])
        pulumi.Output.all(check.outcome, check.message, check.checkedAt).apply(
            lambda v: _say(v[0], v[1], v[2], check))
        self.summary = pulumi.Output.all(
            *(getattr(check, k) for k in RESULT_KEYS)).apply(
            lambda v: {k: x for k, x in zip(RESULT_KEYS, v, strict=True) if x is not None})
        self.register_outputs({"summary": self.summary})


def _say(outcome: str | None, message: str | None, checked: str | None,
         resource: pulumi.Resource) -> None:
    """A warning in every `up` and preview while the last verdict warns (a refusal is the
    gate's error; a pass says nothing: the stack's `fabric` output holds it)."""
    if outcome == "warn" and message:
        pulumi.log.warn(f"{message}\n(measured {checked}: `spark-vllm status --fabric` "
                        "measures again)", resource)
