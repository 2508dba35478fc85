"""The cluster spec: the `spark-vllm:` stack config, read once and validated whole.

Pure: no Pulumi import. `parse_spec` turns the raw config mapping into frozen typed objects or
raises `SpecError` listing every problem with its path (`nodes[1].fabricInterface: ...`), so an
operator fixes the whole file in one pass instead of one `pulumi up` per typo.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from .secret_check import NAMESPACE, SECRET_KEYS, SET_COMMAND

# SECRET_KEYS: config keys whose values are Pulumi secrets (checked in secret_check); the spec
# only records which are set.

# Env keys the program computes per node (invariant 1). A user value would silently diverge
# from Ray's or NCCL's view of the node, which is exactly the outage this program was made
# after (VLLM_HOST_IP=192.168.200.12 while Ray registered the head as 10.1.230.180).
OWNED_ENV = {
    "VLLM_HOST_IP": "nodes[].fabricIp (or nodes[].host)",
    "RAY_NODE_IP_ADDRESS": "nodes[].fabricIp (or nodes[].host)",
    "RAY_OVERRIDE_NODE_IP_ADDRESS": "nodes[].fabricIp (or nodes[].host)",
    "HOST_IP": "nodes[].fabricIp (or nodes[].host)",
    "NCCL_SOCKET_IFNAME": "nodes[].fabricInterface",
    "GLOO_SOCKET_IFNAME": "nodes[].fabricInterface",
    "TP_SOCKET_IFNAME": "nodes[].fabricInterface",
    "UCX_NET_DEVICES": "nodes[].fabricInterface",
    "NCCL_IB_HCA": "nodes[].ibHca",
    "RAY_ADDRESS": "nodes[0] and rayPort",
    "VLLM_API_KEY": "apiKey (a secret)",
    # where the API-key middleware reads the key (render/api_key_commands.py api_key_args)
    "SPARK_VLLM_API_KEY_FILE": "apiKey (the program: its file on the API server's node)",
    "HF_TOKEN": "hfToken (a secret)",
    # vLLM >= 0.18 (RayExecutorV2): the driver reaches the ranks on its own node through ipc://
    # sockets under this path, so the vLLM and Ray head containers must share it
    "VLLM_RPC_BASE_PATH": "the Ray head's shared /tmp/ray (the program)",
    "VLLM_CONFIG_ROOT": "the program (it holds vLLM's non-carry-over list)",
    # vLLM's wait for its engines with several API servers or the Rust front end: the program
    # gives it the start's own bound (vllmTimeout and what the node must do, render/commands.py
    # start_bound_lines), so no clock of vLLM's ends a start the program still waits for
    "VLLM_ENGINE_READY_TIMEOUT_S": "vllmTimeout (the start's bound, computed on the node)",
}
# Env keys the program reads (vLLM's per-step limit, from which the smoke request's bound and
# Ray's health checks are derived) or sets unless the operator does (Ray's memory monitor and
# health checks, render/backends/ray.py): integers, as vLLM (int()) and Ray (its config
# parser) read them; the least value each may take.
NUMERIC_ENV = {
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": 1,
    "RAY_memory_monitor_refresh_ms": 0,
    "RAY_health_check_timeout_ms": 1,
    "RAY_health_check_period_ms": 1,
    "RAY_health_check_failure_threshold": 1,
}
# torch.distributed's default process-group timeout for NCCL, which vLLM uses when it passes
# none (see render/backends/native.py TORCH_PG_TIMEOUT_S)
TORCH_PG_TIMEOUT_S = 600
# Owned only while the program stages the model (modelStaging: download or copy): the weights
# are then on every node before vLLM starts, and no node may fetch anything on its own.
STAGING_ENV = {"HF_HUB_OFFLINE": "modelStaging (1 while the program stages the model)"}
# Owned while the nodes keep compile caches (compileCache, not none): each points into the
# node's cache directory, mounted in every container that runs a rank or the driver.
CACHE_ENV = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
             "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR")

# vLLM flags the program derives from the spec; repeating them in vllmArgs would contradict it.
# Each with every short alias vLLM gives it (vLLM 0.33.0's `vllm serve` flags, the table in
# lab/vllm_sim/vllm_sim/serve_flags_0_33_0.txt; tests/unit/test_spec.py holds the two together).
OWNED_VLLM_FLAGS = {
    "--tensor-parallel-size": "tensorParallelSize",
    "-tp": "tensorParallelSize",
    "--pipeline-parallel-size": "pipelineParallelSize",
    "-pp": "pipelineParallelSize",
    "--distributed-executor-backend": "backend",
    # vLLM's native multi-node (backend: native): the program gives each node its rank
    "--nnodes": "backend and nodes",
    "-n": "backend and nodes",
    "--node-rank": "backend and nodes",
    "-r": "backend and nodes",
    "--master-addr": "backend (nodes[0]'s identity IP)",
    "--master-port": "masterPort",
    "--headless": "backend (every node but nodes[0])",
    # data parallel would start more engines than the nodes' ranks: not a layout the program
    # deploys (and vLLM's native multi-node derives its DP rank from --node-rank)
    "--data-parallel-size": "(one engine: tensorParallelSize × pipelineParallelSize)",
    "-dp": "(one engine: tensorParallelSize × pipelineParallelSize)",
    "--data-parallel-rank": "(one engine)",
    "-dpn": "(one engine)",
    "--data-parallel-start-rank": "(one engine)",
    "-dpr": "(one engine)",
    "--data-parallel-size-local": "(one engine)",
    "-dpl": "(one engine)",
    "--data-parallel-address": "(one engine)",
    "-dpa": "(one engine)",
    "--data-parallel-rpc-port": "(one engine)",
    "-dpp": "(one engine)",
    "--data-parallel-backend": "(one engine)",
    "-dpb": "(one engine)",
    "--host": "apiHost",
    "--port": "port",
    "--served-model-name": "servedModelName",
    "--api-key": "apiKey (a secret)",
    "--revision": "modelRevision",
}

_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
_IFACE_RE = r"^[A-Za-z0-9_.:-]{1,15}$"  # Linux IFNAMSIZ is 16 including the NUL
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: $ would let "A\n" through
# Control characters (Unicode Cc: C0, DEL, C1) but tab, refused in vllmArgs and env: NUL cannot
# be in an argv or an environment at all (C strings: cut short, or the run fails), and the rest
# would reach the operator's terminal raw in the rendered `docker run` that Pulumi's diffs and
# errors show (a CR or an ESC sequence rewrites what is displayed, a newline splits one argument
# over lines) and could not go into a KEY=value-a-line env-file. A tab is plain whitespace: it
# survives the quoting, displays as itself, and a JSON value or a template may hold one.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# huggingface_hub's repo id: namespace/name, each [\w.-] without "--" or ".." (validators.py)
_HF_REPO_RE = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}$")


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, strict=True
    )


class NodeSpec(_Strict):
    """One GPU host. The first node is the Ray head and runs the API server."""

    name: str  # container labels and resource names: [a-z0-9-], unique
    host: str = Field(min_length=1)  # SSH address as seen from the operator's machine
    user: str = Field("root", pattern=r"^[a-z_][a-z0-9_.-]*$")
    port: int = Field(22, ge=1, le=65535)
    # pinned "ssh-ed25519 AAAA…"; required unless insecureAcceptAnyHostKey (a lab's opt-out)
    host_key: str | None = None
    fabric_ip: str | None = None  # RoCE/IB address; becomes the node's identity
    fabric_interface: str | None = Field(None, pattern=_IFACE_RE)
    ib_hca: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:,=^-]+$")
    gpus: int = Field(1, ge=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(_NAME_RE, v):
            raise ValueError(
                f"{v!r} must be 1-40 of [a-z0-9-], starting and ending with a letter or digit"
            )
        return v

    @field_validator("fabric_ip")
    @classmethod
    def _ip_literal(cls, v: str | None) -> str | None:
        if v is not None:
            ipaddress.ip_address(v)  # ValueError names the field through pydantic's loc
        return v

    @field_validator("host_key")
    @classmethod
    def _key_shape(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(ssh-|ecdsa-)[a-z0-9-]+ [A-Za-z0-9+/=]+$", v.strip()):
            raise ValueError('expected "<type> <base64>", e.g. "ssh-ed25519 AAAA…"')
        return v.strip() if v else v

    @property
    def identity_ip(self) -> str:
        """The one address Ray, vLLM and NCCL use for this node (invariant 1)."""
        return self.fabric_ip or self.host


# Bounds the Ray head's start, each worker's join and the gate; a join takes ~2 s on the lab.
DEFAULT_RAY_TIMEOUT_S = 60
# One SSH dial's bound, and how many dials fail a command (node.py): ~1 min for a node that
# does not answer, not TCP's minutes nor pulumi-command's default of 10 dials.
DEFAULT_SSH_DIAL_TIMEOUT_S = 15
SSH_DIALS = 4


# The fabric check (components/fabric_verdict.py, components/scripts/fabric_check.py):
# floors for a pair of DGX Sparks on their 200 Gb/s ConnectX-7 link, from the field's figures
# (docs/configuration.md#the-fabric-check has each source). nccl-tests all_reduce_perf between
# two GB10s measured 28-35 µs at 8 KiB and 65-68 µs at 64 KiB (github.com/NVIDIA/
# dgx-spark-playbooks PR 103): the ceilings are ~3x that. A healthy pair moves 20-24 GB/s of bus
# bandwidth (PR 103: all_gather 23.7 GB/s with both HCAs and MTU 9000; tonyd2wild/…-2x-DGX-Spark
# PR 35: 161 Gb/s with both HCAs), half with one rail (PR 35: 98 Gb/s, 12 GB/s), ~3 GB/s with a
# bad NCCL build or the data path unpinned (playbooks issue 102, PR 103) and ~1.6 GB/s on a
# ConnectX-7 that came up degraded at ~13 Gb/s (playbooks PR 108): the floor, 10 GB/s, refuses
# the broken fabrics; a lost rail on a pair that had both shows against its own baseline.
DEFAULT_FABRIC_MAX_LATENCY_8K_US = 100.0
DEFAULT_FABRIC_MAX_LATENCY_64K_US = 200.0
DEFAULT_FABRIC_MIN_BUS_BANDWIDTH_GBS = 10.0
FABRIC_MESSAGE_MAX_MIB = 256  # never the 16 GB message that froze a Spark (playbooks issue 102)


class FabricCheckSettings(_Strict):
    """`fabricCheck:`, the collective run across the nodes before any rank (inert until the
    check is in the graph)."""

    # µs: the median all-reduce of 8 KiB and of 64 KiB (what TP decode issues), per pair
    max_latency_8k: float = Field(DEFAULT_FABRIC_MAX_LATENCY_8K_US, gt=0, le=1e6,
                                  alias="maxLatency8k")
    max_latency_64k: float = Field(DEFAULT_FABRIC_MAX_LATENCY_64K_US, gt=0, le=1e6,
                                   alias="maxLatency64k")
    # GB/s (10^9 bytes): nccl-tests' busbw of an all-reduce of bandwidthMessage; 0: no floor
    min_bus_bandwidth: float = Field(DEFAULT_FABRIC_MIN_BUS_BANDWIDTH_GBS, ge=0, le=10000)
    bandwidth_message: int = Field(64, ge=1, le=FABRIC_MESSAGE_MAX_MIB)  # MiB
    # a later run this fraction worse than the stack's baseline (its first good run) is degraded
    baseline_tolerance: float = Field(0.25, gt=0, lt=1)
    on_degraded: Literal["warn", "refuse"] = "warn"
    # where the check cannot run (no torch in the image, no GPU for NCCL): refuse to start,
    # start with a warning, or start and record why it was skipped
    on_unavailable: Literal["refuse", "warn", "skip"] = "refuse"
    timeout: int = Field(90, ge=10, le=600)  # s: the whole run on every node


class _Settings(_Strict):
    """Top-level keys other than `nodes`; defaults live here and nowhere else."""

    image: str = Field(min_length=1, pattern=r"^[^\s]+$")
    image_pull: Literal["always", "missing", "never"] = "missing"
    # how the image reaches the nodes (image_staging.py): pull (each node pulls per imagePull),
    # copy (the head has it, pulled per imagePull or built there, and every other node that
    # lacks that image id gets it from the head over the fabric, only the layers it lacks), none
    # (every node has it already: nothing is pulled or copied, the image check only)
    image_staging: Literal["pull", "copy", "none"] = "pull"
    model: str = Field(min_length=1, pattern=r"^[^\s]+$")
    # what vLLM loads: a branch, tag or commit of the Hugging Face repo (None: main)
    model_revision: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
    # how the weights reach the nodes (staging.py): fetched once on the head when missing
    # (download) or taken from the head as they are (copy), then copied to every other node
    # over the fabric and verified; none: each node has them already, or vLLM fetches them
    model_staging: Literal["none", "download", "copy"] = "download"
    # pins the image's content: its image id or registry digest, the same on every node
    image_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    served_model_name: str | None = Field(None, pattern=r"^[^\s]+$")
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    port: int = Field(8000, ge=1, le=65535)
    api_host: str = "0.0.0.0"
    ray_port: int = Field(6379, ge=1, le=65535)
    # how the ranks find each other: ray (a Ray cluster, vLLM a Ray driver on the head) or
    # native (vLLM's own multi-node: a `vllm serve` per node, rank 0 on nodes[0] hosting the
    # torch.distributed rendezvous on masterPort; no Ray in the image needed)
    backend: Literal["ray", "native"] = "ray"
    master_port: int = Field(29501, ge=1, le=65535)
    # native: how long rank 0 waits for every other node's ranks to join it
    join_timeout: int = Field(300, ge=5, le=3600)
    hf_cache: str = "/root/.cache/huggingface"
    shm_size: str = Field("10.24g", pattern=r"^[0-9]+(\.[0-9]+)?[bkmg]?$")
    env: dict[str, str] = Field(default_factory=dict)
    vllm_args: tuple[str, ...] = ()
    docker_gpus: str = Field("all", pattern=r"^[^\s]+$")
    check_gpu: bool = True
    ray_timeout: int = Field(DEFAULT_RAY_TIMEOUT_S, ge=5, le=3600)  # head start, worker join, gate
    # each SSH dial's bound (pulumi-command's perDialTimeout; 4 dials): a rebooting Spark takes
    # a while to answer, so ~1 min by default; a lab or a test sets it low
    ssh_dial_timeout: int = Field(DEFAULT_SSH_DIAL_TIMEOUT_S, ge=1, le=300)
    # nodes without hostKey accept whatever key answers at their address (pulumi-command's
    # ConnectionArgs.host_key unset): for a throwaway lab only, and said on every run
    insecure_accept_any_host_key: bool = False
    vllm_timeout: int = Field(1800, ge=10, le=86400)  # model load of 122B FP8 takes minutes
    smoke_test: bool = True
    # liveness (refresh, status): the canary's bound for its first token, and how long vLLM's
    # token counter must stand still with the canary unanswered to call it wedged. A 122B
    # model's one-token canary answers in well under a second on an idle Spark; a queue can
    # hold it for long, and then the counter moves (busy, left alone).
    canary_timeout: int = Field(30, ge=1, le=600)
    wedge_window: int = Field(60, ge=2, le=1800)
    # where each node keeps vLLM's torch.compile, Triton, inductor, FlashInfer and CUDA JIT
    # caches across container replacements: "" = beside hfCache
    # (<dirname(hfCache)>/spark-vllm-compile), a path = that root, "none" = in the containers
    # (every replacement starts cold). Each stack uses <root>/<stack>.
    compile_cache: str = ""
    # the weight copy (staging.py): parallel transfers per node ("auto": from the cores of the
    # head and the node, 1-8), and how the bytes travel: rsync over SSH (encrypted), or tcp,
    # raw TCP over the fabric (unencrypted, authenticated per copy, for a private link)
    copy_streams: int | Literal["auto"] = "auto"
    copy_transport: Literal["ssh", "tcp"] = "ssh"
    # vLLM's --max-model-len, checked by the memory admission before any container: a number,
    # or auto (vLLM >= 0.26 fits the longest context its KV cache holds at load time, and the
    # admission shows the estimate); unset: vllmArgs' --max-model-len, else the model's own
    max_model_len: int | Literal["auto"] | None = None
    fabric_check: FabricCheckSettings = Field(
        default_factory=lambda: FabricCheckSettings.model_validate({}))

    @field_validator("env", mode="before")
    @classmethod
    def _env_numbers(cls, v: Any) -> Any:
        # YAML reads `NCCL_DEBUG: 1` as an int; env values are strings, so take plain numbers
        # as written. Anything else (bools, lists) stays and fails strict str with its path.
        if isinstance(v, Mapping):
            return {
                k: str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x
                for k, x in v.items()
            }
        return v

    @field_validator("hf_cache")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not posixpath.isabs(v):
            raise ValueError("must be an absolute path on the nodes")
        return v

    @field_validator("compile_cache")
    @classmethod
    def _cache_path(cls, v: str) -> str:
        if v not in ("", "none") and (not posixpath.isabs(v) or re.search(r"[\s:]", v)):
            raise ValueError('must be an absolute path on the nodes without spaces or ":", '
                             '"none", or unset (beside hfCache)')
        return v

    @field_validator("copy_streams")
    @classmethod
    def _streams(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 64:
            raise ValueError('must be 1-64 or "auto"')
        return v


@dataclass(frozen=True)
class ClusterSpec:
    """Everything the components need; built only by `parse_spec`."""

    stack: str
    nodes: tuple[NodeSpec, ...]
    settings: _Settings
    secrets_set: frozenset[str]  # which of SECRET_KEYS are present (values stay in Pulumi)

    def __getattr__(self, item: str) -> Any:  # spec.image, spec.port … read through
        return getattr(self.settings, item)

    @property
    def head(self) -> NodeSpec:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[NodeSpec, ...]:
        return self.nodes[1:]

    @property
    def world_size(self) -> int:
        return self.settings.tensor_parallel_size * self.settings.pipeline_parallel_size

    @property
    def served_name(self) -> str:
        return self.settings.served_model_name or self.settings.model

    @property
    def staged(self) -> bool:
        """The program puts the weights on every node before any Ray container (staging.py)."""
        return self.settings.model_staging != "none"

    @property
    def compile_cache_dir(self) -> str | None:
        """This stack's cache directory on every node, or None (compileCache: none)."""
        root = self.settings.compile_cache
        if root == "none":
            return None
        if not root:
            root = posixpath.join(posixpath.dirname(self.settings.hf_cache.rstrip("/")) or "/",
                                  "spark-vllm-compile")
        return posixpath.join(root, self.stack)

    @property
    def user_env(self) -> dict[str, str]:
        return {k: str(v) for k, v in sorted(self.settings.env.items())}


class SpecError(ValueError):
    """Every problem in the config, one `path: message` per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"invalid {NAMESPACE} config ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}):\n" + "\n".join(f"  - {p}" for p in problems)
        )


def _printable(text: str) -> str:
    """`text` with its control characters escaped (`\\n`), so a problem stays one line."""
    return _CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], text)


def _control_problem(path: str, text: str) -> str | None:
    m = _CONTROL_RE.search(text)
    if m is None:
        return None
    return (f"{path}: contains control character {m.group()!r}; write it on one line of plain "
            "text (tab is fine)")


def _path(prefix: str, loc: tuple[Any, ...]) -> str:
    out = prefix
    for part in loc:  # pydantic reports the alias (camelCase) the user wrote
        name = _printable(str(part))
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + name
    return out


def _pydantic_problems(prefix: str, err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (a typo?)"
        elif e["type"] == "model_type":  # pydantic would name the class
            msg = "expected a mapping of its keys (docs/configuration.md)"
        problems.append(f"{_path(prefix, loc)}: {msg}")
    return problems


def _node_problems(i: int, node: NodeSpec) -> list[str]:
    p = f"nodes[{i}]"
    out = []
    if node.fabric_ip and not node.fabric_interface:
        out.append(f"{p}.fabricInterface: required when fabricIp is set")
    if node.fabric_interface and not node.fabric_ip:
        out.append(f"{p}.fabricIp: required when fabricInterface is set")
    if not node.fabric_ip:
        try:
            ipaddress.ip_address(node.host)
        except ValueError:
            out.append(
                f"{p}.host: {node.host!r} is not an IP literal; the node identity must be an IP "
                f"(set {p}.fabricIp, or give host as an address)"
            )
    return out


def _address(text: str) -> str:
    """A host as compared: an IP literal as its address (`FD00:0::1` is `fd00::1`, an
    IPv4-mapped IPv6 its IPv4), a name without case, surrounding whitespace or the root's dot."""
    text = text.strip().lower()
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text.rstrip(".") or text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return ip.compressed


def _cluster_problems(nodes: list[NodeSpec], s: _Settings) -> list[str]:
    out = []
    seen: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.name in seen:
            out.append(f"nodes[{i}].name: {n.name!r} already used by nodes[{seen[n.name]}]")
        seen.setdefault(n.name, i)
    # one SSH endpoint is one machine: two nodes there would share its containers and GPUs
    endpoints: dict[tuple[str, int], int] = {}
    for i, n in enumerate(nodes):
        host = _address(n.host)
        if (host, n.port) in endpoints:
            shown = f"[{host}]" if ":" in host else host
            out.append(f"nodes[{i}].host: same SSH endpoint as nodes[{endpoints[host, n.port]}] "
                       f"({_printable(shown)}:{n.port}); each node needs its own")
        endpoints.setdefault((host, n.port), i)
    idents: dict[str, int] = {}
    for i, n in enumerate(nodes):
        field = "fabricIp" if n.fabric_ip else "host"
        ident = _address(n.identity_ip)
        if ident in idents:
            out.append(
                f"nodes[{i}].{field}: identity {ident} already used by nodes[{idents[ident]}]; "
                "vLLM requires a unique IP per node"
            )
        idents.setdefault(ident, i)
    gpus = sum(n.gpus for n in nodes)
    world = s.tensor_parallel_size * s.pipeline_parallel_size
    if world != gpus:
        out.append(
            f"tensorParallelSize: tensorParallelSize × pipelineParallelSize = "
            f"{s.tensor_parallel_size} × {s.pipeline_parallel_size} = {world} must equal the GPUs "
            f"of all nodes ({gpus})"
        )
    elif s.backend == "native" and len({n.gpus for n in nodes}) > 1:
        # vLLM gives every node world_size / nnodes local ranks (engine/arg_utils.py,
        # local_world_size = world_size // nnodes)
        out.append("nodes: backend native runs world_size / nnodes ranks on every node; the "
                   "nodes' gpus differ (" + ", ".join(f"{n.name}: {n.gpus}" for n in nodes)
                   + "): give every node the same gpus, or use backend: ray")
    return out


def _settings_problems(s: _Settings) -> list[str]:
    out = []
    if s.wedge_window < s.canary_timeout:
        out.append(f"wedgeWindow: {s.wedge_window} s is shorter than canaryTimeout "
                   f"({s.canary_timeout} s); the counter is watched for at least the canary's "
                   "wait")
    if s.port == s.ray_port and s.backend == "ray":
        out.append(f"port: {s.port} is also rayPort; the API server and Ray's GCS need their own")
    if s.port == s.master_port and s.backend == "native":
        out.append(f"port: {s.port} is also masterPort; the API server and rank 0's rendezvous "
                   "need their own")
    for key in s.env:
        shown = _printable(key)
        if key in STAGING_ENV and s.model_staging != "none":
            out.append(f"env.{key}: set by the program while modelStaging is "
                       f"{s.model_staging}; remove it from env (or set modelStaging: none)")
        elif key in CACHE_ENV and s.compile_cache != "none":
            out.append(f"env.{key}: set by the program to the node's compileCache directory; "
                       "remove it from env (or set compileCache: none)")
        elif key in OWNED_ENV:
            out.append(f"env.{key}: set by the program from {OWNED_ENV[key]}; remove it from env")
        elif not _ENV_KEY_RE.fullmatch(key):
            out.append(f"env.{shown}: not a valid environment variable name")
    for key, value in s.env.items():
        if problem := _control_problem(f"env.{_printable(key)}", str(value)):
            out.append(problem)
        elif key in NUMERIC_ENV and not (str(value).strip().isdigit()
                                         and int(value) >= NUMERIC_ENV[key]):
            out.append(f"env.{key}: {_printable(str(value))!r} is not a whole number of at "
                       f"least {NUMERIC_ENV[key]}")
    if s.image_staging == "copy" and "@" in s.image:
        out.append(f"image: {s.image!r} names a registry digest; imageStaging copy moves the "
                   "image with docker save and load, which keep tags and not registry digests: "
                   "name it by tag and pin it with imageDigest")
    if s.image_staging == "none" and s.image_pull == "always":
        out.append("imagePull: always pulls on every node, imageStaging: none never fetches the "
                   "image; choose one (imageStaging: pull, or imagePull: never)")
    if s.model_staging != "none" and not _HF_REPO_RE.match(s.model):
        out.append(f"model: {s.model!r} is not a Hugging Face repo id (org/name); modelStaging "
                   f"{s.model_staging} stages repos into hfCache: set modelStaging: none for a "
                   "path or a model the nodes already have")
    fc = s.fabric_check
    if fc.max_latency_64k < fc.max_latency_8k:
        out.append(f"fabricCheck.maxLatency64k: {fc.max_latency_64k:g} µs is below maxLatency8k "
                   f"({fc.max_latency_8k:g} µs); a 64 KiB all-reduce takes at least as long as "
                   "an 8 KiB one")
    if isinstance(s.max_model_len, int) and not 16 <= s.max_model_len <= 10**8:
        out.append(f"maxModelLen: {s.max_model_len} is not a context length (16 or more)")
    for j, arg in enumerate(s.vllm_args):
        if problem := _control_problem(f"vllmArgs[{j}]", arg):
            out.append(problem)
        spelled = _printable(arg.split("=", 1)[0])
        if s.max_model_len is not None and owned_vllm_flags(arg, ("--max-model-len",)):
            out.append(f"vllmArgs[{j}]: --max-model-len is set by the program from maxModelLen "
                       "(remove one of them)")
        if (s.backend == "native" and s.join_timeout > TORCH_PG_TIMEOUT_S
                and owned_vllm_flags(arg, ("--distributed-timeout-seconds",))):
            out.append(f"vllmArgs[{j}]: --distributed-timeout-seconds is set by the program from "
                       f"joinTimeout ({s.join_timeout} s, above torch's {TORCH_PG_TIMEOUT_S} s); "
                       "remove one of them")
        flags = owned_vllm_flags(arg)
        for flag in flags:
            if flag == spelled:
                read_as = ""
            elif len(flags) == 1:
                read_as = f" (vLLM reads {spelled} as {flag})"
            else:  # ambiguous to vLLM's parser too (it exits); each owned flag is named
                read_as = f" ({spelled} abbreviates it, among others)"
            out.append(f"vllmArgs[{j}]: {flag} is set by the program from "
                       f"{OWNED_VLLM_FLAGS[flag]}{read_as}")
    return out


def owned_vllm_flags(arg: str, owned: Sequence[str] = tuple(OWNED_VLLM_FLAGS)) -> list[str]:
    """The program-owned flags `arg` may stand for, as `vllm serve` parses it.

    vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py) reads `_` as `-` in a long
    flag's name (up to its first `.`, the JSON-path separator; `-x.a` is `-x` too), then plain
    argparse with allow_abbrev (vLLM never turns it off):
    - an exact option string is itself, before any abbreviation (`-dp` is not `-dpl`);
    - any prefix of a long flag stands for it: `--tensor_parallel_size=2`, `--tensor-parallel`;
    - any prefix of a single-dash alias too: vLLM 0.26.0 (Python 3.12) read `-t 4` as
      `-tp 4`; recent argparse also splits `-t=4` at its `=` first (3.11's leaves it unknown);
    - a one-letter alias takes its value attached: `-n2` is `-n 2`, `-rX` is `-r X`.
    What this cannot know: the other flags of the vLLM in the image. A prefix shared with a
    flag that is not owned (`--p`: --pipeline-parallel-size, --port, --prefix-caching-hash-algo
    …; `-d`: -dp, -dcp …) is ambiguous to argparse, which exits: it is refused here too, naming
    every owned flag it could be, so that an image whose vLLM lacks the other flag, where it
    would resolve, is covered. A non-owned flag that equals a prefix of an owned one would be
    refused wrongly; vLLM 0.33.0 has none (tests/unit/test_spec.py checks its whole table).
    """
    name = arg.split("=", 1)[0].split(".", 1)[0]
    if name.startswith("--"):
        name = name.replace("_", "-")
        candidates = [f for f in owned if f.startswith("--")]
        if name == "--":
            return []
    elif name.startswith("-") and len(name) > 1:
        candidates = [f for f in owned if not f.startswith("--")]
    else:
        return []
    if name in candidates:
        return [name]
    return [f for f in candidates if f.startswith(name) or (len(f) == 2 and name.startswith(f))]


def keyscan_command(node: NodeSpec) -> str:
    """The OpenSSH command that prints the key to pin for `node`."""
    port = f"-p {node.port} " if node.port != 22 else ""
    return f"ssh-keyscan -t ed25519 {port}{node.host}"


def host_key_problem(i: int, node: NodeSpec) -> str:
    return (f"nodes[{i}].hostKey: required: {node.name} has no pinned host key, so whoever "
            f"answers at {node.host} would get the deploy key's session and the secrets. Run "
            f"`{keyscan_command(node)}` on a network you trust, check its fingerprint "
            "(`ssh-keygen -lf`) against the node's console, and put the `ssh-ed25519 AAAA…` "
            "part in hostKey (or, for a throwaway lab only, set insecureAcceptAnyHostKey: true)")


def parse_spec(
    raw: Mapping[str, Any], stack: str, secrets_set: frozenset[str] = frozenset(),
    secret_problems: Sequence[str] = (),
) -> ClusterSpec:
    """Validate the whole `spark-vllm:` config; raise SpecError with every problem found.

    `raw` maps config keys without namespace (e.g. "nodes", "tensorParallelSize") to their
    decoded values; secret keys may be present or not, their values are ignored here (the
    caller checks them with `secret_check.secret_problems` and passes what it found, so that
    one error lists every problem).
    """
    problems: list[str] = list(secret_problems)
    known = {to_camel(f) for f in _Settings.model_fields} | {"nodes", *SECRET_KEYS}
    for key in sorted(set(raw) - known):
        problems.append(f"{key}: unknown key (a typo?)")
    if "sshPrivateKey" not in secrets_set:
        problems.append(f"sshPrivateKey: required; set it with {SET_COMMAND['sshPrivateKey']}")

    raw_nodes = raw.get("nodes")
    nodes: list[NodeSpec] = []
    nodes_ok = True
    if not isinstance(raw_nodes, list) or not raw_nodes:
        problems.append("nodes: required, a non-empty list (the first node is the Ray head)")
        nodes_ok = False
    else:
        for i, rn in enumerate(raw_nodes):
            if not isinstance(rn, Mapping):
                problems.append(f"nodes[{i}]: expected a mapping with name, host, …")
                nodes_ok = False
                continue
            try:
                node = NodeSpec.model_validate(dict(rn))
            except ValidationError as err:
                problems += _pydantic_problems(f"nodes[{i}]", err)
                nodes_ok = False
                continue
            problems += _node_problems(i, node)
            nodes.append(node)

    settings = None
    top = {k: v for k, v in raw.items() if k in known and k != "nodes" and k not in SECRET_KEYS}
    if "vllmArgs" in top and isinstance(top["vllmArgs"], list):
        top["vllmArgs"] = tuple(top["vllmArgs"])
    try:
        settings = _Settings.model_validate(top)
    except ValidationError as err:
        problems += _pydantic_problems("", err)
    if settings is not None and not settings.insecure_accept_any_host_key:
        problems += [host_key_problem(i, n) for i, n in enumerate(nodes) if not n.host_key]
    if settings is not None:
        problems += _settings_problems(settings)
        if nodes_ok:
            problems += _cluster_problems(nodes, settings)
    if problems or settings is None:
        raise SpecError(problems)
    return ClusterSpec(
        stack=stack, nodes=tuple(nodes), settings=settings, secrets_set=frozenset(secrets_set)
    )


def decode_config(values: Mapping[str, str]) -> tuple[dict[str, Any], frozenset[str]]:
    """Decode Pulumi's flat config (`spark-vllm:key` -> string) into typed raw values.

    Structured values arrive as JSON text, scalars as their text; string fields keep their text
    as written (an image tag "123" stays a string). Secret values are not decoded at all: only
    their presence is returned. Values that fail to decode stay text so that validation names
    the field.
    """
    string_fields = {
        to_camel(name) for name, f in _Settings.model_fields.items()
        if f.annotation in (str, str | None)
    }
    raw: dict[str, Any] = {}
    secrets = set()
    prefix = NAMESPACE + ":"
    for full_key, text in values.items():
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix):]
        if key in SECRET_KEYS:
            if text:  # "" is unset: Pulumi.yaml declares the optional secrets with default ""
                secrets.add(key)
            continue
        if key in string_fields:
            raw[key] = text
            continue
        try:
            raw[key] = json.loads(text)
        except ValueError:
            raw[key] = text
    return raw, frozenset(secrets)
