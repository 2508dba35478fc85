"""Pinned host keys, checked before anything runs on a node.

pulumi-command refuses a node whose key differs from `hostKey`, but only as "ssh: handshake
failed: ssh: host key mismatch", after its four dial attempts, and without saying which key the
node presented. Before the update registers any resource, the program asks each node with a
pinned key for its key (`ssh-keyscan`, OpenSSH's own tool) and refuses a mismatch naming the
node, the field and both fingerprints. Only in an update: a preview never contacts a node.
A node that does not answer is left to the commands, which name it within their dial bound.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from .spec import ClusterSpec, NodeSpec

KEYSCAN_TIMEOUT_S = 5


def fingerprint(key: str) -> str:
    """OpenSSH's SHA256 fingerprint of "<type> <base64>" (as `ssh-keygen -lf` prints it)."""
    blob = base64.b64decode(key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def presented(node: NodeSpec) -> str | None:
    """The key of the pinned type the node presents now; None when it does not answer."""
    assert node.host_key
    kind = node.host_key.split()[0]
    try:
        proc = subprocess.run(
            ["ssh-keyscan", "-T", str(KEYSCAN_TIMEOUT_S), "-t", kind.removeprefix("ssh-"),
             "-p", str(node.port), node.host],
            capture_output=True, text=True, timeout=KEYSCAN_TIMEOUT_S + 5)
    except subprocess.TimeoutExpired:
        return None
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#") and parts[1] == kind:
            return f"{parts[1]} {parts[2]}"
    return None


def mismatches(spec: ClusterSpec) -> list[str]:
    """One message per node whose presented key is not the pinned one."""
    pinned = [(i, n) for i, n in enumerate(spec.nodes) if n.host_key]
    if not pinned or shutil.which("ssh-keyscan") is None:
        return []
    with ThreadPoolExecutor(max_workers=len(pinned)) as pool:
        seen = list(pool.map(lambda p: presented(p[1]), pinned))
    out = []
    for (i, node), key in zip(pinned, seen, strict=True):
        assert node.host_key
        if key is None or key.split()[1] == node.host_key.split()[1]:
            continue
        out.append(
            f"nodes[{i}].hostKey: {node.name} at {node.host}:{node.port} presents "
            f"{key.split()[0]} {fingerprint(key)}, not the pinned {fingerprint(node.host_key)}; "
            f"nothing was run on {node.name}. If the node was reinstalled, check the new key "
            f"out of band and pin it (ssh-keyscan -t {key.split()[0].removeprefix('ssh-')} "
            f"-p {node.port} {node.host}); otherwise something else answers at that address.")
    return out
