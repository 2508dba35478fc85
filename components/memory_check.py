"""MemoryCheck: will vLLM fit? Refused before any container, from the model's own files and
each node's free memory now (scripts/memory_check.py, on the head after the staging).

vLLM finds out minutes into a load (its profile run, then "No available memory for the cache
blocks" or "To serve at least one request with the model's max seq len …"); on a DGX Spark the
unified memory CUDA reports free varies with the kernel and driver. This check runs the same
arithmetic first (memory_estimate.py, validated against real vLLM's own lines) and refuses with
a per-node table and the largest --max-model-len that fits. It runs again when what it
estimates changes (model, revision, layout, vLLM's memory flags, the nodes); it is in no
container's triggers, so nothing restarts because of it.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pulumi

from . import node_memory
from .node import SparkNode, node_command
from .render import commands, staging_commands
from .spec import ClusterSpec

# vLLM flags the estimate reads, and the estimator's argument each one sets
FLAGS = {"--max-model-len": ("max_model_len", int), "--kv-cache-dtype": ("kv_cache_dtype", str),
         "--block-size": ("block_size", int), "--max-num-seqs": ("max_num_seqs", int),
         "--max-num-batched-tokens": ("max_num_batched_tokens", int),
         "--mamba-ssm-cache-dtype": ("mamba_ssm_cache_dtype", str)}
# vLLM's switches the estimate reads (present: on); each changes what vLLM's profile measures:
# no CUDA graphs (no estimate, no temporary KV cache, no Mamba-block check), no vision encoder
SWITCHES = {"--enforce-eager": "enforce_eager", "--language-model-only": "language_model_only"}


def _number(text: str, kind: type) -> Any:
    """vLLM reads 32k (10^3) and 32K (2^10) in its size flags (vllm/utils/argparse_utils.py
    human_readable_int)."""
    if kind is not int:
        return text
    t = text.strip()
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:])
    return int(float(t[:-1]) * scale) if scale else int(t)


def estimate_flags(spec: ClusterSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(spec.max_model_len, int):
        out["max_model_len"] = spec.max_model_len
    for flag, (key, kind) in FLAGS.items():
        value = node_memory.flag_value(spec.vllm_args, flag)
        if value is not None:
            try:
                out[key] = _number(value, kind)
            except ValueError:
                continue  # vLLM refuses it itself, with its own message
    spellings = {a.partition("=")[0].replace("_", "-") for a in spec.vllm_args}
    for flag, key in SWITCHES.items():
        if flag in spellings:  # only when set: a stack without them keeps its check's triggers
            out[key] = True
    return out


def payload(spec: ClusterSpec) -> dict[str, Any]:
    if spec.several:  # the whole set, per node, in start order (scripts/memory_check.py)
        return {"hf": spec.hf_cache, "models": [_model(v) for v in spec.views()],
                "nodes": _nodes(spec)}
    return {"hf": spec.hf_cache, "model": spec.model, "revision": spec.model_revision or "main",
            "tp": spec.tensor_parallel_size, "pp": spec.pipeline_parallel_size,
            "utilization": node_memory.utilization(spec.vllm_args),
            "autoLength": spec.max_model_len == "auto",
            "flags": estimate_flags(spec),
            # the container that runs vLLM's API server on the head (its ranks' memory is the
            # stack's own, given back before the new vLLM starts)
            "vllmContainer": commands.container_name(
                spec, commands.VLLM if spec.backend == "ray" else commands.LEADER),
            "nodes": _nodes(spec)}


def _nodes(spec: ClusterSpec) -> list[dict[str, Any]]:
    return [{"name": n.name, "ip": n.identity_ip, "user": n.user, "port": n.port,
             "hostKey": n.host_key or ""} for n in spec.nodes]


def _model(view: ClusterSpec) -> dict[str, Any]:
    """One served model's part of the set's payload: its estimate's inputs, its nodes, and its
    container on each (rank 0's on its first node)."""
    return {"key": view.model_key, "model": view.model,
            "revision": view.model_revision or "main",
            "tp": view.tensor_parallel_size, "pp": view.pipeline_parallel_size,
            "utilization": node_memory.utilization(view.vllm_args),
            "autoLength": view.max_model_len == "auto", "flags": estimate_flags(view),
            "containers": {n.name: commands.container_name(
                view, commands.LEADER if i == 0 else commands.RANK)
                for i, n in enumerate(view.nodes)}}


def _source(*parts: str) -> str:
    return resources.files(__package__).joinpath(*parts).read_text()


def stdin(spec: ClusterSpec, ssh_private_key: str) -> str:
    helpers = {"memory_model": _source("memory_model.py"),
               "memory_profile": _source("memory_profile.py"),
               "memory_estimate": _source("memory_estimate.py"),
               "node_memory": _source("node_memory.py"),
               "image_check": _source("scripts", "image_check.py")}
    return staging_commands.staging_stdin(
        ssh_private_key, "memory_check.py",
        f"PAYLOAD = {json.dumps(payload(spec), sort_keys=True)!r}\nHELPERS = {helpers!r}\n")


def script(spec: ClusterSpec) -> str:
    """`create` of the check (on the head): stdin = the SSH key, then the program."""
    return "\n".join([
        *staging_commands._staging_prelude(spec, spec.head, "memory check", "key", env=False),
        'python3 "$work"/m.py "$work"/key',
    ]) + "\n"


class MemoryCheck(pulumi.ComponentResource):
    summary: pulumi.Output[Any]

    def __init__(self, name: str, spec: ClusterSpec, nodes: list[SparkNode],
                 ssh_private_key: pulumi.Input[str], after: list[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:memory:MemoryCheck", name, None, opts)
        self.check = node_command(
            f"{name}-check", self, nodes[0], create=script(spec),
            stdin=pulumi.Output.secret(ssh_private_key).apply(lambda key: stdin(spec, key)),
            triggers=[{k: v for k, v in payload(spec).items() if k != "vllmContainer"}],
            depends_on=[*after, *(n.preflight for n in nodes)],
        )
        self.summary = self.check.stdout.apply(_summary)
        self.register_outputs({"summary": self.summary})


def _summary(stdout: str) -> Any:
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"checked": False}
