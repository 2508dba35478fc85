"""What every contender and scenario shares: the lab as the bench sees it, commands with a
deadline, SSH to a node, the /health wait, and what changed on the nodes (restart counting)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab import cluster, keys

REPO = Path(__file__).resolve().parents[1]
WORK_DIR = REPO / ".lab" / "bench"  # scratch: launcher yaml, logs, Ray's local state (gitignored)
LOG_DIR = WORK_DIR / "logs"

# The stack every spark-vllm run uses (its own, so the integration tests' `lab` stack and its
# state are never touched); the lab writes stacks/Pulumi.bench.yaml for it.
STACK = "bench"
API_PORT = 8000
# Host-side /health poll: short enough not to hide a contender's own speed.
HEALTH_POLL_S = 0.25
# Bound of one serving wait; vllm-sim loads in ~3 s, so minutes here mean something is broken.
SERVE_TIMEOUT_S = 180.0

_T0 = time.monotonic()


def say(msg: str) -> None:
    """A progress line: wall clock and seconds since the bench started."""
    print(f"[bench {time.strftime('%H:%M:%S')} +{time.monotonic() - _T0:6.0f}s] {msg}",
          flush=True)


class BenchError(RuntimeError):
    """A step of a scenario failed; the record keeps the message."""


@dataclass(frozen=True)
class Node:
    name: str
    mgmt_ip: str  # SSH and the API endpoint (what the operator's machine reaches)
    fabric_ip: str  # Ray's identity on every contender


@dataclass(frozen=True)
class Lab:
    nodes: tuple[Node, ...]

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def health_url(self) -> str:
        return f"http://{self.head.mgmt_ip}:{API_PORT}/health"


def lab_up(n: int) -> Lab:
    """Converge the lab to n nodes (idempotent) and describe it."""
    say(f"lab up --nodes {n} --stack {STACK}")
    cluster.up(cluster.UpOptions(nodes=n, stack=STACK, quiet=True))
    return current_lab()


def current_lab() -> Lab:
    found = cluster.info(STACK).nodes
    return Lab(tuple(Node(x.name, x.mgmt_ip, x.fabric_ip) for x in found))


@dataclass
class Result:
    """One finished command: exit code, output tail, seconds."""

    rc: int
    out: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, lines: int = 12) -> str:
        return "\n".join(self.out.strip().splitlines()[-lines:])


def run(argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None,
        cwd: Path = REPO, stdin: str | None = None, log: Path | None = None) -> Result:
    """argv with a deadline; stdout+stderr captured (and kept in `log`); never raises on rc."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(list(argv), cwd=cwd, env=env, input=stdin, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        rc, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, out = 124, partial + f"\n[bench] timed out after {timeout:.0f} s: {shlex.join(argv)}"
    res = Result(rc, out, time.monotonic() - t0)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"\n$ {shlex.join(argv)}  # rc={rc} {res.seconds:.2f}s\n{out}")
    return res


def ssh(node: Node, script: str, *, timeout: float = 60, log: Path | None = None) -> Result:
    """One SSH round-trip running `script` in the node's shell (lab key, pinned host key)."""
    return run(keys.ssh_argv(node.mgmt_ip, script), timeout=timeout, log=log)


# How a node reaches another node with the lab's key: the key goes on stdin into a 0600 temp
# file on the node (never into a command line, which `ps` on the node would show), removed on
# exit; the script uses $RSH (an ssh command line) and the other node's fabric IP.
_WITH_KEY = "\n".join([
    "set -e; k=$(mktemp); trap 'rm -f $k' EXIT; chmod 600 $k; cat > $k",
    'RSH="ssh -i $k -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no '
    '-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"',
])


def ssh_with_lab_key(node: Node, script: str, *, timeout: float = 60,
                     log: Path | None = None) -> Result:
    """`script` on `node`, able to reach the other nodes with `$RSH root@<ip> …`."""
    return run(keys.ssh_argv(node.mgmt_ip, f"{_WITH_KEY}\n{script}"), timeout=timeout,
               stdin=keys.client_key().read_text(), log=log)


def on_nodes(nodes: Sequence[Node], script_for: Any, *, timeout: float = 60,
             log: Path | None = None) -> list[Result]:
    """`script_for(node)` on every node at once; results in node order."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return list(pool.map(lambda n: ssh(n, script_for(n), timeout=timeout, log=log), nodes))


def health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_health(url: str, timeout: float = SERVE_TIMEOUT_S) -> float:
    """Seconds until GET url answers 200; BenchError after `timeout`."""
    t0 = time.monotonic()
    while not health_ok(url):
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"{url} not 200 within {timeout:.0f} s")
        time.sleep(HEALTH_POLL_S)
    return time.monotonic() - t0


# --- what ran on the nodes ---------------------------------------------------------------

# Per node: every running container (id, start time, name), the raylet PIDs and the `vllm serve`
# PIDs. A node's dockerd runs its containers' processes in child PID namespaces, so pgrep on
# the node sees them all. The [x] in the patterns keeps this very shell out of the match.
_SNAPSHOT_SH = "\n".join([
    'ids=$(docker ps -q --no-trunc)',
    '[ -z "$ids" ] || docker inspect -f "{{.Id}} {{.State.StartedAt}} {{.Name}}" $ids',
    "echo --",
    "pgrep -f '[r]aylet/raylet' | tr '\\n' ' '; echo",
    "echo --",
    "pgrep -x vllm | tr '\\n' ' '; echo",
])


@dataclass
class NodeState:
    containers: dict[str, str] = field(default_factory=dict)  # id -> StartedAt
    names: dict[str, str] = field(default_factory=dict)  # id -> name
    raylets: frozenset[str] = frozenset()
    vllm: frozenset[str] = frozenset()


def snapshot(lab: Lab) -> dict[str, NodeState]:
    out: dict[str, NodeState] = {}
    for node, res in zip(lab.nodes, on_nodes(lab.nodes, lambda _n: _SNAPSHOT_SH, timeout=30),
                         strict=True):
        parts = res.out.split("--\n")
        st = NodeState()
        if res.ok and len(parts) == 3:
            for line in parts[0].splitlines():
                bits = line.split()
                if len(bits) == 3:
                    st.containers[bits[0]] = bits[1]
                    st.names[bits[0]] = bits[2].lstrip("/")
            st.raylets = frozenset(parts[1].split())
            st.vllm = frozenset(parts[2].split())
        out[node.name] = st
    return out


def restarts(before: dict[str, NodeState], after: dict[str, NodeState]) -> dict[str, Any]:
    """What a step restarted: containers started anew (new id or new start time), containers
    gone, nodes whose Ray runtime restarted (raylet PIDs changed), vLLM restarted."""
    started: list[str] = []
    removed = 0
    ray_nodes: list[str] = []
    vllm = False
    for name, b in before.items():
        a = after.get(name, NodeState())
        for cid, at in a.containers.items():
            if b.containers.get(cid) != at:
                started.append(f"{name}/{a.names.get(cid, cid[:12])}")
        removed += sum(1 for cid in b.containers if cid not in a.containers)
        if b.raylets and a.raylets != b.raylets:
            ray_nodes.append(name)
        vllm = vllm or bool(b.vllm and a.vllm != b.vllm)
    ray_containers = [s for s in started if "ray" in s.split("/", 1)[1]]
    return {
        "containers_started": len(started),
        "containers_removed": removed,
        "ray_containers_started": len(ray_containers),
        "ray_restarted_nodes": len(ray_nodes),
        "vllm_restarted": vllm,
        "started": started,
    }


def running_containers(lab: Lab) -> int:
    return sum(len(s.containers) for s in snapshot(lab).values())


def dump_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def python() -> str:
    return sys.executable


def venv_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The bench's own environment with the venv's bin first (ray, pulumi SDK scripts)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(extra or {})
    return env
