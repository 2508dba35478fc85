"""VllmService: `vllm serve` on the head node, started once the gate has passed, and ready
only when /health answers, /v1/models lists the model and (optionally) a chat answers."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from .node import SparkNode, api_key_command, container_command, container_facts, vllm_stdin_secret
from .ray_cluster import RayCluster
from .render import commands, liveness_commands
from .render.backends import ray
from .spec import ClusterSpec


@dataclass(frozen=True)
class VllmServiceArgs:
    spec: ClusterSpec
    head: SparkNode
    cluster: RayCluster
    hf_token: pulumi.Input[str] | None = None  # secret
    api_key: pulumi.Input[str] | None = None  # secret
    # the model's copies to the other nodes: only vLLM's ranks read them, so the Ray cluster
    # starts while they run (program.deploy)
    after: tuple[pulumi.Resource, ...] = ()


class VllmService(pulumi.ComponentResource):
    endpoint: pulumi.Output[str]
    container_id: pulumi.Output[str]
    served_model_name: pulumi.Output[str]

    def __init__(self, name: str, args: VllmServiceArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:vllm:VllmService", name, None, opts)
        spec, cluster = args.spec, args.cluster
        stdin = vllm_stdin_secret(args.hf_token)
        # the key's file, written before vLLM starts and in place on a rotation: the
        # middleware reads it again when it changes, so a new apiKey restarts nothing
        # (after every check, beside Ray's containers: a refused up writes nothing, and a
        # cold up does not wait for it after Ray's gate)
        self.api_key = api_key_command(f"{name}-api-key", self, args.head, spec, args.api_key,
                                       depends_on=[args.head.preflight, *cluster.checks,
                                                   *args.after])
        self.serve = container_command(
            f"{name}-serve", self, args.head, spec, commands.VLLM,
            create=ray.vllm_start_script(spec),
            delete=commands.remove_script(spec, spec.head, commands.VLLM),
            stdin=stdin,
            # the gate's id changes whenever the gate is replaced, i.e. whenever any Ray
            # container is: a vLLM driver must never outlive the cluster it was placed on
            facts={**container_facts(spec, spec.head, ray.vllm_run_argv(spec), serves=True),
                   "model": spec.model,
                   **({"modelRevision": spec.model_revision} if spec.model_revision else {}),
                   "servedModelName": spec.served_name,
                   "tensorParallelSize": spec.tensor_parallel_size,
                   "pipelineParallelSize": spec.pipeline_parallel_size, "port": spec.port,
                   "vllmArgs": list(spec.vllm_args)},
            # (the hfToken is only read to download, before the load, so a new one is an
            # update: keep_script; the apiKey is in its own file, api_key_command)
            links={"gate": cluster.gate.id, "rayHead": cluster.head.id,
                   **{f"rayWorker@{n.name}": w.id
                      for n, w in zip(spec.workers, cluster.workers, strict=True)}},
            depends_on=[cluster.gate, *args.after, *([self.api_key] if self.api_key else [])],
            # refresh asks the server itself, as a client would (vllm#53157): serving, busy
            # or wedged (liveness_commands.liveness_target)
            serving=liveness_commands.liveness_target(spec),
        )
        self.container_id = self.serve.stdout.apply(lambda s: s.strip())
        self.endpoint = pulumi.Output.from_input(f"http://{spec.head.host}:{spec.port}/v1")
        self.served_model_name = pulumi.Output.from_input(spec.served_name)
        self.register_outputs({"endpoint": self.endpoint, "container_id": self.container_id,
                               "served_model_name": self.served_model_name})
