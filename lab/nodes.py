"""Node containers: create/recreate/start them, wait until they answer, ship them the image.

A node is `docker create` on mgmt → `docker network connect` fabric → `docker cp` its SSH
keys → `docker start` (the entrypoint renames the fabric interface, so it must see both
networks at start). Everything here is keyed by the node's labels, so `up` can tell a current
node from one made by another image, other addresses or other keys.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from lab import config, images, keys
from lab.config import NodeAddrs
from lab.run import DOCKER_ENV, LabError, Progress, docker, run


def labels(n: NodeAddrs) -> dict[str, str]:
    return {
        config.LABEL: config.LABEL_VALUE,
        config.LABEL_NODE: n.name,
        config.LABEL_INDEX: str(n.index),
        "spark-vllm-lab.mgmt-ip": n.mgmt_ip,
        "spark-vllm-lab.fabric-ip": n.fabric_ip,
        "spark-vllm-lab.spare-ip": n.spare_ip,
        "spark-vllm-lab.docker-bip": n.docker_bip,
        "spark-vllm-lab.keys": keys.fingerprint(n.name),
    }


HF_HOME = "/root/.cache/huggingface"  # the lab stack's hfCache


def hf_volume_name(index: int) -> str:
    return f"{config.volume_name(index)}-hf"


def create_node_argv(n: NodeAddrs, image: str) -> list[str]:
    """`docker create` of one node: --privileged emulated, since plain --privileged fails on
    this VM ("unable to apply caps": root lacks CAP_SYS_RESOURCE)."""
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
        # The model cache, as a Spark keeps it across reinstalls: a node recreated between test
        # modules (`down --keep-volumes`) still holds the weights it was given.
        "-v", f"{hf_volume_name(n.index)}:{HF_HOME}",
        "-e", f"LAB_FABRIC_IP={n.fabric_ip}",
        "-e", f"LAB_FABRIC_SPARE_IP={n.spare_ip}",
        "-e", f"LAB_FABRIC_IFNAME={config.FABRIC_IFNAME}",
        "-e", f"LAB_DOCKER_BIP={n.docker_bip}",
    ]
    for k, v in labels(n).items():
        argv += ["--label", f"{k}={v}"]
    return [*argv, image]


def container_state(name: str) -> dict[str, Any] | None:
    out = docker("container", "inspect", name, check=False)
    if not out.startswith("["):
        return None
    data: list[dict[str, Any]] = json.loads(out)
    return data[0] if data else None


def _node_is_current(state: dict[str, Any], n: NodeAddrs, image: str) -> bool:
    have = state["Config"].get("Labels") or {}
    return state["Config"]["Image"] == image and all(have.get(k) == v for k, v in labels(n).items())


def remove_node(index: int, keep_volume: bool = False) -> None:
    docker("rm", "-f", "-v", config.container_name(index), check=False)
    if not keep_volume:
        docker("volume", "rm", "-f", config.volume_name(index), hf_volume_name(index),
               check=False)


def start_node(n: NodeAddrs, image: str) -> str:
    """Create or reuse node n; returns what was done (for progress lines)."""
    state = container_state(n.container)
    if state is not None and not _node_is_current(state, n, image):
        remove_node(n.index, keep_volume=True)  # new node image or addresses: recreate
        state = None
        action = "recreated"
    else:
        action = "created"
    if state is None:
        for volume in (config.volume_name(n.index), hf_volume_name(n.index)):
            docker("volume", "create", "--label", config.LAB_LABEL, volume)
        run(create_node_argv(n, image))
        docker("cp", f"{keys.node_dir(n.name)}/.", f"{n.container}:/lab/ssh")
        docker("network", "connect", "--ip", n.fabric_ip, config.FABRIC_NET, n.container)
        docker("start", n.container)
        return action
    if not state["State"]["Running"]:
        docker("start", n.container)
        return "started"
    return "running"


def ready_probe(n: NodeAddrs, image: str = config.INNER_IMAGE) -> tuple[bool, str | None]:
    """(node ready, id of the inner image `image` on it) over one SSH round trip."""
    script = ("test -f /run/lab-node-ready || exit 3; "
              f"docker image inspect -f '{{{{.Id}}}}' {image} 2>/dev/null || true")
    proc = run(keys.ssh_argv(n.mgmt_ip, script, connect_timeout=2), check=False, timeout=15)
    if proc.returncode != 0:
        return False, None
    out = proc.stdout.strip()
    return True, out if out.startswith("sha256:") else None


def wait_ready(nodes: list[NodeAddrs], progress: Progress,
               timeout_s: float = config.SSH_READY_TIMEOUT_S,
               image: str = config.INNER_IMAGE) -> dict[str, str | None]:
    """Wait until every node answers SSH with sshd and dockerd up; returns inner image ids."""
    t0 = time.monotonic()
    pending = {n.name: n for n in nodes}
    ids: dict[str, str | None] = {}
    last_report = 0.0
    while pending:
        for name, n in list(pending.items()):
            ok, img = ready_probe(n, image)
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


def _saved_inner_image(image: str) -> Path:
    """`docker save` of a simulator image, cached by image id (one save per build)."""
    img = images.image_id(image)
    if img is None:
        raise LabError(f"{image} is not built")
    cache = config.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"spark-vllm-sim-{img.split(':')[1][:12]}.tar"
    if not path.exists():
        for old in cache.glob("spark-vllm-sim-*.tar"):
            if old.stat().st_mtime < time.time() - 3600:  # keep the other variant's save
                old.unlink()
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            subprocess.run(["docker", "save", image], stdout=fh, check=True,
                           env=DOCKER_ENV, timeout=600)
        tmp.replace(path)
    return path


def load_inner_image(nodes: list[NodeAddrs], image: str = config.INNER_IMAGE) -> None:
    """`docker save | ssh root@NODE docker load`, as an operator would ship an image.

    The time goes into each node's dockerd unpacking the layers (≈15 s for one node, about
    the same for two in parallel from a file). Streaming `docker save` at the same time
    competes for the 2 cores (≈34 s for two), so the save goes to a file first (≈5 s, cached
    per image id) and the nodes load from it in parallel."""
    if not nodes:
        return
    tar = _saved_inner_image(image)
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
        raise LabError(f"loading {image} failed: " + "; ".join(errors))
    # The previous simulator image (now untagged) would pile up in the nodes' volumes.
    for n in nodes:
        run(keys.ssh_argv(n.mgmt_ip, ["docker", "image", "prune", "-f"]), check=False, timeout=60)


def existing_indexes() -> list[int]:
    out = docker("ps", "-a", "--filter", f"label={config.LAB_LABEL}", "--filter",
                 f"label={config.LABEL_INDEX}", "--format", f'{{{{.Label "{config.LABEL_INDEX}"}}}}')
    return sorted(int(x) for x in out.split() if x.isdigit())
