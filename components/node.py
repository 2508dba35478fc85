"""SparkNode: one GPU host reached over SSH, checked by a preflight before any container."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_command import remote

from .liveness import ContainerLiveness
from .render import api_key_commands, commands, preflight_commands
from .spec import SSH_DIALS, ClusterSpec, NodeSpec


@dataclass(frozen=True)
class SparkNodeArgs:
    spec: ClusterSpec
    node: NodeSpec
    ssh_private_key: pulumi.Input[str]  # a secret Output; makes the whole connection secret


class SparkNode(pulumi.ComponentResource):
    """SSH connection + preflight of one node (docker, GPU, fabric address, image)."""

    identity_ip: pulumi.Output[str]
    preflight_report: pulumi.Output[str]

    connection: remote.ConnectionArgs
    preflight: remote.Command

    def __init__(self, name: str, args: SparkNodeArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:node:SparkNode", name, None, opts)
        node, spec = args.node, args.spec
        self.node = node
        self.connection = remote.ConnectionArgs(
            host=node.host, port=node.port, user=node.user,
            private_key=pulumi.Output.secret(args.ssh_private_key),
            host_key=node.host_key,
            # a rebooting Spark takes a while to answer; fail in ~1 min, not pulumi's default
            dial_error_limit=SSH_DIALS, per_dial_timeout=spec.ssh_dial_timeout,
        )
        self.preflight = node_command(
            f"{name}-preflight", self, self,
            create=preflight_commands.preflight_script(spec, node),
            # plain facts for a reviewer: the connection itself shows only [secret]
            triggers=[{"host": node.host, "identityIp": node.identity_ip, "image": spec.image,
                       "imagePull": spec.image_pull,
                       # a switch re-runs it: it stops the other backend's containers first
                       **({"backend": spec.backend} if spec.backend != "ray" else {}),
                       **({"imageDigest": spec.image_digest} if spec.image_digest else {})}],
            depends_on=[],
        )
        self.identity_ip = pulumi.Output.from_input(node.identity_ip)
        self.preflight_report = self.preflight.stdout
        self.register_outputs({"identity_ip": self.identity_ip,
                               "preflight_report": self.preflight_report})


def node_command(
    name: str, parent: pulumi.Resource, node: SparkNode, create: pulumi.Input[str],
    triggers: list[Any], depends_on: list[pulumi.Resource],
    delete: str | None = None, stdin: pulumi.Input[str] | None = None,
    update: str | None = None,
) -> remote.Command:
    """A remote.Command on `node` that is replaced only when its `triggers` change, and then
    deleted before its replacement starts (invariant 2: pulumi-command runs the stored `delete`
    with the stored connection, then the new `create`, so the old container never outlives
    its replacement). `triggers` hold what the command *is* (for a container: its image,
    docker run line, env, the files it runs; then the ids of what it runs on); what it depends
    on reaches it through them, so the engine cascades a replacement, in order (pulumi/pulumi
    pkg/resource/deploy/step_generator.go, calculateDependentReplacements).

    Any other change (the program's script text, the SSH key or a host key in `connection`, a
    secret in `stdin`) is an in-place update: pulumi-command runs `update`, or `create` again
    when there is none (pulumi-command v1.2.1 provider/pkg/provider/remote/commandController.go
    Update), and stores the new inputs, so later deletes use the new connection. A container's
    `update` keeps it running (commands.keep_script); a check runs again and starts nothing."""
    return remote.Command(
        name,
        connection=node.connection,
        create=create,
        update=update,
        delete=delete,
        stdin=stdin,
        triggers=triggers,
        add_previous_output_in_env=False,  # it would need sshd AcceptEnv; nothing reads it
        opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on,
                                    delete_before_replace=True, replace_on_changes=["triggers"]),
    )


def env_facts(spec: ClusterSpec, node: NodeSpec) -> dict[str, Any]:
    """What a reviewer reads in a diff of a container command (invariant 3): named, with the
    non-secret env itself, so `pulumi preview --diff` says
    `~ triggers[0].env.NCCL_DEBUG: "WARN" => "INFO"` rather than a changed script or hash.
    `user`: the SSH user whose home holds the container's env-file (a new user replaces the
    container, so the old home's 0600 file goes with the old one)."""
    return {"node": node.name, "host": node.host, "user": node.user,
            "identityIp": node.identity_ip, "image": spec.image,
            **({"imageDigest": spec.image_digest} if spec.image_digest else {}),
            # the summary tells a warm restart from a cold one by it (and the image)
            "compileCache": spec.compile_cache_dir or "none",
            "env": commands.node_env(spec, node)}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def served_files() -> dict[str, str]:
    """The files the API server's container runs besides the image (copied into its
    VLLM_CONFIG_ROOT by its create), by content: the API-key middleware vLLM imports and the
    list of env keys vLLM does not carry over to its ranks."""
    return {"spark_vllm_auth.py": digest(commands.script_text("spark_vllm_auth.py")),
            "ray_non_carry_over_env_vars.json":
                digest(json.dumps(list(commands.NON_CARRY_OVER_ENV)) + "\n")}


def container_facts(spec: ClusterSpec, node: NodeSpec, argv: list[str],
                    serves: bool = False) -> dict[str, Any]:
    """What a container is: env_facts, its whole `docker run` line (image, entrypoint,
    arguments, mounts, labels, env) and, for the API server's, the files it runs. Nothing of
    the script around it: a reworded message or a better readiness check restarts nothing."""
    return {**env_facts(spec, node), "argv": list(argv),
            **({"files": served_files()} if serves else {})}


def api_key_command(name: str, parent: pulumi.Resource, node: SparkNode, spec: ClusterSpec,
                    api_key: pulumi.Input[str] | None,
                    depends_on: list[pulumi.Resource]) -> remote.Command | None:
    """The API key's file on the node that serves the API (api_key_commands.api_key_script), when
    apiKey is set: the middleware reads it at each request that follows a change, so a
    rotation is an in-place update of this command (its stdin, a secret) and restarts no
    container. Its triggers hold where the file is, never the key: they change only with what
    also changes the API server's container (its node, user or stack)."""
    if api_key is None:
        return None
    return node_command(
        name, parent, node,
        create=api_key_commands.api_key_script(spec, node.node),
        delete=api_key_commands.api_key_remove_script(spec, node.node),
        stdin=pulumi.Output.secret(api_key).apply(api_key_commands.api_key_text),
        triggers=[{"node": node.node.name, "host": node.node.host, "user": node.node.user,
                   "file": f"{api_key_commands.api_key_dir(spec)}/{api_key_commands.API_KEY_FILE}"}],
        depends_on=depends_on)


def liveness_of(name: str, parent: pulumi.Resource, node: SparkNode, spec: ClusterSpec,
                role: str, serving: list[str] | None = None) -> ContainerLiveness:
    """The refresh-time companion of the container command `name` (liveness.py)."""
    return ContainerLiveness(f"{name}-liveness", node=node,
                             container=commands.container_name(spec, role),
                             serving=serving, parent=parent)


def container_command(
    name: str, parent: pulumi.Resource, node: SparkNode, spec: ClusterSpec, role: str,
    create: pulumi.Input[str], delete: str, stdin: pulumi.Input[str], facts: dict[str, Any],
    links: dict[str, Any], depends_on: list[pulumi.Resource], serving: list[str] | None = None,
    live: ContainerLiveness | None = None,
) -> remote.Command:
    """`node_command` for a container, kept running by its update (commands.keep_script), with
    its refresh-time companion (liveness.py): when a refresh saw the container dead, the
    companion's new id replaces it (invariant 7).

    `triggers` = [facts, links]: what the container is (container_facts and more), then the
    resource ids of what it runs on, by name. An id is the same through in-place updates and
    new on a replacement (unknown in its preview), so a cascaded replacement reads
    `~ triggers[1].rayHead: … => [unknown]` ("replaced because the Ray head is"), and an
    update of what it runs on (its stdout is unknown in that preview) replaces nothing."""
    live = live or liveness_of(name, parent, node, spec, role, serving)
    return node_command(name, parent, node, create=create, delete=delete, stdin=stdin,
                        update=commands.keep_script(spec, node.node, role),
                        triggers=[facts, {**links, "liveness": live.id}], depends_on=depends_on)


def vllm_stdin_secret(hf_token: pulumi.Input[str] | None) -> pulumi.Output[str]:
    """stdin of the container that runs vLLM's API server (commands.vllm_stdin), secret."""
    if hf_token is None:
        return pulumi.Output.secret(commands.vllm_stdin(None))
    return pulumi.Output.secret(hf_token).apply(commands.vllm_stdin)


def env_file_stdin(role: str, hf_token: pulumi.Input[str] | None) -> pulumi.Output[str]:
    """stdin of a container command without the API server: its env-file (HF_TOKEN), secret."""
    if hf_token is None:
        return pulumi.Output.from_input(commands.secret_env_file(role, None))
    return pulumi.Output.secret(hf_token).apply(
        lambda tok: commands.secret_env_file(role, tok))
