"""RayCluster: the head container, one worker container per other node, and the readiness gate.

The chain runs through inputs, so the engine replaces it whole and in order: each worker's
`triggers` holds the head command's id, the gate's holds every container command's id (ids
stay through in-place updates, so an upgrade of spark-vllm or a new SSH key replaces nothing).
A change of IP, image or env then plans delete gate → workers → head, create head → workers → gate
(pulumi/pulumi pkg/resource/deploy/step_generator.go: calculateDependentReplacements cascades
only through inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from .node import SparkNode, container_command, container_facts, env_file_stdin, node_command
from .render import commands
from .render.backends import ray
from .spec import ClusterSpec


@dataclass(frozen=True)
class RayClusterArgs:
    spec: ClusterSpec
    nodes: list[SparkNode]  # nodes[0] is the head
    hf_token: pulumi.Input[str] | None = None  # secret
    after: tuple[pulumi.Resource, ...] = ()  # the image check and the model's staging


class RayCluster(pulumi.ComponentResource):
    """Ray head + workers on their identity IPs, gated on Ray's own node table."""

    container_ids: pulumi.Output[dict[str, str]]
    node_table: pulumi.Output[str]

    def __init__(self, name: str, args: RayClusterArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:ray:RayCluster", name, None, opts)
        spec, nodes = args.spec, args.nodes
        preflights: list[pulumi.Resource] = [*(n.preflight for n in nodes), *args.after]
        # what every container waits for: each node's preflight and every check
        self.checks = tuple(preflights)
        head_node = nodes[0]

        self.head = container_command(
            f"{name}-head", self, head_node, spec, commands.HEAD,
            create=ray.head_start_script(spec),
            delete=commands.remove_script(spec, spec.head, commands.HEAD),
            stdin=env_file_stdin(commands.HEAD, args.hf_token),
            facts={**container_facts(spec, spec.head, ray.head_run_argv(spec)),
                   "rayPort": spec.ray_port},
            links={},
            depends_on=preflights,
        )
        self.workers = [
            container_command(
                f"{name}-worker-{n.node.name}", self, n, spec, commands.WORKER,
                create=ray.worker_start_script(spec, n.node),
                delete=commands.remove_script(spec, n.node, commands.WORKER),
                stdin=env_file_stdin(commands.WORKER, args.hf_token),
                facts=container_facts(spec, n.node, ray.worker_run_argv(spec, n.node)),
                links={"rayHead": self.head.id},
                depends_on=[*preflights, self.head],
            )
            for n in nodes[1:]
        ]
        containers = [self.head, *self.workers]
        self.gate = node_command(
            f"{name}-gate", self, head_node,
            create=pulumi.Output.all(*[n.preflight_report for n in nodes]).apply(
                lambda reports: ray.gate_script(spec, _versions_read(reports))),
            # a newer program (an upgrade of spark-vllm) is an update: the gate runs again and
            # keeps its id, so vLLM, whose triggers hold that id, stays
            stdin=ray.gate_program(),
            triggers=[{"rayHead": self.head.id,
                       **{f"rayWorker@{n.node.name}": w.id
                          for n, w in zip(nodes[1:], self.workers, strict=True)}}],
            depends_on=list(containers),
        )
        self.container_ids = pulumi.Output.all(*[c.stdout for c in containers]).apply(
            lambda ids: {
                f"{n.name}/{commands.HEAD if i == 0 else commands.WORKER}": cid.strip()
                for i, (n, cid) in enumerate(zip(spec.nodes, ids, strict=True))
            })
        self.node_table = self.gate.stdout
        self.register_outputs({"container_ids": self.container_ids,
                               "node_table": self.node_table})


def _versions_read(reports: list[str]) -> list[str]:
    """The preflight reports whose node read the image's versions: with imageStaging copy a
    node that lacked the image had none to read (the copy brought the head's, the same id)."""
    return [r.strip() for r in reports if '"image_id": ""' not in r]
