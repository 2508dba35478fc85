"""ImageCheck: one image, byte-identical, on every node, before any container starts.

Two nodes that pulled the same tag at different times can hold different images under one
name; Ray and vLLM then fail late and obscurely (or not at all). The preflights report each
node's image id; this command, on the head, compares them (and `imageDigest`, when set) and
refuses a difference with a per-node table (commands.image_problems). Every container command
depends on it; nothing restarts because of it (it is not in any container's triggers).
"""

from __future__ import annotations

import pulumi

from . import commands
from .node import SparkNode, node_command
from .spec import ClusterSpec


class ImageCheck(pulumi.ComponentResource):
    image_id: pulumi.Output[str]

    def __init__(self, name: str, spec: ClusterSpec, nodes: list[SparkNode],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:image:ImageCheck", name, None, opts)
        self.check = node_command(
            f"{name}-check", self, nodes[0],
            create=pulumi.Output.all(*[n.preflight_report for n in nodes]).apply(
                lambda reports: commands.image_check_script(spec, [r.strip() for r in reports])),
            triggers=[{"image": spec.image, "nodes": [n.node.name for n in nodes],
                       **({"imageDigest": spec.image_digest} if spec.image_digest else {})}],
            depends_on=[n.preflight for n in nodes],
        )
        self.image_id = self.check.stdout.apply(lambda s: s.strip())
        self.register_outputs({"image_id": self.image_id})
