"""Bring the lab up and down: networks, node containers, keys, inner image, stack file.

Library entry points (used by the CLI, integration tests and benchmarks):
`up(UpOptions)`, `down()`, `info()`, `status()`, `find_node()`, `ssh_argv()`,
`block_fabric()` / `unblock_fabric()` (in lab.fabric, re-exported here).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab import config, egress, images, keys, stackfile
from lab.config import NodeAddrs
from lab.fabric import block_fabric as block_fabric  # re-export
from lab.fabric import unblock_fabric as unblock_fabric
from lab.run import DOCKER_ENV, LabError, Progress, docker, docker_ok, exclusive, run


@dataclass(frozen=True)
class UpOptions:
    nodes: int = config.DEFAULT_NODES
    mgmt_subnet: str = config.DEFAULT_MGMT_SUBNET
    fabric_subnet: str = config.DEFAULT_FABRIC_SUBNET
    stack: str = config.DEFAULT_STACK
    tp: int | None = None  # default: one rank per node
    pp: int = 1
    quiet: bool = False


@dataclass
class LabInfo:
    """What tests and benchmarks need to reach the lab (`python -m lab info --json`)."""

    nodes: list[NodeAddrs]
    mgmt_subnet: str | None
    fabric_subnet: str | None
    stack: str = config.DEFAULT_STACK
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "index": n.index,
                    "name": n.name,
                    "container": n.container,
                    "mgmtIp": n.mgmt_ip,
                    "fabricIp": n.fabric_ip,
                    "spareFabricIp": n.spare_ip,
                    "dockerBip": n.docker_bip,
                    "user": keys.USER,
                    "port": 22,
                    "fabricInterface": config.FABRIC_IFNAME,
                    "hostKey": _host_key_or_none(n.name),
                }
                for n in self.nodes
            ],
            "mgmtSubnet": self.mgmt_subnet,
            "fabricSubnet": self.fabric_subnet,
            "mgmtNetwork": config.MGMT_NET,
            "fabricNetwork": config.FABRIC_NET,
            "innerImage": config.INNER_IMAGE,
            "nodeImage": images.node_image(),
            "sshKey": str(keys.client_key()),
            "sshPublicKey": f"{keys.client_key()}.pub",
            "knownHosts": str(keys.known_hosts()),
            "sshConfig": str(keys.ssh_config()),
            "stackFile": str(config.stack_file(self.stack)),
            "timings": self.timings,
        }


def _host_key_or_none(name: str) -> str | None:
    try:
        return keys.public_key(keys.node_dir(name) / "ssh_host_ed25519_key")
    except OSError:
        return None


# --- host --------------------------------------------------------------------------------

def ensure_host(progress: Progress) -> None:
    """Host packages and a running dockerd (both scripts return at once when all is there)."""
    for script in ("system-deps.sh", "dockerd.sh"):
        proc = subprocess.run(["bash", str(config.LAB_DIR / script)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabError(f"lab/{script} failed:\n{proc.stdout}{proc.stderr}")
        if "already" not in proc.stdout and "all present" not in proc.stdout:
            progress.say(proc.stdout.strip().splitlines()[-1])


# --- networks ----------------------------------------------------------------------------

def _network_subnet(name: str) -> str | None:
    out = docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", name, check=False)
    return out.split()[0] if out.strip() and "/" in out else None


def ensure_network(name: str, subnet: str, internal: bool) -> None:
    have = _network_subnet(name)
    if have == subnet:
        return
    if have is not None:
        raise LabError(f"network {name} exists with subnet {have}, not {subnet}: "
                       "run `python -m lab down` first")
    argv = ["network", "create", "--driver", "bridge", "--subnet", subnet,
            "--label", f"{config.LABEL}=1", name]
    if internal:
        # Docker 20.10 picks a container's default gateway by network name order: without
        # --internal, "fabric" would steal the default route from "mgmt" (LAB-NOTES "Networks").
        argv.insert(2, "--internal")
    docker(*argv)


# --- nodes -------------------------------------------------------------------------------

def _labels(n: NodeAddrs) -> dict[str, str]:
    return {
        config.LABEL: "1",
        config.LABEL_NODE: n.name,
        config.LABEL_INDEX: str(n.index),
        "spark-vllm-lab.mgmt-ip": n.mgmt_ip,
        "spark-vllm-lab.fabric-ip": n.fabric_ip,
        "spark-vllm-lab.spare-ip": n.spare_ip,
        "spark-vllm-lab.docker-bip": n.docker_bip,
        "spark-vllm-lab.keys": keys.fingerprint(n.name),
    }


def create_node_argv(n: NodeAddrs, image: str) -> list[str]:
    """`docker create` of one node: --privileged emulated, since plain --privileged fails on
    this VM ("unable to apply caps": root lacks CAP_SYS_RESOURCE; LAB-NOTES "Nodes")."""
    argv = [
        "docker", "create", "--name", n.container, "--hostname", n.name,
        "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--security-opt", "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm",
        "--network", config.MGMT_NET, "--ip", n.mgmt_ip,
        "--shm-size", "1g",
        "--stop-timeout", "5",
        # The inner overlay2 needs a non-overlay /var/lib/docker; a named volume also keeps
        # loaded images across lab restarts.
        "-v", f"{config.volume_name(n.index)}:/var/lib/docker",
        "-e", f"LAB_FABRIC_IP={n.fabric_ip}",
        "-e", f"LAB_FABRIC_SPARE_IP={n.spare_ip}",
        "-e", f"LAB_FABRIC_IFNAME={config.FABRIC_IFNAME}",
        "-e", f"LAB_DOCKER_BIP={n.docker_bip}",
    ]
    for k, v in _labels(n).items():
        argv += ["--label", f"{k}={v}"]
    return [*argv, image]


def _container_state(name: str) -> dict[str, Any] | None:
    out = docker("container", "inspect", name, check=False)
    if not out.startswith("["):
        return None
    data: list[dict[str, Any]] = json.loads(out)
    return data[0] if data else None


def _node_is_current(state: dict[str, Any], n: NodeAddrs, image: str) -> bool:
    labels = state["Config"].get("Labels") or {}
    return state["Config"]["Image"] == image and all(labels.get(k) == v for k, v in _labels(n).items())


def remove_node(index: int, keep_volume: bool = False) -> None:
    docker("rm", "-f", "-v", config.container_name(index), check=False)
    if not keep_volume:
        docker("volume", "rm", "-f", config.volume_name(index), check=False)


def start_node(n: NodeAddrs, image: str) -> str:
    """Create or reuse node n; returns what was done (for progress lines)."""
    state = _container_state(n.container)
    if state is not None and not _node_is_current(state, n, image):
        remove_node(n.index, keep_volume=True)  # new node image or addresses: recreate
        state = None
        action = "recreated"
    else:
        action = "created"
    if state is None:
        docker("volume", "create", "--label", f"{config.LABEL}=1", config.volume_name(n.index))
        run(create_node_argv(n, image))
        docker("cp", f"{keys.node_dir(n.name)}/.", f"{n.container}:/lab/ssh")
        docker("network", "connect", "--ip", n.fabric_ip, config.FABRIC_NET, n.container)
        docker("start", n.container)
        return action
    if not state["State"]["Running"]:
        docker("start", n.container)
        return "started"
    return "running"


def _ready_probe(n: NodeAddrs) -> tuple[bool, str | None]:
    """(node ready, id of the inner image on it) over one SSH round trip."""
    script = ("test -f /run/lab-node-ready || exit 3; "
              f"docker image inspect -f '{{{{.Id}}}}' {config.INNER_IMAGE} 2>/dev/null || true")
    proc = run(keys.ssh_argv(n.mgmt_ip, script, connect_timeout=2), check=False, timeout=15)
    if proc.returncode != 0:
        return False, None
    out = proc.stdout.strip()
    return True, out if out.startswith("sha256:") else None


def wait_ready(nodes: list[NodeAddrs], progress: Progress,
               timeout_s: float = config.SSH_READY_TIMEOUT_S) -> dict[str, str | None]:
    """Wait until every node answers SSH with sshd and dockerd up; returns inner image ids."""
    t0 = time.monotonic()
    pending = {n.name: n for n in nodes}
    ids: dict[str, str | None] = {}
    last_report = 0.0
    while pending:
        for name, n in list(pending.items()):
            ok, img = _ready_probe(n)
            if ok:
                ids[name] = img
                del pending[name]
        if not pending:
            break
        waited = time.monotonic() - t0
        if waited > timeout_s:
            logs = {name: docker("logs", "--tail", "15", n.container, check=False, timeout=10)
                    for name, n in pending.items()}
            detail = "\n".join(f"--- {k} (docker logs):\n{v}" for k, v in logs.items())
            raise LabError(f"nodes not ready after {timeout_s:.0f}s: {', '.join(pending)}\n{detail}")
        if waited - last_report >= 5:
            progress.say(f"  waiting for ssh+dockerd on {', '.join(pending)} ({waited:.0f}s)")
            last_report = waited
        time.sleep(0.3)
    return ids


def _saved_inner_image() -> Path:
    """`docker save` of the simulator image, cached by image id (one save per build)."""
    img = images.image_id(config.INNER_IMAGE)
    if img is None:
        raise LabError(f"{config.INNER_IMAGE} is not built")
    cache = config.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"spark-vllm-sim-{img.split(':')[1][:12]}.tar"
    if not path.exists():
        for old in cache.glob("spark-vllm-sim-*.tar"):
            old.unlink()
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            subprocess.run(["docker", "save", config.INNER_IMAGE], stdout=fh, check=True,
                           env=DOCKER_ENV, timeout=600)
        tmp.replace(path)
    return path


def load_inner_image(nodes: list[NodeAddrs]) -> None:
    """`docker save | ssh root@NODE docker load`, as an operator would ship an image.

    The time goes into each node's dockerd unpacking the layers (≈15 s for one node, about
    the same for two in parallel from a file). Streaming `docker save` at the same time
    competes for the 2 cores (≈34 s for two), so the save goes to a file first (≈5 s, cached
    per image id) and the nodes load from it in parallel."""
    if not nodes:
        return
    tar = _saved_inner_image()
    procs = {}
    for n in nodes:
        with tar.open("rb") as fh:
            procs[n.name] = subprocess.Popen(keys.ssh_argv(n.mgmt_ip, ["docker", "load", "-q"]),
                                             stdin=fh, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE)
    errors = []
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            errors.append(f"{name}: exit {proc.returncode} {err.decode(errors='replace').strip()}")
    if errors:
        raise LabError(f"loading {config.INNER_IMAGE} failed: " + "; ".join(errors))
    # The previous simulator image (now untagged) would pile up in the nodes' volumes.
    for n in nodes:
        run(keys.ssh_argv(n.mgmt_ip, ["docker", "image", "prune", "-f"]), check=False, timeout=60)


# --- up / down / info --------------------------------------------------------------------

def up(opts: UpOptions = UpOptions()) -> LabInfo:
    """Create or converge the lab to opts; idempotent and fast when nothing changed."""
    if not 1 <= opts.nodes <= config.MAX_NODES:
        raise LabError(f"--nodes must be within 1..{config.MAX_NODES}")
    p = Progress(quiet=opts.quiet)
    with exclusive(_lock_file(), "up/down", p):
        return _up(opts, p)


def _lock_file() -> Path:
    # Machine-wide, not per clone: the lab's containers and networks are.
    return Path("/tmp/spark-vllm-lab.lock")


def _up(opts: UpOptions, p: Progress) -> LabInfo:
    nodes = [config.node_addrs(i, opts.mgmt_subnet, opts.fabric_subnet) for i in range(1, opts.nodes + 1)]
    with p.step("host (packages, dockerd)"):
        ensure_host(p)
    with p.step("images"):
        node_image = images.ensure_node_image(p)
        images.ensure_inner_image(p)
        inner_id = images.image_id(config.INNER_IMAGE)
    with p.step("networks"):
        ensure_network(config.MGMT_NET, opts.mgmt_subnet, internal=False)
        ensure_network(config.FABRIC_NET, opts.fabric_subnet, internal=True)
        egress.block(opts.mgmt_subnet)
    with p.step("ssh keys"):
        host_keys = {n.name: keys.ensure_node_keys(n.name) for n in nodes}
        keys.write_client_files(nodes)
    with p.step(f"nodes ({opts.nodes})"):
        for idx in _existing_indexes():
            if idx > opts.nodes:
                remove_node(idx)
                p.say(f"  {config.node_name(idx)}: removed")
        for n in nodes:
            action = start_node(n, node_image)
            if action != "running":
                p.say(f"  {n.name}: {action} (mgmt {n.mgmt_ip}, fabric {n.fabric_ip} +{n.spare_ip})")
    with p.step("wait for ssh + inner dockerd"):
        ids = wait_ready(nodes, p)
    stale = [n for n in nodes if ids.get(n.name) != inner_id]
    if stale:
        with p.step(f"load {config.INNER_IMAGE} into {', '.join(n.name for n in stale)}"):
            load_inner_image(stale)
    with p.step("stack file"):
        tp = opts.tp if opts.tp is not None else opts.nodes
        path = stackfile.write(opts.stack, nodes, host_keys, tp=tp, pp=opts.pp)
    p.say(f"lab up: {opts.nodes} node(s) in {p.elapsed():.1f}s; stack file {path.relative_to(config.REPO_DIR)}")
    return LabInfo(nodes, opts.mgmt_subnet, opts.fabric_subnet, opts.stack, dict(p.timings))


def _existing_indexes() -> list[int]:
    out = docker("ps", "-a", "--filter", f"label={config.LABEL_INDEX}",
                 "--format", f'{{{{.Label "{config.LABEL_INDEX}"}}}}')
    return sorted(int(x) for x in out.split() if x.isdigit())


def down(keep_volumes: bool = False, quiet: bool = False) -> dict[str, float]:
    """Remove every container, network (and volume) labelled spark-vllm-lab=1; nothing else."""
    p = Progress(quiet=quiet)
    if not docker_ok("info"):
        p.say("docker not running: nothing to remove")
        return {}
    with exclusive(_lock_file(), "up/down", p):
        return _down(keep_volumes, p)


def _down(keep_volumes: bool, p: Progress) -> dict[str, float]:
    flt = f"label={config.LABEL}=1"
    with p.step("containers"):
        _parallel(["rm", "-f", "-v"], docker("ps", "-aq", "--filter", flt).split())
    with p.step("networks"):
        nets = docker("network", "ls", "-q", "--filter", flt).split()
        if nets:
            docker("network", "rm", *nets)
        egress.unblock_all()
    if not keep_volumes:
        # Each volume holds a node's /var/lib/docker (Ray's many small files): deleting them
        # one after the other is the slow part of `down`.
        with p.step("volumes"):
            _parallel(["volume", "rm", "-f"], docker("volume", "ls", "-q", "--filter", flt).split())
    p.say(f"lab down in {p.elapsed():.1f}s")
    return dict(p.timings)


def _parallel(cmd: list[str], items: list[str]) -> None:
    """`docker CMD ITEM` for every item at once (the CLI itself goes one by one)."""
    if not items:
        return
    with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
        list(pool.map(lambda item: docker(*cmd, item, timeout=300), items))


def _net_ip(state: dict[str, Any], net: str) -> str | None:
    nets = state.get("NetworkSettings", {}).get("Networks") or {}
    ip = (nets.get(net) or {}).get("IPAddress")
    return ip or None


def info(stack: str = config.DEFAULT_STACK) -> LabInfo:
    """The lab as it runs now (from the containers' labels); empty node list when down."""
    nodes = []
    for idx in _existing_indexes():
        state = _container_state(config.container_name(idx))
        if state is None:
            continue
        lab = state["Config"].get("Labels") or {}
        nodes.append(NodeAddrs(
            index=idx, name=lab[config.LABEL_NODE], container=config.container_name(idx),
            mgmt_ip=lab["spark-vllm-lab.mgmt-ip"], fabric_ip=lab["spark-vllm-lab.fabric-ip"],
            spare_ip=lab["spark-vllm-lab.spare-ip"], docker_bip=lab["spark-vllm-lab.docker-bip"],
        ))
    return LabInfo(nodes, _network_subnet(config.MGMT_NET), _network_subnet(config.FABRIC_NET), stack)


def find_node(ref: str) -> NodeAddrs:
    """A node by name (node-1), index (1), container name or any of its addresses."""
    for n in info().nodes:
        if ref in (n.name, str(n.index), n.container, n.mgmt_ip, n.fabric_ip, n.spare_ip):
            return n
    raise LabError(f"no lab node {ref!r} (see `python -m lab status`)")


def ssh_argv(node: str, remote: Sequence[str] | str = (), tty: bool | None = False) -> list[str]:
    """ssh argv for a lab node (see keys.ssh_argv for how `remote` is quoted)."""
    return keys.ssh_argv(find_node(node).mgmt_ip, remote, tty=tty)


def status() -> list[str]:
    """One line per node: container state, addresses, SSH + inner docker, simulator image."""
    lines = []
    inner_id = images.image_id(config.INNER_IMAGE)
    for n in info().nodes:
        st = _container_state(n.container)
        running = bool(st and st["State"]["Running"])
        fabric = _net_ip(st or {}, config.FABRIC_NET)
        if running:
            ok, img = _ready_probe(n)
            ssh = "ssh+docker ok" if ok else "ssh DOWN"
            image = ("image current" if img == inner_id else "image STALE" if img else "image MISSING") if ok else ""
        else:
            ssh, image = "", ""
        state = st["State"]["Status"] if st else "missing"
        lines.append(f"{n.name:8} {state:8} mgmt {n.mgmt_ip:15} fabric {fabric or n.fabric_ip} "
                     f"(+{n.spare_ip}) on {config.FABRIC_IFNAME}  {ssh}  {image}".rstrip())
    return lines


def repo_relative(p: Path) -> str:
    try:
        return str(p.relative_to(config.REPO_DIR))
    except ValueError:
        return str(p)
