"""Cut and restore the fabric link between two nodes (a Ray worker that cannot join).

Rules live in a chain of our own, SPARK-LAB-BLOCK, jumped to first from INPUT and OUTPUT in
each node's own network namespace, so the inner dockerd's rules are never touched and
established connections are cut as well. Both nodes drop everything to and from the other's
fabric and spare addresses. Idempotent both ways. Run through `docker exec` (not SSH) so the
lab can be repaired even when a test broke a node's SSH.
"""

from __future__ import annotations

import shlex

from lab import config
from lab.config import NodeAddrs
from lab.run import LabError, run

CHAIN = "SPARK-LAB-BLOCK"


def _script(peer: NodeAddrs, block: bool) -> str:
    ipt = "iptables -w"
    lines = [
        "set -e",
        f"{ipt} -N {CHAIN} 2>/dev/null || true",
        f"{ipt} -C INPUT -j {CHAIN} 2>/dev/null || {ipt} -I INPUT 1 -j {CHAIN}",
        f"{ipt} -C OUTPUT -j {CHAIN} 2>/dev/null || {ipt} -I OUTPUT 1 -j {CHAIN}",
    ]
    for ip in (peer.fabric_ip, peer.spare_ip):
        for flag in ("-s", "-d"):
            rule = f"{CHAIN} {flag} {shlex.quote(ip)} -j DROP"
            if block:
                lines.append(f"{ipt} -C {rule} 2>/dev/null || {ipt} -A {rule}")
            else:
                lines.append(f"while {ipt} -C {rule} 2>/dev/null; do {ipt} -D {rule}; done")
    return "\n".join(lines)


def _node_sh(node: NodeAddrs, script: str, what: str) -> None:
    """`sh -c SCRIPT` in the node's own namespaces (docker exec, not SSH); LabError names it."""
    proc = run(["docker", "exec", node.container, "sh", "-c", script], check=False, timeout=30)
    if proc.returncode != 0:
        raise LabError(f"{what} on {node.name} failed: {proc.stderr.strip()}")


def _apply(node: NodeAddrs, peer: NodeAddrs, block: bool) -> None:
    _node_sh(node, _script(peer, block), "block" if block else "unblock")


def _resolve(ref: str | NodeAddrs) -> NodeAddrs:
    if isinstance(ref, NodeAddrs):
        return ref
    from lab.cluster import find_node  # late: cluster imports this module

    return find_node(ref)


def block_fabric(a: str | NodeAddrs, b: str | NodeAddrs) -> None:
    """Drop all traffic between the fabric (and spare) addresses of nodes a and b."""
    na, nb = _resolve(a), _resolve(b)
    if na.name == nb.name:
        raise LabError("block-fabric needs two different nodes")
    _apply(na, nb, True)
    _apply(nb, na, True)


def unblock_fabric(a: str | NodeAddrs, b: str | NodeAddrs) -> None:
    na, nb = _resolve(a), _resolve(b)
    _apply(na, nb, False)
    _apply(nb, na, False)


def throttle_fabric(ref: str | NodeAddrs, rate: str) -> None:
    """Cap what a node sends on its fabric interface (`tc` tbf, e.g. rate "400mbit"): a slow
    link, and a copy that a test can interrupt at a point it chooses. Replaces any cap."""
    _node_sh(_resolve(ref), f"tc qdisc replace dev {config.FABRIC_IFNAME} root tbf rate "
             f"{shlex.quote(rate)} burst 256kb latency 400ms", "throttle")


def unthrottle_fabric(ref: str | NodeAddrs) -> None:
    """Remove throttle_fabric's cap (idempotent)."""
    _node_sh(_resolve(ref), f"tc qdisc del dev {config.FABRIC_IFNAME} root 2>/dev/null || true",
             "unthrottle")
