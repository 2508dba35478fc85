"""Builders of the fabric check's node command: spec in, argv and POSIX sh out. Pure.

On every node at once, a short-lived container of the serving image runs
scripts/fabric_check.py (sent on the command's stdin, passed to `docker run -i`) with the env
that node's ranks get (commands.node_env) and one rank: the node's index. Rank 0 is nodes[0],
whose identity IP hosts the rendezvous. The container is `--rm`, named per stack, removed by a
trap whatever ends the command, and bounded by `timeout` over the script's own deadline: it
never outlives the check. The command always exits 0 once the container ended: the script's
JSON line (or its absence, said on stderr with docker's exit) is the verdict's to read
(components/fabric_verdict.py parse_report, verdict), so one node's failure never hides the
others' reports.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import Any

from ..spec import ClusterSpec, NodeSpec
from . import commands

ROLE = "fabric-check"
# docker's start and the container's exit over the script's own deadline
DOCKER_MARGIN_S = 30
# the rendezvous: a port of the head beside masterPort, free while no rank runs (masterPort
# itself may still be held by the ranks the check runs before, on a replacement)
PORT_OFFSET = 10


def needed(spec: ClusterSpec) -> bool:
    """A fabric to check: two nodes or more (the script refuses a world of one)."""
    return len(spec.nodes) > 1


def backend(spec: ClusterSpec) -> str:
    """NCCL where the nodes have GPUs, gloo where they have none (the lab)."""
    return "gloo" if spec.docker_gpus == "none" else "nccl"


def port(spec: ClusterSpec) -> int:
    p = spec.master_port + PORT_OFFSET
    return p if p <= 65535 else spec.master_port - PORT_OFFSET


def script_args(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    """scripts/fabric_check.py's arguments on `node`."""
    fc = spec.fabric_check
    return ["--rank", str(spec.nodes.index(node)), "--world-size", str(len(spec.nodes)),
            "--master-addr", spec.head.identity_ip, "--master-port", str(port(spec)),
            "--backend", backend(spec), "--node", node.name,
            "--bandwidth-bytes", str(fc.bandwidth_message * 2**20),
            "--deadline", str(fc.timeout)]


def docker_argv(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    argv = ["docker", "run", "--rm", "-i", "--name", commands.container_name(spec, ROLE),
            "--label", f"{commands.LABEL}.stack={spec.stack}",
            "--label", f"{commands.LABEL}.role={ROLE}",
            "--label", f"{commands.LABEL}.node={node.name}",
            "--network", "host", "--ipc", "host", "--shm-size", spec.shm_size]
    if spec.docker_gpus != "none":
        argv += ["--gpus", spec.docker_gpus]
    for key, value in commands.node_env(spec, node).items():
        argv += ["--env", f"{key}={value}"]
    return [*argv, "--entrypoint", "python3", spec.image, "-", *script_args(spec, node)]


def node_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """The node's command; its stdin is `script()`."""
    name = shlex.quote(commands.container_name(spec, ROLE))
    bound = spec.fabric_check.timeout + DOCKER_MARGIN_S
    return "\n".join([
        *commands.prelude(spec, node, "fabric check"),
        f"name={name}",
        'gone() { docker rm -f "$name" >/dev/null 2>&1 || true; }',
        "gone",  # a killed earlier run's container
        "trap gone EXIT",
        "trap 'exit 1' HUP INT TERM PIPE",
        "rc=0",
        f"timeout --kill-after=5 {bound} {shlex.join(docker_argv(spec, node))} || rc=$?",
        # the script's own: 1 a phase failed, 2 arguments, 3 its deadline, 4 it could not run
        # there; docker run's: 125-127; timeout's: 124 (past the bound), 137 (killed)
        'if [ "$rc" != 0 ]; then log "the check ended with exit $rc"; fi',
        "exit 0",
    ]) + "\n"


def script() -> str:
    """What the node command sends on stdin: the check itself."""
    return commands.script_text("fabric_check.py")


def triggers(spec: ClusterSpec) -> dict[str, Any]:
    """What the check's result depends on: it runs again when one changes (identities,
    interfaces, HCAs, the image, each node's env, its own settings and script), never on a
    no-op `up`. The rank order is the nodes' order (rank 0 hosts the rendezvous)."""
    return {"image": spec.image, **({"imageDigest": spec.image_digest}
                                    if spec.image_digest else {}),
            "backend": backend(spec), "port": port(spec),
            "nodes": [{"name": n.name, "identity": n.identity_ip,
                       "interface": n.fabric_interface, "ibHca": n.ib_hca,
                       "env": commands.node_env(spec, n)} for n in spec.nodes],
            "settings": spec.fabric_check.model_dump(by_alias=True),
            "script": hashlib.sha256(script().encode()).hexdigest()[:16]}
