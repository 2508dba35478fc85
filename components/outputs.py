"""The stack outputs both graphs export (program.py for one model, several.py for several),
each in one place: `spark-vllm status`, `status --watch` and `top` read them."""

from __future__ import annotations

from typing import Any

import pulumi

from . import node_memory
from .image_staging import ImageStaging
from .render import liveness_commands
from .spec import ClusterSpec, NodeSpec
from .staging import ModelStaging


def image(spec: ClusterSpec, check: Any, copies: ImageStaging | None) -> pulumi.Output[Any]:
    """The image every node runs, and what each copy moved (imageStaging copy)."""
    return pulumi.Output.all(check.stdout, copies.summary if copies else []).apply(lambda v: {
        "name": spec.image, "id": v[0].strip().splitlines()[-1] if v[0].strip() else "",
        "staging": spec.image_staging, **({"copies": v[1]} if copies else {})})


def serving(spec: ClusterSpec) -> dict[str, Any]:
    """How `spark-vllm status` reads vLLM (the refresh's liveness check) and what vLLM needs
    free to start (its memory check before a repair)."""
    return {"check": liveness_commands.liveness_target(spec),
            "gpuMemoryUtilization": node_memory.utilization(spec.vllm_args)}


def model(spec: ClusterSpec, staging: ModelStaging | None) -> Any:
    """What the nodes hold: the model's commit, files, bytes and manifest digest."""
    return staging.summary if staging else {"model": spec.model, "staging": "none"}


def node(spec: ClusterSpec, n: NodeSpec, containers: dict[str, str]) -> dict[str, Any]:
    """How to reach a node and what runs there (role -> container name)."""
    return {"name": n.name, "host": n.host, "port": n.port, "user": n.user,
            "hostKey": n.host_key or "", "identityIp": n.identity_ip,
            "compileCache": spec.compile_cache_dir or "none", "containers": containers}
