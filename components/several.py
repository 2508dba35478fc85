"""The graph of a stack that serves several models (`models:`, spec_models.py).

What the models share is built once: the nodes, the image (one check, one staging), the fabric
check, the memory admission of the whole set (memory_check.py, per node over every model placed
there, in start order). Each model's weights are staged (`model-<name>`: fetched on nodes[0],
copied to its nodes) before any model starts; then each model is a NativeGroup of its own over
its own nodes, named after it (`vllm-<name>`); and the gateway on nodes[0]. A model's change replaces that model's containers only: nothing of one
group is in another's triggers, and the gateway holds none of them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pulumi

from . import outputs
from .fabric_check import FabricCheck
from .gateway import Gateway
from .image_check import ImageCheck
from .image_staging import ImageStaging
from .memory_check import MemoryCheck
from .native_group import NativeGroup, NativeGroupArgs
from .node import SparkNode
from .render import backends, commands, gateway_commands
from .spec import ClusterSpec
from .staging import ModelStaging, ModelStagingArgs


def deploy_several(spec: ClusterSpec, nodes: list[SparkNode], ssh_private_key: pulumi.Input[str],
                   hf_token: pulumi.Input[str] | None,
                   api_key: pulumi.Input[str] | None) -> dict[str, Any]:
    by_name = {n.node.name: n for n in nodes}
    views = spec.views()
    image_copies = ImageStaging("image", spec, nodes, ssh_private_key=ssh_private_key) \
        if spec.image_staging == "copy" and len(nodes) > 1 else None
    image = ImageCheck("image", spec, nodes, ssh_private_key=ssh_private_key,
                       after=image_copies.copies if image_copies else []).check
    before: list[pulumi.Resource] = [image]
    stagings = {}
    if spec.staged:
        # every model's weights fetched once on the stack's head, as a single model's are (the
        # memory admission reads them there), then copied over the fabric to its own nodes,
        # every model's before any model starts
        for v in views:
            on = (spec.head, *(n for n in v.nodes if n.name != spec.head.name))
            stagings[v.model_key] = ModelStaging(f"model-{v.model_key}", ModelStagingArgs(
                spec=dataclasses.replace(v, nodes=on), nodes=[by_name[n.name] for n in on],
                ssh_private_key=ssh_private_key, hf_token=hf_token, after=(image,)))
        before += [s.stage for s in stagings.values()]
    fabric = FabricCheck("fabric", spec, nodes, ssh_private_key=ssh_private_key, after=[image])
    memory = MemoryCheck("memory", spec, nodes, ssh_private_key=ssh_private_key,
                         after=[*before, *fabric.measured])
    before.append(memory.check)
    before += [fabric.gate] if fabric.gate else []
    groups: dict[str, NativeGroup] = {}
    for v in views:
        copies = stagings[v.model_key].copy(after=before) if v.model_key in stagings else []
        groups[str(v.model_key)] = NativeGroup(f"vllm-{v.model_key}", NativeGroupArgs(
            spec=v, nodes=[by_name[n.name] for n in v.nodes], hf_token=hf_token,
            api_key=api_key, after=tuple(before + copies)))
    gateway = Gateway("gateway", spec, nodes[0], api_key, after=before)
    container_ids = pulumi.Output.all(
        gateway.container.stdout, *[g.container_ids for g in groups.values()]).apply(
        # node/role as a single-model stack's, the role as `nodes[].containers` keys it
        lambda v: {f"{spec.head.name}/{gateway_commands.GATEWAY}": v[0].strip(),
                   **{f"{where.split('/')[0]}/{key}/{where.split('/')[1]}": cid
                      for key, ids in zip(groups, v[1:], strict=True)
                      for where, cid in ids.items()}})
    return {
        "endpoint": gateway.endpoint,
        "servedModelName": [v.served_name for v in views],
        "identityIps": {n.name: n.identity_ip for n in spec.nodes},
        "containerIds": container_ids,
        "preflight": {n.node.name: n.preflight_report.apply(json.loads) for n in nodes},
        "image": outputs.image(spec, image, image_copies),
        "rayNodes": "none: backend native (no Ray)",
        # the first model's, as a single-model stack's (status reads it); each model's below
        "serving": outputs.serving(views[0]),
        "models": {v.model_key: {
            "servedModelName": v.served_name, "model": v.model,
            "nodes": [n.name for n in v.nodes],
            "endpoint": f"http://{v.head.host}:{v.port}/v1",
            "serving": outputs.serving(v)} for v in views},
        "gateway": {"image": spec.gateway.image, "port": spec.port,
                    "routes": gateway_commands.routes(spec)},
        # per model, what the nodes hold
        "model": {v.model_key: outputs.model(v, stagings.get(v.model_key)) for v in views},
        "memory": memory.summary,
        "fabric": fabric.summary,
        "nodes": [outputs.node(spec, n, {
            **({gateway_commands.GATEWAY: commands.container_name(
                spec, gateway_commands.GATEWAY)} if i == 0 else {}),
            **{f"{v.model_key}/{role}": commands.container_name(v, role)
               for v in views if n.name in {m.name for m in v.nodes}
               for role in backends.of(v).roles([m.name for m in v.nodes].index(n.name))}})
                  for i, n in enumerate(spec.nodes)],
    }
