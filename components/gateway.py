"""Gateway: the one endpoint of a stack that serves several models (render/gateway_commands.py):
LiteLLM's proxy on nodes[0], routing by the request's `model` to each model's vLLM.

It depends on the checks only, never on a model's containers: a model replaced, repaired or
restarted leaves the gateway as it is (LiteLLM reaches each vLLM per request), and the gateway
is replaced only when what it is changes (its image, port, routes, files) or the key it sends
to the models does (LiteLLM reads it at start; a secret trigger, shown as [secret]).
"""

from __future__ import annotations

import hashlib

import pulumi

from .node import SparkNode, api_key_command, container_command
from .render import gateway_commands
from .spec import ClusterSpec


class Gateway(pulumi.ComponentResource):
    endpoint: pulumi.Output[str]

    def __init__(self, name: str, spec: ClusterSpec, head: SparkNode,
                 api_key: pulumi.Input[str] | None, after: list[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:gateway:Gateway", name, None, opts)
        self.api_key = api_key_command(f"{name}-api-key", self, head, spec, api_key,
                                       depends_on=after)
        links: dict[str, object] = {}
        if api_key is not None:
            # the key LiteLLM sends to the models, read at its start: a rotation replaces the
            # gateway (seconds), never a model; a digest, and secret, so nothing shows it
            links["upstreamKey"] = pulumi.Output.secret(api_key).apply(
                lambda k: hashlib.sha256(("spark-vllm gateway " + k).encode()).hexdigest())
        self.container = container_command(
            name, self, head, spec, gateway_commands.GATEWAY,
            create=gateway_commands.start(spec), delete=gateway_commands.remove(spec),
            stdin=gateway_commands.stdin(spec), facts=gateway_commands.facts(spec),
            links=links, depends_on=[*after, *([self.api_key] if self.api_key else [])])
        self.endpoint = pulumi.Output.from_input(f"http://{spec.head.host}:{spec.port}/v1")
        self.register_outputs({"endpoint": self.endpoint})
