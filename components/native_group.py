"""NativeGroup: vLLM's native multi-node (backend: native), no Ray. A headless rank's container
on every node but the head, then rank 0 with the API server on the head, which depends on every
rank: a change to any rank (its node, env, image, or the engine's arguments, which every rank
runs) replaces the group whole and in order, headless ranks before rank 0, as RayCluster does
for Ray (backends/native.py says what vLLM requires).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi

from .node import (
    SparkNode,
    api_key_command,
    container_command,
    container_facts,
    digest,
    env_file_stdin,
    liveness_of,
    vllm_stdin_secret,
)
from .render import commands, liveness_commands
from .render.backends import native
from .spec import ClusterSpec


@dataclass(frozen=True)
class NativeGroupArgs:
    spec: ClusterSpec
    nodes: list[SparkNode]  # nodes[0] runs rank 0 and the API server
    hf_token: pulumi.Input[str] | None = None  # secret
    api_key: pulumi.Input[str] | None = None  # secret
    after: tuple[pulumi.Resource, ...] = ()  # the image check, the staging, the memory check


def engine_facts(spec: ClusterSpec) -> dict[str, Any]:
    """What every rank runs: a reviewer reads a vLLM change here, on every node."""
    return {"backend": "native", "model": spec.model,
            **({"modelRevision": spec.model_revision} if spec.model_revision else {}),
            "servedModelName": spec.served_name,
            "tensorParallelSize": spec.tensor_parallel_size,
            "pipelineParallelSize": spec.pipeline_parallel_size,
            "nnodes": len(spec.nodes), "master": f"{spec.head.identity_ip}:{spec.master_port}",
            "vllmArgs": list(spec.vllm_args)}


class NativeGroup(pulumi.ComponentResource):
    """Headless ranks, then rank 0 serving the API, on their identity IPs."""

    container_ids: pulumi.Output[dict[str, str]]
    endpoint: pulumi.Output[str]
    served_model_name: pulumi.Output[str]

    def __init__(self, name: str, args: NativeGroupArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:native:NativeGroup", name, None, opts)
        spec, nodes = args.spec, args.nodes
        before: list[pulumi.Resource] = [*(n.preflight for n in nodes), *args.after]
        serving = liveness_commands.liveness_target(spec)
        leader_name = f"{name}-leader"
        rank_names = [f"{name}-rank-{n.node.name}" for n in nodes[1:]]
        # A group forms once: a headless rank whose rank 0 died stays up without ever joining
        # a new one, and a new rank 0 waits for ranks that never come (vLLM's multiproc
        # executor; torch's TCPStore). So whatever replaces one member replaces all of them:
        # every member's triggers hold every member's liveness id, and the ranks' hold what
        # makes rank 0 (a digest of its facts). The API key is no part of it: it is in its own
        # file on rank 0's node (api_key_command), read by the middleware at each request that
        # follows a change, so a rotation restarts no member.
        lives = {leader_name: liveness_of(leader_name, self, nodes[0], spec, commands.LEADER,
                                          serving)}
        lives.update({rn: liveness_of(rn, self, n, spec, commands.RANK)
                      for rn, n in zip(rank_names, nodes[1:], strict=True)})
        stdin = vllm_stdin_secret(args.hf_token)
        # after every check (`before`): a refused up writes nothing on a node
        self.api_key = api_key_command(f"{name}-api-key", self, nodes[0], spec, args.api_key,
                                       depends_on=before)
        leader_facts = {**container_facts(spec, spec.head, native.leader_run_argv(spec),
                                          serves=True),
                        **engine_facts(spec), "rank": 0, "port": spec.port}
        rank0 = {"rank0": digest(json.dumps(leader_facts, sort_keys=True))}

        def group(me: str) -> dict[str, Any]:
            return {f"liveness@{other}": live.id for other, live in lives.items() if other != me}

        self.ranks = [
            container_command(
                rn, self, n, spec, commands.RANK,
                create=native.rank_start_script(spec, n.node),
                delete=commands.remove_script(spec, n.node, commands.RANK),
                stdin=env_file_stdin(commands.RANK, args.hf_token),
                facts={**container_facts(spec, n.node, native.rank_run_argv(spec, n.node)),
                       **engine_facts(spec), "rank": rank},
                links={**rank0, **group(rn)}, depends_on=before, live=lives[rn])
            for rank, (rn, n) in enumerate(zip(rank_names, nodes[1:], strict=True), 1)
        ]
        self.leader = container_command(
            leader_name, self, nodes[0], spec, commands.LEADER,
            create=native.leader_start_script(spec),
            delete=commands.remove_script(spec, spec.head, commands.LEADER),
            stdin=stdin,
            facts=leader_facts,
            # rank 0 must never outlive a rank it formed its group with
            links={**{f"rank@{n.node.name}": r.id
                      for n, r in zip(nodes[1:], self.ranks, strict=True)},
                   **group(leader_name)},
            depends_on=[*before, *self.ranks, *([self.api_key] if self.api_key else [])],
            serving=serving, live=lives[leader_name],
        )
        containers = [self.leader, *self.ranks]
        self.container_ids = pulumi.Output.all(*[c.stdout for c in containers]).apply(
            lambda ids: {
                f"{n.name}/{commands.LEADER if i == 0 else commands.RANK}": cid.strip()
                for i, (n, cid) in enumerate(zip(spec.nodes, ids, strict=True))})
        self.endpoint = pulumi.Output.from_input(f"http://{spec.head.host}:{spec.port}/v1")
        self.served_model_name = pulumi.Output.from_input(spec.served_name)
        self.register_outputs({"container_ids": self.container_ids, "endpoint": self.endpoint})
