"""Memory admission: will a vLLM 0.26.0 configuration fit on a GPU?

Pure, standard library only (a node with a bare python3 can run it, memory_check.py). Three
parts, each redoing vLLM 0.26.0's own arithmetic:

- memory_model.py: the model's config.json and safetensors headers (never the data), and the
  weights per rank (which tensors tensor parallel splits or replicates, which pipeline stage
  holds which layer);
- memory_profile.py: what vLLM's profile measures besides them (the peak activation, the
  memory outside torch, the CUDA-graph estimate, the CUDA-graph profile's temporary KV cache);
- here: KV page sizes, the hybrid block-size alignment and mamba page padding, KV cache
  grouping, num_blocks, the "GPU KV cache size: N tokens" line, the KV one max_model_len
  request needs, and vLLM's refusals in vLLM's order (`fit`).

Not measured: what TP > 1 adds (NCCL and custom all-reduce buffers): `extra_overhead_bytes`.
The total every budget is computed from is CUDA's (cudaMemGetInfo, vllm/utils/mem_utils.py
MemorySnapshot), not nvidia-smi's: node_memory.py reads it on the node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import memory_profile as profile
from .memory_model import (  # noqa: F401  (re-exported: the admission's one entry point)
    CONFIG_ALIASES,
    DTYPE_BYTES,
    EMBED_ON_EVERY_STAGE,
    LM_HEAD_ON_EVERY_STAGE,
    MODEL_DTYPE_BYTES,
    SUPPORTED_ARCHITECTURES,
    V2_MOE_ARCHITECTURES,
    VOCAB_PADDING,
    GiB,
    ModelFiles,
    UnsupportedModelError,
    cdiv,
    check_supported,
    config_value,
    layer_kinds,
    pp_layer_ranges,
    read_header,
    read_model,
    rope_parameters,
    rotary_cache_bytes,
    weights_per_stage,
)

DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE
KERNEL_BLOCK_ALIGNMENT = 16  # vllm/v1/attention/backends/flash_attn.py: [MultipleOf(16)]
DEFAULT_MAX_NUM_BATCHED_TOKENS = profile.DEFAULT_MAX_NUM_BATCHED_TOKENS
DEFAULT_MAX_NUM_SEQS = profile.DEFAULT_MAX_NUM_SEQS


def _kv_element(kv_cache_dtype: str) -> tuple[int, int]:
    """(bytes per K or V element, scale bytes per token per kv head): vllm/v1/
    kv_cache_interface.py AttentionSpec.unpadded_page_size_bytes and get_kv_quant_mode."""
    if kv_cache_dtype in ("auto", "bfloat16", "float16", "half"):
        return MODEL_DTYPE_BYTES, 0
    if kv_cache_dtype in ("fp8_per_token_head", "int8_per_token_head"):
        return 1, 2 * 4  # K and V each carry a float32 scale per token and head
    if kv_cache_dtype.startswith("fp8"):
        return 1, 0
    raise ValueError(f"--kv-cache-dtype {kv_cache_dtype}: not modelled here")


def _gdn_state_bytes(text: Mapping[str, Any], tp: int, ssm_dtype: str) -> int:
    """One sequence's gated delta-net state in one layer on one rank: conv state
    (conv_dim / tp, kernel - 1) in the model dtype plus the temporal state (v_heads / tp, v_dim,
    k_dim) in mamba_ssm dtype (vllm/model_executor/layers/mamba/mamba_utils.py
    gated_delta_net_state_shape/_dtype; Qwen3.5 takes config mamba_ssm_dtype,
    vllm/model_executor/models/config.py)."""
    nk, nv = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
    dk, dv = int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"])
    conv = (2 * nk * dk + nv * dv) // tp * (int(text["linear_conv_kernel_dim"]) - 1)
    if ssm_dtype == "auto":
        ssm_dtype = str(text.get("mamba_ssm_dtype") or "auto")
    ssm_bytes = 4 if ssm_dtype in ("float32", "float") else MODEL_DTYPE_BYTES
    return conv * MODEL_DTYPE_BYTES + nv // tp * dv * dk * ssm_bytes


def kv_groups(kinds: list[str]) -> list[tuple[str, tuple[int, ...]]]:
    """vllm/v1/core/kv_cache_utils.py: one group when every layer has the same spec
    (_get_kv_cache_groups_uniform_spec), else _get_kv_cache_groups_uniform_page_size: group size
    = the smaller layer count (the larger when under 1.5x it), each type cut into
    cdiv(count, size) groups, group i taking layers[i::n]."""
    by_kind = {k: tuple(i for i, x in enumerate(kinds) if x == k) for k in dict.fromkeys(kinds)}
    if len(by_kind) == 1:
        return list(by_kind.items())
    lo, hi = min(map(len, by_kind.values())), max(map(len, by_kind.values()))
    size = hi if hi < lo * 1.5 else lo
    groups = []
    for kind, layers in by_kind.items():
        n = cdiv(len(layers), size)
        groups += [(kind, layers[i::n]) for i in range(n)]
    return groups


@dataclass(frozen=True)
class Estimate:
    """One layout of one model. Bytes are per rank; tuples are per PP stage."""

    tp: int
    pp: int
    max_model_len: int
    block_size: int  # attention tokens per block (raised for hybrid models)
    page_bytes: int  # one block of one layer: attention page = the padded linear state
    attn_token_bytes: int  # one token in one full-attention layer
    linear_state_bytes: int  # one sequence in one linear-attention layer, before padding
    groups: tuple[tuple[str, tuple[int, ...]], ...]
    stages: tuple[tuple[int, int], ...]  # decoder layers [start, end) of each stage
    weights: tuple[int, ...]
    activation: tuple[int, ...]
    non_torch: int  # outside torch, the load's transient and extra_overhead_bytes included
    max_len_cap: int  # the config's max_position_embeddings
    len_step: int = DEFAULT_BLOCK_SIZE  # --block-size: max_model_len answers are multiples of it
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    full_cudagraphs: bool = True  # vLLM's default cudagraph_mode FULL_AND_PIECEWISE (not eager)
    cudagraph: tuple[int, ...] = ()  # the CUDA-graph estimate vLLM subtracts, per stage
    # what stays allocated beside the weights while the CUDA-graph profile allocates its
    # temporary KV cache (the MoE workspace and the runner's buffers), per stage
    persistent: tuple[int, ...] = ()
    profile_blocks: int = 0  # that temporary cache's blocks on every KV slot (0: no profile)
    batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # --max-num-batched-tokens

    @property
    def hybrid(self) -> bool:
        """Linear-attention (mamba-like) layers: vLLM's kv_cache_config.has_mamba_layers."""
        return any(kind == "linear" for kind, _ in self.groups)

    def group_size(self, stage: int) -> int:
        a, b = self.stages[stage]
        return max(sum(a <= i < b for i in layers) for _, layers in self.groups)

    def kv_bytes_per_token(self, stage: int = 0) -> int:
        """The naive figure: full-attention layers of the stage x one token's K and V."""
        a, b = self.stages[stage]
        full = sum(a <= i < b for kind, layers in self.groups if kind == "attention"
                   for i in layers)
        return full * self.attn_token_bytes

    def blocks_per_request(self, max_model_len: int | None = None) -> int:
        """Blocks of every group one max_model_len request holds: cdiv(len, block) in an
        attention group, 1 in a linear one (mamba_cache_mode "none": prefix caching is off by
        default for hybrid models, vllm/engine/arg_utils.py; MambaSpec.max_memory_usage_bytes)."""
        n = max_model_len or self.max_model_len
        return sum(cdiv(n, self.block_size) if kind == "attention" else 1
                   for kind, _ in self.groups)

    def non_kv(self, stage: int) -> int:
        """gpu_worker.py's non_kv_cache_memory + the CUDA-graph estimate of a stage's rank."""
        graphs = self.cudagraph[stage] if self.cudagraph else 0
        return self.weights[stage] + self.activation[stage] + self.non_torch + graphs

    def kv_slot_bytes(self, stage: int = 0) -> int:
        """One block on every KV slot of the stage (kv_cache_utils.py: one tensor per slot,
        shared by the slot's layer of each group): what each block of a KV cache costs."""
        return self.page_bytes * self.group_size(stage)

    def profile_peak(self, stage: int) -> int:
        """Held while the CUDA-graph profile allocates its temporary KV cache, before its first
        graph (gpu_model_runner.py profile_cudagraph_memory): the weights, the persistent
        buffers and profile_blocks blocks on every slot. vLLM checks no budget here: it runs
        out of the GPU's free memory or not."""
        return (self.weights[stage] + self.non_torch + self.persistent[stage]
                + self.profile_blocks * self.kv_slot_bytes(stage))


def estimate(model: ModelFiles, tp: int = 1, pp: int = 1, *, max_model_len: int | None = None,
             kv_cache_dtype: str = "auto", block_size: int | None = None,
             max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
             mamba_ssm_cache_dtype: str = "auto", extra_overhead_bytes: int = 0,
             enforce_eager: bool = False, language_model_only: bool = False) -> Estimate:
    """vLLM's arithmetic for `--tensor-parallel-size tp --pipeline-parallel-size pp` with the
    other flags as named (None: vLLM's default)."""
    check_supported(model)
    text = model.text
    kinds = layer_kinds(text)
    cap = int(text.get("max_position_embeddings") or 1 << 20)
    n_len = max_model_len or cap
    seqs = max_num_seqs or DEFAULT_MAX_NUM_SEQS
    tokens = max_num_batched_tokens or min(seqs * n_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv_heads = max(1, int(text.get("num_key_value_heads") or heads) // tp)  # config/model.py
    elem, scales = _kv_element(kv_cache_dtype)
    attn_token = kv_heads * (2 * head_dim * elem + scales)  # FullAttentionSpec, block_size 1
    block = block_size or DEFAULT_BLOCK_SIZE
    state = _gdn_state_bytes(text, tp, mamba_ssm_cache_dtype) if "linear" in kinds else 0
    if state:  # vllm/platforms/interface.py _align_hybrid_block_size (mamba_cache_mode "none")
        align = max(KERNEL_BLOCK_ALIGNMENT, block)
        block = max(block, align * cdiv(state, align * attn_token))
    stages = pp_layer_ranges(len(kinds), pp)
    hybrid = state > 0
    moe = bool(config_value(text, "num_experts"))
    arch = (model.config.get("architectures") or [""])[0]
    v1 = hybrid or (moe and arch not in V2_MOE_ARCHITECTURES)  # vllm/config/vllm.py
    non_torch = ((profile.NON_TORCH_V1 if v1 else profile.NON_TORCH_V2) + profile.LOAD_TRANSIENT
                 + extra_overhead_bytes)
    gdn = [sum(k == "linear" for k in kinds[a:b]) for a, b in stages]
    attention = [b - a - g for (a, b), g in zip(stages, gdn, strict=True)]
    return Estimate(
        tp=tp, pp=pp, max_model_len=n_len, block_size=block, page_bytes=block * attn_token,
        attn_token_bytes=attn_token, linear_state_bytes=state,
        groups=tuple(kv_groups(kinds)), stages=tuple(stages),
        weights=tuple(weights_per_stage(model, tp, pp)),
        activation=tuple(profile.activation(model, tp, s == 0, s == pp - 1, tokens, seqs, v1,
                                            language_model_only) for s in range(pp)),
        non_torch=non_torch, max_len_cap=cap,
        len_step=block_size or DEFAULT_BLOCK_SIZE, max_num_seqs=seqs,
        full_cudagraphs=not enforce_eager,
        cudagraph=tuple(profile.cudagraph_estimate(text, tp, attention[s], gdn[s], seqs, tokens,
                                                   v1, enforce_eager) for s in range(pp)),
        persistent=tuple(profile.moe_workspace(text, tp, tokens) + profile.RUNNER_BUFFERS
                         for _ in stages),
        profile_blocks=0 if enforce_eager or not v1 else profile.profile_kv_blocks(seqs, tokens),
        batched_tokens=tokens)


def weights_per_rank(est: Estimate) -> list[int]:
    """Per global rank (vLLM's order: rank = pp_rank * tp + tp_rank); the largest must fit."""
    return [est.weights[r // est.tp] for r in range(est.tp * est.pp)]


def kv_needed(est: Estimate, max_model_len: int | None = None, stage: int = 0) -> int:
    """KV bytes one request of max_model_len holds on a rank of `stage`, the per-sequence linear
    states (padded to a page) included: kv_cache_utils.py _max_memory_usage_bytes_from_groups."""
    return est.group_size(stage) * est.page_bytes * est.blocks_per_request(max_model_len)


def num_blocks(est: Estimate, available_kv_bytes: int | list[int]) -> int:
    """get_num_blocks (available // page // group size) per worker, then the smallest
    (kv_cache_utils.py get_kv_cache_configs)."""
    avail = (available_kv_bytes if isinstance(available_kv_bytes, list)
             else [available_kv_bytes] * est.pp)
    return max(0, min(int(a // est.page_bytes // est.group_size(s))
                      for s, a in enumerate(avail) if est.group_size(s)))


def tokens_for(est: Estimate, available_kv_bytes: int | list[int],
               max_model_len: int | None = None) -> int:
    """vLLM's "GPU KV cache size: N tokens": max concurrency x max_model_len
    (kv_cache_utils.py get_kv_cache_capacity, get_max_concurrency_for_kv_cache_config)."""
    n = max_model_len or est.max_model_len
    return int(num_blocks(est, available_kv_bytes) / est.blocks_per_request(n) * n)


def requested_memory(total_bytes: int, utilization: float) -> int:
    return math.ceil(total_bytes * utilization)  # vllm/v1/worker/utils.py request_memory


def available_kv(est: Estimate, total_bytes: int, utilization: float) -> list[int]:
    """Per stage: requested - (weights + peak activation + non-torch [+ CUDA-graph estimate]),
    vllm/v1/worker/gpu_worker.py determine_available_memory."""
    req = requested_memory(total_bytes, utilization)
    return [req - est.non_kv(s) for s in range(est.pp)]


def _gib(b: float) -> str:
    return f"{round(b / GiB, 2)}"  # vllm/utils/mem_utils.py format_gib


@dataclass(frozen=True)
class Fit:
    """One GPU (the worst rank of the layout) against one configuration; bytes."""

    ok: bool
    reason: str
    free: int
    requested: int
    weights: int
    kv_needed: int
    kv_available: int
    left: int  # kv_available - kv_needed
    max_model_len: int  # the largest multiple of --block-size (16) that fits, the null block
    # left over (0: none)
    tokens: int  # vLLM's "GPU KV cache size"


def null_block_bytes(est: Estimate, stage: int = 0) -> int:
    """The block vLLM's BlockPool keeps back as the null block (vllm/v1/core/block_pool.py:
    block 0 of every group's pool is never handed out), which its own fit forgets:
    _check_enough_kv_cache_memory and the --max-model-len auto fit compare one request's KV with
    ALL the blocks, so at the length they choose a request of exactly that length can wait
    forever for one block more (known upstream: vllm-metal PR #511)."""
    return est.page_bytes * est.group_size(stage)


def max_len_that_fits(est: Estimate, available: list[int]) -> int:
    """The longest --max-model-len (a multiple of --block-size) whose one request fits with the
    null block left over (null_block_bytes): the headroom vLLM's own fit lacks."""
    step = est.len_step
    lo, hi = 0, est.max_len_cap // step
    while lo < hi:  # kv_needed grows with the length: binary search over multiples of a block
        mid = (lo + hi + 1) // 2
        if all(kv_needed(est, mid * step, s) + null_block_bytes(est, s) <= a
               for s, a in enumerate(available)):
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def fit(est: Estimate, total_bytes: int, free_bytes: int, utilization: float,
        max_model_len: int | None = None) -> Fit:
    """vLLM's refusals in vLLM's order (vllm/v1/worker/gpu_worker.py, v1/core/kv_cache_utils.py,
    config/compilation.py), the first that applies:
    1. free memory below utilization x total (v1/worker/utils.py request_memory);
    2. out of memory in the CUDA-graph profile (V1 runner: gpu_model_runner.py
       profile_cudagraph_memory allocates a temporary KV cache of min(max_num_seqs, largest
       capture size) blocks on every KV slot on top of the weights, against the GPU's free
       memory and whatever the utilization: recorded on 0.26.0, the 122B's dimensions at TP 1
       with 1024 sequences, torch.OutOfMemoryError at the 11th of 12 slots);
    3. nothing left for the KV cache; 4. not one max_model_len request
       (_check_enough_kv_cache_memory);
    5. for a hybrid model with full CUDA graphs (the default), fewer KV blocks than
       --max-num-seqs (each decode sequence holds one Mamba cache block; recorded: the seeds'
       class at 0.066, auto length, 106 blocks).
    Each names the numbers and what would fit (the largest --max-num-seqs, the longest
    --max-model-len)."""
    n = max_model_len or est.max_model_len
    req = requested_memory(total_bytes, utilization)
    avail = available_kv(est, total_bytes, utilization)
    needed = [kv_needed(est, n, s) for s in range(est.pp)]
    worst = min(range(est.pp), key=lambda s: avail[s] - needed[s])
    longest = max_len_that_fits(est, avail)
    reason = ""
    if free_bytes < req:
        reason = (f"Free memory on device ({_gib(free_bytes)}/{_gib(total_bytes)} GiB) on "
                  f"startup is less than desired GPU memory utilization ({utilization}, "
                  f"{_gib(req)} GiB). Decrease GPU memory utilization or reduce GPU memory used "
                  f"by other processes.")
    elif est.profile_blocks and (oom := _profile_oom(est, free_bytes, avail)):
        reason = oom
    elif avail[worst] <= 0:
        reason = (f"No available memory for the cache blocks: weights {_gib(est.weights[worst])}"
                  f" GiB + peak activation {_gib(est.activation[worst])} GiB + CUDA graphs "
                  f"{_gib(est.cudagraph[worst] if est.cudagraph else 0)} GiB + non-torch "
                  f"{_gib(est.non_torch)} GiB exceed {utilization} x {_gib(total_bytes)} GiB. "
                  f"Try increasing `gpu_memory_utilization` or more tensor/pipeline parallel "
                  f"ranks.")
    elif needed[worst] > avail[worst]:
        reason = (f"To serve at least one request with the model's max seq len ({n}), "
                  f"({_gib(needed[worst])} GiB KV cache is needed, which is larger than the "
                  f"available KV cache memory ({_gib(avail[worst])} GiB). "
                  + (f"Based on the available memory, the estimated maximum model length is "
                     f"{longest}." if longest else ""))
    elif est.hybrid and est.full_cudagraphs and est.max_num_seqs > num_blocks(est, avail):
        blocks = num_blocks(est, avail)
        reason = (f"max_num_seqs ({est.max_num_seqs}) exceeds available Mamba cache blocks "
                  f"({blocks}): each decode sequence holds one, so vLLM's CUDA graph capture "
                  f"cannot proceed. Lower --max-num-seqs to at most {blocks} or raise "
                  f"--gpu-memory-utilization.")
    return Fit(ok=not reason, reason=reason, free=free_bytes, requested=req,
               weights=max(est.weights), kv_needed=needed[worst], kv_available=avail[worst],
               left=avail[worst] - needed[worst],
               max_model_len=longest if free_bytes >= req else 0,
               tokens=tokens_for(est, avail, n) if not reason else 0)


def _profile_oom(est: Estimate, free_bytes: int, avail: list[int]) -> str:
    """The CUDA-graph profile's out-of-memory (fit's refusal 2), or "" when it fits: its
    temporary KV cache, the weights and buffers, and the graphs it captures to measure. The
    --max-num-seqs it proposes also passes the Mamba-block check (refusal 5) at today's KV
    budget, which fewer sequences only raise."""
    def held(stage: int, blocks: int) -> int:
        graphs = est.cudagraph[stage] if est.cudagraph else 0
        return (est.weights[stage] + est.non_torch + est.persistent[stage] + graphs
                + blocks * est.kv_slot_bytes(stage))

    stage = max(range(est.pp), key=lambda s: held(s, est.profile_blocks))
    if held(stage, est.profile_blocks) <= free_bytes:
        return ""
    room = min((free_bytes - held(s, 0)) // est.kv_slot_bytes(s) for s in range(est.pp))
    seqs = max(0, min(room, est.max_num_seqs - 1))  # blocks = max_num_seqs below the cap
    if est.hybrid and est.full_cudagraphs:
        seqs = min(seqs, num_blocks(est, avail))
    return (f"CUDA out of memory in vLLM's CUDA-graph memory profile: it allocates a temporary "
            f"KV cache of {est.profile_blocks} blocks ({_gib(est.profile_blocks * est.kv_slot_bytes(stage))} "
            f"GiB: min(max_num_seqs, largest CUDA-graph size) blocks on every KV slot) on top of "
            f"the weights ({_gib(est.weights[stage])} GiB) and its buffers "
            f"({_gib(held(stage, 0) - est.weights[stage])} GiB): "
            f"{_gib(held(stage, est.profile_blocks))} GiB against {_gib(free_bytes)} GiB free on "
            f"the GPU, whatever --gpu-memory-utilization says. "
            + (f"Lower --max-num-seqs to at most {seqs}, or spread the model over more "
               f"tensor/pipeline parallel ranks." if seqs else
               "Spread the model over more tensor/pipeline parallel ranks or free GPU memory."))


def table(rows: Iterable[tuple[str, Fit]]) -> list[str]:
    """node | free | weights | KV needed | left, in GiB, for an error message."""
    cells: list[tuple[str, ...]] = [("node", "free", "weights", "KV needed", "left")]
    cells += [(node, *(f"{b / GiB:.2f}" for b in (f.free, f.weights, f.kv_needed, f.left)))
              for node, f in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(5)]
    return [" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in cells]
