"""Bring the lab up and down: networks, node containers, keys, inner image, model, stack file.

Library entry points (used by the CLI, integration tests and benchmarks):
`up(UpOptions)`, `down()`, `info()`, `status()`, `find_node()`, `ssh_argv()`,
`block_fabric()` / `unblock_fabric()` (in lab.fabric, re-exported here).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.render.commands import TCP_CONNECT_PY
from lab import config, egress, images, keys, model, nodes, stackfile
from lab.config import NodeAddrs
from lab.fabric import block_fabric as block_fabric  # re-export
from lab.fabric import throttle_fabric as throttle_fabric
from lab.fabric import unblock_fabric as unblock_fabric
from lab.fabric import unthrottle_fabric as unthrottle_fabric
from lab.run import LabError, Progress, docker, docker_ok, exclusive, run


@dataclass(frozen=True)
class UpOptions:
    nodes: int = config.DEFAULT_NODES
    mgmt_subnet: str = config.DEFAULT_MGMT_SUBNET
    fabric_subnet: str = config.DEFAULT_FABRIC_SUBNET
    stack: str = config.DEFAULT_STACK
    tp: int | None = None  # default: one rank per node
    pp: int = 1
    quiet: bool = False
    # the vLLM release the simulator plays (lab/vllm_sim/README.md); another than the default
    # is served by its own image tag (images.inner_image_tag)
    sim_vllm_version: str = config.SIM_VLLM_VERSION
    backend: str = "ray"  # the stack's backend: ray or native (no Ray)
    model_bytes: int = config.LAB_MODEL_BYTES  # the generated model's size (the tests': small)


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
            "--label", config.LAB_LABEL, name]
    if internal:
        # Docker 20.10 picks a container's default gateway by network name order: without
        # --internal, "fabric" would steal the default route from "mgmt" (docker 20.10 picks the gateway by network name order).
        argv.insert(2, "--internal")
    docker(*argv)


# --- up / down / info --------------------------------------------------------------------

def up(opts: UpOptions = UpOptions()) -> LabInfo:
    """Create or converge the lab to opts; idempotent and fast when nothing changed."""
    if not 1 <= opts.nodes <= config.MAX_NODES:
        raise LabError(f"--nodes must be within 1..{config.MAX_NODES}")
    p = Progress(quiet=opts.quiet)
    with exclusive(_lock_file(), "up/down", p):
        return _up(opts, p)


def _lock_file() -> Path:
    # Per lab, not per clone: a lab's containers and networks are the machine's (two clones'
    # `up` of lab 1 must not interleave), and another lab's are not this lab's business.
    return Path(f"/tmp/{config.LAB_PREFIX}.lock")


def _images_lock() -> Path:
    # Machine-wide: the images are every lab's.
    return Path(f"/tmp/{config.PREFIX}-images.lock")


def _up(opts: UpOptions, p: Progress) -> LabInfo:
    want = [config.node_addrs(i, opts.mgmt_subnet, opts.fabric_subnet) for i in range(1, opts.nodes + 1)]
    with p.step("host (packages, dockerd)"):
        ensure_host(p)
    with p.step("images"), exclusive(_images_lock(), "image build", p):
        node_image = images.ensure_node_image(p)
        inner = images.ensure_inner_image(p, vllm_version=opts.sim_vllm_version)
        inner_id = images.image_id(inner)
    with p.step("networks"):
        ensure_network(config.MGMT_NET, opts.mgmt_subnet, internal=False)
        ensure_network(config.FABRIC_NET, opts.fabric_subnet, internal=True)
        egress.block(opts.mgmt_subnet)
    with p.step("ssh keys"):
        host_keys = {n.name: keys.ensure_node_keys(n.name) for n in want}
        keys.write_client_files(want)
    with p.step(f"nodes ({opts.nodes})"):
        for idx in nodes.existing_indexes():
            if idx > opts.nodes:
                nodes.remove_node(idx)
                p.say(f"  {config.node_name(idx)}: removed")
        for n in want:
            action = nodes.start_node(n, node_image)
            if action != "running":
                p.say(f"  {n.name}: {action} (mgmt {n.mgmt_ip}, fabric {n.fabric_ip} +{n.spare_ip})")
    with p.step("wait for ssh + inner dockerd"):
        ids = nodes.wait_ready(want, p, image=inner)
    stale = [n for n in want if ids.get(n.name) != inner_id]
    if stale:
        with p.step(f"load {inner} into {', '.join(n.name for n in stale)}"):
            nodes.load_inner_image(stale, inner)
    # Weights for vllm-sim to check where the head runs (a generated model, not a real one);
    # workers get theirs the way the program stages them.
    with p.step(f"model {config.LAB_MODEL} on {want[0].name}"):
        p.say(f"  {model.describe(model.ensure(want[0], size=opts.model_bytes))}")
    with p.step("stack file"):
        tp = opts.tp if opts.tp is not None else opts.nodes
        path = stackfile.write(opts.stack, want, host_keys, tp=tp, pp=opts.pp, image=inner,
                               backend=opts.backend)
    p.say(f"lab up: {opts.nodes} node(s) in {p.elapsed():.1f}s; stack file {path.relative_to(config.REPO_DIR)}")
    return LabInfo(want, opts.mgmt_subnet, opts.fabric_subnet, opts.stack, dict(p.timings))


def build_images(quiet: bool = False) -> dict[str, str | None]:
    """Every image the lab runs, built unless current: the node image, vllm-sim for each
    vLLM release it plays, and the gateway of several models (CI builds them beside the
    engine's build, before the tests)."""
    p = Progress(quiet=quiet)
    with exclusive(_images_lock(), "image build", p), p.step("images"):
        tags = [images.ensure_node_image(p)]
        tags += [images.ensure_inner_image(p, vllm_version=v)
                 for v in (config.SIM_VLLM_VERSION, config.LEGACY_SIM_VLLM_VERSION)]
        tags.append(images.ensure_gateway_image(p))
    return {tag: images.image_id(tag) for tag in tags}


def down(keep_volumes: bool = False, quiet: bool = False) -> dict[str, float]:
    """Remove every container, network (and volume) of this lab (labelled
    spark-vllm-lab=<instance>, config.LAB_LABEL); nothing else, not another lab's."""
    p = Progress(quiet=quiet)
    if not docker_ok("info"):
        p.say("docker not running: nothing to remove")
        return {}
    with exclusive(_lock_file(), "up/down", p):
        return _down(keep_volumes, p)


def _down(keep_volumes: bool, p: Progress) -> dict[str, float]:
    flt = f"label={config.LAB_LABEL}"
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


# A graceful reboot's shutdown budget: the node's dockerd stops its containers (their own
# stop timeout is Docker's default 10 s) before the node itself is stopped.
REBOOT_STOP_S = 25


def reboot(refs: list[str], hard: bool = False, quiet: bool = False) -> float:
    """Reboot lab nodes as a Spark reboots: the node's dockerd stops (gracefully, or at once
    with `hard`: a power cut), every inner container stops and, having no restart policy,
    stays stopped; the node boots again with its disk (/var/lib/docker) kept, sshd and dockerd
    come back on the same addresses. Returns seconds until every node answers again."""
    p = Progress(quiet=quiet)
    t0 = time.monotonic()
    with p.step(f"{'power-cycle' if hard else 'reboot'} {', '.join(refs)}"):
        power_off(refs, hard=hard)
        power_on(refs, p)
    return time.monotonic() - t0


def power_off(refs: list[str], hard: bool = False) -> None:
    """Shut nodes down (gracefully: dockerd stops its containers first) and leave them off:
    their addresses stop answering, as a Spark that is switched off."""
    names = [find_node(r).container for r in refs]
    if hard:
        _parallel(["kill"], names)
    else:
        _parallel(["stop", "--time", str(REBOOT_STOP_S)], names)


def power_on(refs: list[str], progress: Progress | None = None) -> None:
    """Boot nodes that are off; returns once sshd and dockerd answer on each, and its fabric
    carries TCP both ways between it and every other running node."""
    targets = [find_node(r) for r in refs]
    _parallel(["start"], [n.container for n in targets])
    nodes.wait_ready(targets, progress or Progress(quiet=True))
    wait_fabric(targets)


FABRIC_BOOT_DEADLINE_S = 60


def wait_fabric(booted: list[NodeAddrs], deadline_s: float = FABRIC_BOOT_DEADLINE_S) -> float:
    """A booted node is back when its fabric is: wait until a TCP connect (to sshd, port 22)
    goes through from each booted node to every other running node's fabric address, and back.
    Returns the seconds waited; raises naming each pair that still fails at the deadline."""
    running = [n for n in info().nodes
               if ((nodes.container_state(n.container) or {}).get("State") or {}).get("Running")]
    pairs = {(a.name, b.name): (a, b) for t in booted for o in running if o.name != t.name
             for a, b in ((t, o), (o, t))}
    t0 = time.monotonic()
    failing: dict[tuple[str, str], str] = {}
    while True:
        failing = {}
        for key, (src, dst) in pairs.items():
            # sshd's port on the fabric address, with the worker's own probe
            proc = run(["docker", "exec", src.container, "python3", "-c", TCP_CONNECT_PY,
                        dst.fabric_ip, "22", "2"], check=False, timeout=30)
            if proc.returncode != 0:
                failing[key] = (proc.stderr.strip() or proc.stdout.strip())[-200:]
        if not failing:
            return time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            raise LabError("after the boot, the fabric does not carry TCP between: " + "; ".join(
                f"{a} -> {b} ({pairs[(a, b)][1].fabric_ip}:22): {why}"
                for (a, b), why in failing.items()))
        time.sleep(0.5)


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
    found = []
    for idx in nodes.existing_indexes():
        state = nodes.container_state(config.container_name(idx))
        if state is None:
            continue
        lab = state["Config"].get("Labels") or {}
        found.append(NodeAddrs(
            index=idx, name=lab[config.LABEL_NODE], container=config.container_name(idx),
            mgmt_ip=lab["spark-vllm-lab.mgmt-ip"], fabric_ip=lab["spark-vllm-lab.fabric-ip"],
            spare_ip=lab["spark-vllm-lab.spare-ip"], docker_bip=lab["spark-vllm-lab.docker-bip"],
        ))
    return LabInfo(found, _network_subnet(config.MGMT_NET), _network_subnet(config.FABRIC_NET), stack)


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
        st = nodes.container_state(n.container)
        running = bool(st and st["State"]["Running"])
        fabric = _net_ip(st or {}, config.FABRIC_NET)
        if running:
            ok, img = nodes.ready_probe(n)
            ssh = "ssh+docker ok" if ok else "ssh DOWN"
            image = ("image current" if img == inner_id else "image STALE" if img else "image MISSING") if ok else ""
        else:
            ssh, image = "", ""
        state = st["State"]["Status"] if st else "missing"
        lines.append(f"{n.name:8} {state:8} mgmt {n.mgmt_ip:15} fabric {fabric or n.fabric_ip} "
                     f"(+{n.spare_ip}) on {config.FABRIC_IFNAME}  {ssh}  {image}".rstrip())
    return lines
