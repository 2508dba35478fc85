"""Names, paths and addresses of the lab: one place per default."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
REPO_DIR = LAB_DIR.parent
INSTANCE_ENV = "SPARK_VLLM_LAB"
MAX_INSTANCE = 9


def instance() -> int:
    """Which lab of this machine: SPARK_VLLM_LAB=N (1..9; unset: 1, the lab as documented).
    CI runs two labs side by side (lab/test.sh); every name, address, lock and state below
    that two labs would share is derived from it (docs/development.md)."""
    raw = os.environ.get(INSTANCE_ENV, "").strip() or "1"
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_INSTANCE:
        raise ValueError(f"{INSTANCE_ENV}={raw!r}: must be a number within 1..{MAX_INSTANCE}")
    return int(raw)


INSTANCE = instance()
_SUFFIX = "" if INSTANCE == 1 else str(INSTANCE)  # lab 1's names are the documented ones
# gitignored: keys, known_hosts, ssh config, the file backend's state (lab/env.sh), logs
STATE_DIR = REPO_DIR / ".lab" if INSTANCE == 1 else REPO_DIR / ".lab" / f"lab{INSTANCE}"
SSH_DIR = STATE_DIR / "ssh"
STACKS_DIR = REPO_DIR / "stacks"


def cache_dir() -> Path:
    """Where the debootstrapped rootfs tarball is kept between labs."""
    base = os.environ.get("SPARK_VLLM_CACHE") or str(Path.home() / ".cache" / "spark-vllm")
    return Path(base) / "lab"


# `spark-vllm-lab=<instance>` on every container, network and volume a lab creates: a lab's
# `down` removes its own and leaves another's
LABEL = "spark-vllm-lab"
LABEL_VALUE = str(INSTANCE)
LAB_LABEL = f"{LABEL}={LABEL_VALUE}"  # as `--label` and `--filter label=` take it
LABEL_NODE = "spark-vllm-lab.node"  # node name (node-<i>) on node containers
LABEL_INDEX = "spark-vllm-lab.index"
LABEL_CONTENT = "spark-vllm-lab.content"  # content hash an image was built from

PREFIX = "spark-vllm-lab"  # the images', shared by every lab of the machine
LAB_PREFIX = PREFIX + _SUFFIX  # this lab's containers, networks and volumes
MGMT_NET = f"{LAB_PREFIX}-mgmt"
FABRIC_NET = f"{LAB_PREFIX}-fabric"
BASE_IMAGE = f"{PREFIX}-base:bookworm"
NODE_IMAGE_REPO = f"{PREFIX}-node"
INNER_IMAGE = "spark-vllm-sim:lab"
# the gateway of a stack with several models (lab/gateway: LiteLLM's proxy from PyPI)
GATEWAY_IMAGE = "spark-vllm-gateway:lab"
# The vLLM version the simulator in INNER_IMAGE plays (env VLLM_SIM_VLLM_VERSION baked in):
# V2 mode, modelled on vLLM 0.33.0. The legacy mode (the outage image's vLLM) is built as
# f"{INNER_IMAGE}-{LEGACY_SIM_VLLM_VERSION}" (lab/vllm_sim/README.md).
SIM_VLLM_VERSION = "0.33.0"
LEGACY_SIM_VLLM_VERSION = "0.17.1"
RAY_VERSION = "2.60.0"

# The generated model `lab up` puts in node-1's HF cache (lab/model.py; NOT real weights): the
# lab stack's model (lab/stackfile.py MODEL), small enough for the lab's disk and 2 cores.
LAB_MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
LAB_MODEL_BYTES = 3 * 2**30
# The tests' lab: the same model, small. What the tests prove of the copy (hashed on arrival,
# resumed, a damaged shard re-sent) holds at any size; 3 GiB copied and hashed in every module
# cost minutes of CI for nothing (the demo and the bench keep the big one).
TEST_MODEL_BYTES = 512 * 2**20
LAB_MODEL_SHARDS = 4

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"

# The DGX Spark's RoCE interface (a DGX Spark's QSFP port, `ibdev2netdev`): the lab uses the same
# name so the lab stack differs from spark-duo only in addresses.
FABRIC_IFNAME = "enp1s0f1np1"

DEFAULT_NODES = 2
DEFAULT_MGMT_SUBNET = f"10.{230 + INSTANCE}.0.0/24"  # lab 1: 10.231.0.0/24
DEFAULT_FABRIC_SUBNET = f"192.168.{230 + INSTANCE}.0/24"  # lab 1: 192.168.231.0/24
# the stack's config is stacks/Pulumi.<stack>.yaml, one file per name: lab 2's stack is lab2
DEFAULT_STACK = "lab" + _SUFFIX
MAX_NODES = 80  # node IPs are .10+i and spares .100+i: keep them apart

SSH_READY_TIMEOUT_S = 90  # node start → sshd and inner dockerd answer (≈2.5 s measured)
SSH_CONNECT_TIMEOUT_S = 5


def container_name(index: int) -> str:
    return f"{LAB_PREFIX}-node-{index}"


def node_name(index: int) -> str:
    return f"node-{index}"


def volume_name(index: int) -> str:
    return f"{LAB_PREFIX}-node-{index}-docker"


def stack_file(stack: str) -> Path:
    return STACKS_DIR / f"Pulumi.{stack}.yaml"


@dataclass(frozen=True)
class NodeAddrs:
    """Where one simulated node lives."""

    index: int  # 1-based
    name: str  # node-<i>: hostname and stack node name
    container: str  # docker container name on the host
    mgmt_ip: str  # SSH address; default route (like a Spark's external NIC)
    fabric_ip: str  # on enp1s0f1np1: the node's identity in the stack
    spare_ip: str  # secondary fabric address, for tests that move a node's identity
    docker_bip: str  # --bip of the node's inner dockerd (distinct per node)


def _host(subnet: str, offset: int) -> str:
    net = ipaddress.ip_network(subnet, strict=False)
    addr = net.network_address + offset
    if addr not in net or addr == net.broadcast_address:
        raise ValueError(f"{subnet} is too small for host offset {offset}")
    return str(addr)


def node_addrs(index: int, mgmt_subnet: str, fabric_subnet: str) -> NodeAddrs:
    if not 1 <= index <= MAX_NODES:
        raise ValueError(f"node index {index} out of 1..{MAX_NODES}")
    return NodeAddrs(
        index=index,
        name=node_name(index),
        container=container_name(index),
        mgmt_ip=_host(mgmt_subnet, 10 + index),
        fabric_ip=_host(fabric_subnet, 10 + index),
        spare_ip=_host(fabric_subnet, 100 + index),
        docker_bip=f"172.31.{index}.1/24",
    )
