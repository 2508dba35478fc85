"""Builders of the image copy (imageStaging: copy): spec in, script and stdin out.

One command per other node, run on the head (image_staging.py): scripts/image_copy.py asks the
node what it holds, saves the head's image once (a spool shared by the copies), streams the
layers the node lacks into its `docker load` over the fabric and verifies the image id there.
"""

from __future__ import annotations

import json

from ..spec import ClusterSpec, NodeSpec
from .commands import script_text
from .staging_commands import _staging_prelude, staging_stdin

# where the head keeps the image's save while the copies read it (removed by the last one)
SPOOL_DIR = "~/.spark-vllm/image-spool"


def copy_payload(spec: ClusterSpec, node: NodeSpec) -> dict[str, object]:
    """What scripts/image_copy.py needs: the tag, the node and how the head reaches it."""
    return {"image": spec.image, "head": spec.head.name, "transport": spec.copy_transport,
            "spool": f"{SPOOL_DIR}/{spec.stack}",
            "logPrefix": f"[spark-vllm] {spec.head.name}: image copy to {node.name}: ",
            "node": {"name": node.name, "ip": node.identity_ip, "user": node.user,
                     "port": node.port, "hostKey": node.host_key or ""}}


def copy_stdin(spec: ClusterSpec, node: NodeSpec, ssh_private_key: str) -> str:
    """The copy's stdin: the key, then its program with the payload and its helper's source."""
    helpers = {"image_check": script_text("image_check.py"),
               "image_layers": script_text("image_layers.py"),
               "image_receiver": script_text("image_receiver.py")}
    return staging_stdin(
        ssh_private_key, "image_copy.py",
        f"PAYLOAD = {json.dumps(copy_payload(spec, node), sort_keys=True)!r}\n"
        f"HELPERS = {helpers!r}\n")


def copy_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """`create` of one node's image copy, run on the head; prints what moved as JSON. The
    program runs in the background so that a signal (Ctrl-C twice, a lost session) ends it and
    what it started: the node's `docker load` then sees its stream end and loads nothing."""
    return "\n".join([
        *_staging_prelude(spec, spec.head, f"image copy to {node.name}", "key", env=False),
        'python3 "$work"/m.py "$work"/key > "$work"/out &',
        "py=$!",
        'cleanup() { kill "$py" 2>/dev/null || true; }',
        'wait "$py" || exit 1',
        "cleanup() { :; }",
        'cat "$work"/out',
    ]) + "\n"
