"""NativeGroup: vLLM's native multi-node (backend: native), no Ray. A headless rank's container
on every node but the head, then rank 0 with the API server on the head, which depends on every
rank: a change to any rank (its node, env, image, or the engine's arguments, which every rank
runs) replaces the group whole and in order, headless ranks before rank 0, as RayCluster does
for Ray (backends/native.py says what vLLM requires).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from . import commands
from .backends import native
from .node import SparkNode, container_command, env_facts
from .ray_cluster import _env_file
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
        self.ranks = [
            container_command(
                f"{name}-rank-{n.node.name}", self, n, spec, commands.RANK,
                create=native.rank_start_script(spec, n.node),
                delete=commands.remove_script(spec, n.node, commands.RANK),
                stdin=_env_file(commands.RANK, args.hf_token),
                facts={**env_facts(spec, n.node), **engine_facts(spec), "rank": rank},
                links={}, depends_on=before)
            for rank, n in enumerate(nodes[1:], 1)
        ]
        stdin: pulumi.Output[str] = pulumi.Output.secret(  # type: ignore[arg-type]
            pulumi.Output.all(args.hf_token, args.api_key).apply(
                lambda v: commands.vllm_stdin(v[0], v[1])))
        self.leader = container_command(
            f"{name}-leader", self, nodes[0], spec, commands.LEADER,
            create=native.leader_start_script(spec),
            delete=commands.remove_script(spec, spec.head, commands.LEADER),
            stdin=stdin,
            facts={**env_facts(spec, spec.head), **engine_facts(spec), "rank": 0,
                   "port": spec.port},
            # rank 0 must never outlive a rank it formed its group with
            links={f"rank@{n.node.name}": r.stdout for n, r in zip(nodes[1:], self.ranks,
                                                                    strict=True)},
            depends_on=[*before, *self.ranks],
            serving=commands.liveness_target(spec),
        )
        containers = [self.leader, *self.ranks]
        self.container_ids = pulumi.Output.all(*[c.stdout for c in containers]).apply(
            lambda ids: {
                f"{n.name}/{commands.LEADER if i == 0 else commands.RANK}": cid.strip()
                for i, (n, cid) in enumerate(zip(spec.nodes, ids, strict=True))})
        self.endpoint = pulumi.Output.from_input(f"http://{spec.head.host}:{spec.port}/v1")
        self.served_model_name = pulumi.Output.from_input(spec.served_name)
        self.register_outputs({"container_ids": self.container_ids, "endpoint": self.endpoint})
