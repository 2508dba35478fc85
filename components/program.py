"""The whole program: config → ClusterSpec → components → outputs. `__main__.py` calls this;
unit tests call `deploy` under mocks with a spec they build."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import pulumi
from pulumi.runtime import config as runtime_config
from pulumi.runtime import resource as sdk_resource

from . import hostkeys, outputs, secret_check
from .fabric_check import FabricCheck
from .image_check import ImageCheck
from .image_staging import ImageStaging
from .memory_check import MemoryCheck
from .native_group import NativeGroup, NativeGroupArgs
from .node import SparkNode, SparkNodeArgs
from .ray_cluster import RayCluster, RayClusterArgs
from .render import backends, commands
from .several import deploy_several
from .spec import NAMESPACE, ClusterSpec, SpecError, decode_config, parse_spec
from .staging import ModelStaging, ModelStagingArgs
from .vllm_service import VllmService, VllmServiceArgs


@dataclass(frozen=True)
class Secrets:
    ssh_private_key: pulumi.Input[str]
    hf_token: pulumi.Input[str] | None = None
    api_key: pulumi.Input[str] | None = None


# pulumi-language-python's "the program already reported its error" exit code
BAIL_EXIT_CODE = 32


def exit_quietly_when_interrupted() -> None:
    """End the program at once, silently, when the language host interrupts it.

    The host sends SIGINT (then SIGKILL after 5 s: pulumi-language-python main.go, cmd.Cancel)
    when the engine ends the deployment: a step failed, or the operator pressed Ctrl-C. The
    engine has already said why. Python's default KeyboardInterrupt would print the SDK's
    in-flight RPCs' tracebacks (~70 lines, seen with the real host on a failed preflight)
    under the stack, burying the failed command's own message.
    """
    signal.signal(signal.SIGINT, lambda _sig, _frame: os._exit(BAIL_EXIT_CODE))
    # The same moment seen from the other side: the engine cancels the resource registrations
    # still waiting (gRPC CANCELLED, "context canceled"), and one of them can return before
    # the host's SIGINT arrives; the SDK raises it, and its launcher prints "Program failed with
    # an unhandled exception" and a gRPC traceback under the failed command's message (seen
    # once in CI on a refused preflight, with the staging's resources waiting). The engine
    # has said why; end quietly, as for SIGINT. Anything else is raised as the SDK does.
    original = sdk_resource.handle_grpc_error

    def quiet_when_cancelled(exn: grpc.RpcError) -> NoReturn:
        if exn.code() == grpc.StatusCode.CANCELLED:
            os._exit(BAIL_EXIT_CODE)
        original(exn)

    sdk_resource.handle_grpc_error = quiet_when_cancelled


def read_config() -> tuple[ClusterSpec, Secrets]:
    """Read the `spark-vllm:` config once and validate it whole, before any resource exists.

    A bad config ends the run with a RunError that lists every problem (no stack trace).
    """
    # The SDK has no public "all keys" call; unknown keys must be seen to be refused.
    every_key = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw, secrets_set = decode_config(every_key)
    # a secret's flag comes with the config: the language host's RunRequest (configSecretKeys)
    # or PULUMI_CONFIG_SECRET_KEYS; plaintext or placeholder secrets stop here, with the rest
    marked = {k for k in every_key if runtime_config.is_config_secret(k)}
    marked |= set(runtime_config.get_config_secret_keys_env())
    try:
        spec = parse_spec(raw, pulumi.get_stack(), secrets_set,
                          secret_check.secret_problems(every_key, marked))
    except SpecError as err:
        raise pulumi.RunError(str(err)) from None
    cfg = pulumi.Config(NAMESPACE)
    return spec, Secrets(
        ssh_private_key=cfg.require_secret("sshPrivateKey"),
        # "" (Pulumi.yaml's default for an optional secret) is unset
        hf_token=cfg.get_secret("hfToken") if "hfToken" in spec.secrets_set else None,
        api_key=cfg.get_secret("apiKey") if "apiKey" in spec.secrets_set else None,
    )


def read_config_or_exit() -> tuple[ClusterSpec, Secrets]:
    """`read_config` for `__main__`: a bad config is one error naming every bad field, and
    nothing else. Raised out of the program, a RunError is logged by the SDK's launcher, which
    then exits 1, and the language host adds "an unhandled error occurred: program exited with
    non-zero exit code: 1" (seen with the real host); exit code 32 tells it the error is shown."""
    try:
        return read_config()
    except pulumi.RunError as err:
        pulumi.log.error(str(err))
        raise SystemExit(BAIL_EXIT_CODE) from None


def run() -> None:
    """What a project's `__main__.py` calls: this repository's and every `spark-vllm init` one's."""
    exit_quietly_when_interrupted()
    main()


def main() -> None:
    """The program: config, checked whole, then the graph and its outputs."""
    spec, secrets = read_config_or_exit()
    if spec.insecure_accept_any_host_key:
        unpinned = [n.name for n in spec.nodes if not n.host_key]
        pulumi.log.warn(
            "insecureAcceptAnyHostKey is set: " + (
                f"{', '.join(unpinned)} accept{'s' if len(unpinned) == 1 else ''} any host key, "
                "so whoever answers at their address gets the deploy key's session and the "
                "secrets. For a throwaway lab only: pin each node's hostKey "
                "(ssh-keyscan -t ed25519 HOST) and remove it"
                if unpinned else "every node's hostKey is pinned, so it changes nothing; "
                "remove it"))
    if not pulumi.runtime.is_dry_run():
        # an update is about to reach the nodes: a wrong pinned key stops it before any command
        if problems := hostkeys.mismatches(spec):
            pulumi.log.error("host key mismatch:\n" + "\n".join(f"  - {p}" for p in problems))
            raise SystemExit(BAIL_EXIT_CODE)
    for key, value in deploy(spec, secrets).items():
        pulumi.export(key, value)


def deploy(spec: ClusterSpec, secrets: Secrets) -> dict[str, Any]:
    """Build the component graph; return the stack outputs."""
    nodes = [
        SparkNode(n.name, SparkNodeArgs(spec=spec, node=n, ssh_private_key=secrets.ssh_private_key))
        for n in spec.nodes
    ]
    if spec.several:
        return deploy_several(spec, nodes, secrets.ssh_private_key, secrets.hf_token,
                              secrets.api_key)
    # before any container: one image everywhere (the head's copied to the others, with
    # imageStaging copy), the weights on the head
    image_copies = ImageStaging("image", spec, nodes, ssh_private_key=secrets.ssh_private_key) \
        if spec.image_staging == "copy" and len(nodes) > 1 else None
    image = ImageCheck("image", spec, nodes, ssh_private_key=secrets.ssh_private_key,
                       after=image_copies.copies if image_copies else []).check
    before: list[pulumi.Resource] = [image]
    staging = None
    if spec.staged:
        staging = ModelStaging("model", ModelStagingArgs(
            spec=spec, nodes=nodes, ssh_private_key=secrets.ssh_private_key,
            hf_token=secrets.hf_token, after=tuple(before)))
        before.append(staging.stage)
    # the fabric, measured while nothing else moves data over it (before the copies), gates
    # every container that would change: a refused fabric stops the `up` at its gate, before
    # any old container is stopped, so a deployment that serves keeps serving. It runs the
    # serving image, so after the image check; beside the head's staging, which does not use
    # the fabric (it reads the head's disk, or downloads over the head's own network)
    fabric = FabricCheck("fabric", spec, nodes, ssh_private_key=secrets.ssh_private_key,
                         after=[image])
    # will vLLM fit, with the weights on the head (their config) and each node's free memory
    # now: read once the fabric check's ranks are gone (their NCCL buffers would read as used
    # memory), beside the fabric's gate
    memory = MemoryCheck("memory", spec, nodes, ssh_private_key=secrets.ssh_private_key,
                         after=[*before, *fabric.measured])
    before.append(memory.check)
    before += [fabric.gate] if fabric.gate else []
    copies: list[pulumi.Resource] = staging.copy(after=before) if staging else []
    # The copies to the other nodes are only for vLLM's ranks: Ray's containers start while
    # they run (a cold up no longer waits for a copy, or its verification, before Ray), and
    # vLLM waits for both. A copy that fails leaves the Ray cluster up and in the state; the
    # next `up` copies again and keeps it.
    if spec.backend == "native":
        group = NativeGroup("vllm", NativeGroupArgs(
            spec=spec, nodes=nodes, hf_token=secrets.hf_token, api_key=secrets.api_key,
            after=tuple(before + copies)))
        endpoint, served, container_ids = group.endpoint, group.served_model_name, \
            group.container_ids
        ray_nodes: pulumi.Input[str] = "none: backend native (no Ray)"
    else:
        cluster = RayCluster("ray", RayClusterArgs(spec=spec, nodes=nodes,
                                                   hf_token=secrets.hf_token, after=tuple(before)))
        service = VllmService("vllm", VllmServiceArgs(
            spec=spec, head=nodes[0], cluster=cluster,
            hf_token=secrets.hf_token, api_key=secrets.api_key, after=tuple(copies)))
        endpoint, served, ray_nodes = service.endpoint, service.served_model_name, \
            cluster.node_table
        container_ids = pulumi.Output.all(cluster.container_ids, service.container_id).apply(
            lambda v: {**v[0], f"{spec.head.name}/vllm": v[1]})
    return {
        "endpoint": endpoint,
        "servedModelName": served,
        "identityIps": {n.name: n.identity_ip for n in spec.nodes},
        "containerIds": container_ids,
        # per node: docker version, image id, Ray and Python versions in the image
        "preflight": {n.node.name: n.preflight_report.apply(json.loads) for n in nodes},
        "image": outputs.image(spec, image, image_copies),
        "rayNodes": ray_nodes,
        "serving": outputs.serving(spec),
        "model": outputs.model(spec, staging),
        # the memory admission: the estimate per rank and each node's numbers when checked
        "memory": memory.summary,
        # the fabric check's last verdict, figures per pair and the cluster's baseline (its
        # first good run, what later runs are compared with)
        "fabric": fabric.summary,
        "nodes": [outputs.node(spec, n, {role: commands.container_name(spec, role)
                                         for role in backends.of(spec).roles(i)})
                  for i, n in enumerate(spec.nodes)],
    }
