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

from pydantic import Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from .secret_check import NAMESPACE, SECRET_KEYS, SET_COMMAND
from .spec_base import Strict, env_numbers, pydantic_problems
from .spec_checks import (  # noqa: F401  (the tables' public names stay importable from spec)
    CACHE_ENV,
    NUMERIC_ENV,
    OWNED_ENV,
    STAGING_ENV,
    TORCH_PG_TIMEOUT_S,
    cluster_problems,
    node_problems,
    settings_problems,
)
from .spec_models import GatewaySettings, ServedModel, models_problems, placed_nodes, view_settings
from .vllm_flags import OWNED_VLLM_FLAGS, owned_vllm_flags  # noqa: F401

_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
_IFACE_RE = r"^[A-Za-z0-9_.:-]{1,15}$"  # Linux IFNAMSIZ is 16 including the NUL


class NodeSpec(Strict):
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


class FabricCheckSettings(Strict):
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


class _Settings(Strict):
    """Top-level keys other than `nodes`; defaults live here and nowhere else."""

    image: str = Field(min_length=1, pattern=r"^[^\s]+$")
    image_pull: Literal["always", "missing", "never"] = "missing"
    # how the image reaches the nodes (image_staging.py): pull (each node pulls per imagePull),
    # copy (the head has it, pulled per imagePull or built there, and every other node that
    # lacks that image id gets it from the head over the fabric, only the layers it lacks), none
    # (every node has it already: nothing is pulled or copied, the image check only)
    image_staging: Literal["pull", "copy", "none"] = "pull"
    # the one model (required without `models:`; with it, each entry holds its own)
    model: str | None = Field(None, min_length=1, pattern=r"^[^\s]+$")
    # what vLLM loads: a branch, tag or commit of the Hugging Face repo (None: main)
    model_revision: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
    # how the weights reach the nodes (staging.py): fetched once on the head when missing
    # (download) or taken from the head as they are (copy), then copied to every other node
    # over the fabric and verified; none: each node has them already, or vLLM fetches them
    model_staging: Literal["none", "download", "copy"] = "download"
    # pins the image's content: its image id or registry digest, the same on every node
    image_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    served_model_name: str | None = Field(None, pattern=r"^[^\s]+$")
    tensor_parallel_size: int | None = Field(None, ge=1)  # required as model is
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
    # several models on the nodes (spec_models.py), behind one gateway on the head
    models: tuple[ServedModel, ...] | None = None
    gateway: GatewaySettings = Field(default_factory=lambda: GatewaySettings.model_validate({}))

    @field_validator("models", mode="before")
    @classmethod
    def _models_tuple(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    _env_numbers = field_validator("env", mode="before")(env_numbers)

    @field_validator("hf_cache")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not posixpath.isabs(v):
            raise ValueError("must be an absolute path on the nodes")
        return v

    @field_validator("compile_cache")
    @classmethod
    def _cacheconfig_path(cls, v: str) -> str:
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
    # one of several served models (spec_models.py): its name, in every container's name
    model_key: str | None = None

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
        # a stack of several models has none of its own (each view has its layout)
        return (self.settings.tensor_parallel_size or 0) * self.settings.pipeline_parallel_size

    @property
    def served_name(self) -> str:
        return self.settings.served_model_name or self.settings.model or ""

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
    def several(self) -> bool:
        """The stack serves several models (`models:`), behind the gateway."""
        return self.settings.models is not None

    def views(self) -> list[ClusterSpec]:
        """One ClusterSpec per served model: its nodes, its settings, its model_key. A stack
        without `models:` is its own one view."""
        if self.settings.models is None:
            return [self]
        return [ClusterSpec(stack=self.stack, nodes=tuple(placed_nodes(m, self.nodes)),
                            settings=view_settings(self.settings, i, m),
                            secrets_set=self.secrets_set, model_key=m.name)
                for i, m in enumerate(self.settings.models)]

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
                problems += pydantic_problems(f"nodes[{i}]", err)
                nodes_ok = False
                continue
            problems += node_problems(i, node)
            nodes.append(node)

    settings = None
    top = {k: v for k, v in raw.items() if k in known and k != "nodes" and k not in SECRET_KEYS}
    if "vllmArgs" in top and isinstance(top["vllmArgs"], list):
        top["vllmArgs"] = tuple(top["vllmArgs"])
    try:
        settings = _Settings.model_validate(top)
    except ValidationError as err:
        problems += pydantic_problems("", err)
    if settings is not None and not settings.insecure_accept_any_host_key:
        problems += [host_key_problem(i, n) for i, n in enumerate(nodes) if not n.host_key]
    if settings is not None:
        problems += settings_problems(settings)
        if nodes_ok:
            problems += cluster_problems(nodes, settings)
            if settings.models is not None:
                problems += models_problems(settings, nodes, set(top), settings_problems,
                                            cluster_problems)
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
