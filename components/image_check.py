"""ImageCheck: one image, byte-identical, on every node, before any container starts.

Two nodes that pulled the same tag at different times can hold different images under one
name; Ray and vLLM then fail late and obscurely (or not at all). This command, on the head,
asks every node which image it holds now (scripts/image_check.py, over SSH with the stack's key
to each node's identity IP), compares them (and `imageDigest`, when set) and refuses a
difference with a per-node table. Asked at run time, not read from the preflights' reports: a
refused run is retried once the node is fixed, and the preflights do not run again. Every
container command depends on it; nothing restarts because of it (it is in no container's
triggers).
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from .node import SparkNode, node_command
from .render import staging_commands
from .spec import ClusterSpec


class ImageCheck(pulumi.ComponentResource):
    image_id: pulumi.Output[str]

    def __init__(self, name: str, spec: ClusterSpec, nodes: list[SparkNode],
                 ssh_private_key: pulumi.Input[str], after: Sequence[pulumi.Resource] = (),
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:image:ImageCheck", name, None, opts)
        self.check = node_command(
            f"{name}-check", self, nodes[0],
            create=staging_commands.image_check_script(spec),
            stdin=pulumi.Output.secret(ssh_private_key).apply(
                lambda key: staging_commands.image_check_stdin(spec, key)),
            # runs again when what it compares or where it asks changes (not on the
            # preflights' outputs: a node added would show every id as unknown in a preview)
            triggers=[{"image": spec.image, "imagePull": spec.image_pull,
                       **({"imageDigest": spec.image_digest} if spec.image_digest else {}),
                       **({"imageStaging": spec.image_staging}
                          if spec.image_staging != "pull" else {}),
                       "nodes": [n.node.name for n in nodes]}],
            # after the image copies (imageStaging copy), which bring the head's image
            depends_on=[*(n.preflight for n in nodes), *after],
        )
        self.image_id = self.check.stdout.apply(lambda s: s.strip())
        self.register_outputs({"image_id": self.image_id})
