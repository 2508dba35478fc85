"""Run the program under Pulumi mocks with a monitor that keeps every RegisterResource
request, so tests see resource options (deleteBeforeReplace, replaceOnChanges,
propertyDependencies) that `Mocks.new_resource` alone hides (pulumi/pulumi sdk/python/lib/pulumi/runtime/mocks.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pulumi
from google.protobuf.json_format import MessageToDict
from pulumi.runtime.mocks import MockMonitor

from spark_vllm.components.program import Secrets, deploy, main
from spark_vllm.components.spec import ClusterSpec, parse_spec

SECRET_SIG = "4dabf18193072939515e22adb298388d"
CMD = "command:remote:Command"

SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret-ssh-key-material\n-----END-----"
HF_TOKEN = "hf_secretTokenValue123"
API_KEY = "sk-secret-api-key-456"
# the model the memory checks read (tests/unit/conftest.py `hf`)
MOE_MODEL = "lab/moe-like"


# rsync as a preflight sees it: on PATH (`command -v rsync`, the staging check), never run. The
# unit tests put it in their fake bin dir so they pass on a host without rsync; a script that
# did run it fails loudly instead of copying anything.
FAKE_RSYNC = """#!/bin/sh
echo "fake rsync (tests/unit/harness.py): a unit test ran rsync $*" >&2
exit 127
"""


def fake_rsync(bin_dir: Path) -> Path:
    """Put the fake `rsync` in `bin_dir` (made if missing); return its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    rsync = bin_dir / "rsync"
    rsync.write_text(FAKE_RSYNC)
    rsync.chmod(0o755)
    return rsync


IMAGE_ID = "sha256:" + "ab" * 32
# a well-formed ed25519 public key (its 32 bytes 0..31), pinned on every test node
TEST_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f"


def pinned(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`nodes` with TEST_HOST_KEY as the hostKey of each that has none (a site pins its own)."""
    return [{"hostKey": TEST_HOST_KEY, **n} for n in nodes]
STAGED = {"model": "Qwen/Qwen3.5-122B-A10B-FP8", "revision": "main", "commit": "c0" * 20,
          "files": 9, "bytes": 123, "hashed": 123, "manifest": "fe" * 32}


class Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        state = dict(args.inputs)
        if args.typ == CMD and args.name.endswith("-preflight"):
            # a preflight prints a JSON summary of the node
            node = args.name.removesuffix("-preflight")
            state.update(stdout=f'{{"node": "{node}", "image_id": "{IMAGE_ID}"}}\n', stderr="")
        elif args.typ == CMD and args.name.endswith("-stage"):
            # the model's staging prints its manifest summary
            state.update(stdout=json.dumps(STAGED) + "\n", stderr="")
        elif args.typ == CMD:
            # a container command prints its container id on stdout
            state.update(stdout=f"cid-{args.name}\n", stderr="")
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return {}


class RecordingMonitor(MockMonitor):
    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.seen: list[Any] = []

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (gRPC name)
        resp = super().RegisterResource(request)
        self.seen.append(request)
        return resp

    @property
    def requests(self) -> dict[str, Any]:
        """Every registration by resource name. A name two resources share (the ImageStaging
        and the ImageCheck are both "image"; the Gateway component and its container command
        "gateway"): a component's as "name (type)", so that what a test reads does not depend
        on the order the SDK's registrations arrived in."""
        names = [r.name for r in self.seen]
        return {(f"{r.name} ({r.type})" if names.count(r.name) > 1
                 and r.type.startswith("spark-vllm:") else r.name): r for r in self.seen}


@dataclass
class Registered:
    name: str
    type: str
    urn: str
    inputs: dict[str, Any]  # protobuf JSON: secrets stay wrapped in their sentinel
    delete_before_replace: bool
    replace_on_changes: list[str]
    ignore_changes: list[str]
    dependencies: list[str]
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)

    def plain(self, key: str) -> Any:
        return unwrap(self.inputs.get(key))


def unwrap(value: Any) -> Any:
    if isinstance(value, dict) and value.get(SECRET_SIG):
        return unwrap(value.get("value"))
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


def run(spec: ClusterSpec, secrets: Secrets | None = None) -> dict[str, Registered]:
    """Register the whole graph under mocks; return what the monitor saw, by resource name."""
    mocks = Mocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="spark-vllm", stack=spec.stack, preview=False,
                             monitor=monitor)
    secrets = secrets or Secrets(
        ssh_private_key=pulumi.Output.secret(SSH_KEY),
        hf_token=pulumi.Output.secret(HF_TOKEN),
        api_key=pulumi.Output.secret(API_KEY))

    @pulumi.runtime.test
    def program() -> pulumi.Output[Any]:
        outputs = deploy(spec, secrets)
        return pulumi.Output.all(*outputs.values())

    program()
    urns = {key: monitor.make_urn(req.parent, req.type, req.name)
            for key, req in monitor.requests.items()}
    out = {}
    for name, req in monitor.requests.items():
        out[name] = Registered(
            name=name, type=req.type, urn=urns[name],
            inputs=MessageToDict(req.object),
            delete_before_replace=req.deleteBeforeReplace,
            replace_on_changes=list(req.replaceOnChanges),
            ignore_changes=list(req.ignoreChanges),
            dependencies=list(req.dependencies),
            property_dependencies={k: list(v.urns) for k, v in req.propertyDependencies.items()},
        )
    return out


def run_outputs(spec: ClusterSpec) -> dict[str, Any]:
    """The stack's outputs under mocks (the default secrets), resolved."""
    mocks = Mocks()
    pulumi.runtime.set_mocks(mocks, project="spark-vllm", stack=spec.stack, preview=False,
                             monitor=RecordingMonitor(mocks))
    secrets = Secrets(ssh_private_key=pulumi.Output.secret(SSH_KEY),
                      hf_token=pulumi.Output.secret(HF_TOKEN),
                      api_key=pulumi.Output.secret(API_KEY))
    seen: dict[str, Any] = {}

    @pulumi.runtime.test
    def program() -> pulumi.Output[Any]:
        outputs = deploy(spec, secrets)
        return pulumi.Output.all(**outputs).apply(seen.update)

    program()
    return seen


def spec_from(nodes: list[dict[str, Any]], stack: str = "test", **top: Any) -> ClusterSpec:
    raw: dict[str, Any] = {
        "nodes": nodes if top.get("insecureAcceptAnyHostKey") else pinned(nodes),
        "image": "vllm/image:1", "model": "org/model",
        "tensorParallelSize": sum(n.get("gpus", 1) for n in nodes),
    }
    raw.update(top)
    if "models" in top:  # several models: each its own model and layout (spec_models.py)
        del raw["model"], raw["tensorParallelSize"]
    return parse_spec(raw, stack, frozenset({"sshPrivateKey", "hfToken", "apiKey"}))


def lab_nodes(n: int) -> list[dict[str, Any]]:
    return [{"name": f"node-{i}", "host": f"10.231.0.{10 + i}", "fabricIp": f"192.168.231.{10 + i}",
             "fabricInterface": f"enp{i}s0f1np1", "ibHca": f"rocep{i}s0f1"}
            for i in range(1, n + 1)]


def run_main(config: dict[str, str], secret_keys: list[str], stack: str = "t",
             ) -> tuple[int | None, list[str], RecordingMonitor]:
    """The program as `__main__.py` runs it, in a preview under mocks, on `config` (the keys in
    `secret_keys` marked secret): (exit code, errors it logged, the monitor that saw it)."""
    mocks = Mocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="spark-vllm", stack=stack, preview=True,
                             monitor=monitor)
    pulumi.runtime.set_all_config(config, secret_keys=secret_keys)
    errors: list[str] = []
    code = None
    try:
        with patch.object(pulumi.log, "error", side_effect=lambda m, *a, **k: errors.append(m)):
            pulumi.runtime.test(main)()
    except SystemExit as err:
        code = int(err.code or 0)
    finally:
        pulumi.runtime.set_all_config({}, secret_keys=[])
    return code, errors, monitor
