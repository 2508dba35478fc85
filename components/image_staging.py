"""ImageStaging: the head's image on every other node before any container (imageStaging: copy).

    image-copy-<node> (head)   per other node, in parallel: asks the node which image it holds
                               and which layers it has, saves the head's image once (shared by
                               the copies), sends only the layers the node lacks into its
                               `docker load` over the fabric (SSH, or raw TCP with
                               copyTransport tcp), and verifies the image id there
                               (scripts/image_copy.py)

The head holds the image first: its preflight pulls it per imagePull, or it was built there.
The other nodes' preflights pull nothing. Each copy has a refresh-time companion
(liveness.ImageLiveness) that reads the image id under the tag on its node: an image pruned
there, or another one under its tag, is copied again by `pulumi up --refresh`. The image check
runs after the copies and compares every node; containers depend on it and hold none of this
in their triggers (a copy that runs again restarts nothing). Destroy leaves the image on the
nodes, as `pull` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pulumi
from pulumi_command import remote

from .liveness import ImageLiveness
from .node import SparkNode, node_command
from .render import image_commands
from .spec import ClusterSpec, NodeSpec


class ImageStaging(pulumi.ComponentResource):
    copies: list[remote.Command]
    summary: pulumi.Output[list[Any]]

    def __init__(self, name: str, spec: ClusterSpec, nodes: list[SparkNode],
                 ssh_private_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:image:ImageStaging", name, None, opts)
        head = nodes[0]
        # what the head holds, as its preflight read it: what every node must hold
        head_id = head.preflight_report.apply(lambda s: json.loads(s)["image_id"])
        self.copies = []
        for n in nodes[1:]:
            stdin = pulumi.Output.secret(ssh_private_key).apply(_stdin(spec, n.node))
            live = ImageLiveness(f"{name}-copy-{n.node.name}-liveness", node=n, image=spec.image,
                                 image_id=head_id, parent=self)
            self.copies.append(node_command(
                f"{name}-copy-{n.node.name}", self, head,
                create=image_commands.copy_script(spec, n.node),
                stdin=stdin,
                triggers=[{"node": n.node.name, "to": n.node.identity_ip, "image": spec.image,
                           **({"imageDigest": spec.image_digest} if spec.image_digest else {})},
                          {"liveness": live.id}],
                depends_on=[n.preflight for n in nodes],
            ))
        self.summary = pulumi.Output.all(*[c.stdout for c in self.copies]).apply(
            lambda outs: [_last_json(o) for o in outs])
        self.register_outputs({"summary": self.summary})


def _stdin(spec: ClusterSpec, node: NodeSpec) -> Callable[[str], str]:
    return lambda key: image_commands.copy_stdin(spec, node, key)


def _last_json(stdout: str) -> Any:
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
