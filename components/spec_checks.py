"""The config's checks across fields: env keys the program owns, the nodes as one cluster, the
settings against each other. Pure: no Pulumi import; spec.parse_spec runs them and lists every
problem at once."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from .spec_base import ENV_KEY_RE, HF_REPO_RE, control_problem, printable
from .vllm_flags import OWNED_VLLM_FLAGS, owned_vllm_flags

if TYPE_CHECKING:
    from .spec import NodeSpec, _Settings

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


def node_problems(i: int, node: NodeSpec) -> list[str]:
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


def cluster_problems(nodes: list[NodeSpec], s: _Settings) -> list[str]:
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
                       f"({printable(shown)}:{n.port}); each node needs its own")
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
    if s.tensor_parallel_size is None:
        return out  # several models (each checks its own layout), or named missing already
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


def settings_problems(s: _Settings) -> list[str]:
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
        shown = printable(key)
        if key in STAGING_ENV and s.model_staging != "none":
            out.append(f"env.{key}: set by the program while modelStaging is "
                       f"{s.model_staging}; remove it from env (or set modelStaging: none)")
        elif key in CACHE_ENV and s.compile_cache != "none":
            out.append(f"env.{key}: set by the program to the node's compileCache directory; "
                       "remove it from env (or set compileCache: none)")
        elif key in OWNED_ENV:
            out.append(f"env.{key}: set by the program from {OWNED_ENV[key]}; remove it from env")
        elif not ENV_KEY_RE.fullmatch(key):
            out.append(f"env.{shown}: not a valid environment variable name")
    for key, value in s.env.items():
        if problem := control_problem(f"env.{printable(key)}", str(value)):
            out.append(problem)
        elif key in NUMERIC_ENV and not (str(value).strip().isdigit()
                                         and int(value) >= NUMERIC_ENV[key]):
            out.append(f"env.{key}: {printable(str(value))!r} is not a whole number of at "
                       f"least {NUMERIC_ENV[key]}")
    if s.image_staging == "copy" and "@" in s.image:
        out.append(f"image: {s.image!r} names a registry digest; imageStaging copy moves the "
                   "image with docker save and load, which keep tags and not registry digests: "
                   "name it by tag and pin it with imageDigest")
    if s.image_staging == "none" and s.image_pull == "always":
        out.append("imagePull: always pulls on every node, imageStaging: none never fetches the "
                   "image; choose one (imageStaging: pull, or imagePull: never)")
    if s.models is None:
        out += [f"{key}: required (or list the served models under models: "
                "docs/configuration.md#several-models)"
                for key, value in (("model", s.model), ("tensorParallelSize",
                                                        s.tensor_parallel_size))
                if value is None]
    if s.model and s.model_staging != "none" and not HF_REPO_RE.match(s.model):
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
        if problem := control_problem(f"vllmArgs[{j}]", arg):
            out.append(problem)
        spelled = printable(arg.split("=", 1)[0])
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
