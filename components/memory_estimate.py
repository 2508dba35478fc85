"""Memory admission: will a vLLM 0.26.0 configuration fit on a GPU?

Pure, standard library only (a node with a bare python3 can run it). Reads a model's config.json
and its safetensors headers (never the data) and redoes vLLM 0.26.0's own arithmetic:

- computed exactly as vLLM does: weights per rank (which tensors tensor parallel splits or
  replicates, which pipeline stage holds which layer), KV page sizes, the hybrid block-size
  alignment and mamba page padding, KV cache grouping, num_blocks, the "GPU KV cache size: N
  tokens" line, the KV needed by one max_model_len request, and the startup free-memory check;
- estimated from the source's shapes, not measured: the peak activation of vLLM's profile run
  (`_activation`);
- measured: the memory vLLM's profile adds outside the weights and activations (CUDA modules and
  workspaces, plus the CUDA-graph estimate the V1 model runner subtracts), `NON_TORCH_*` below,
  from real vLLM 0.26.0 on one H200 at TP 1 (tests/fixtures/real-vllm/vllm-0.26.0.json).
  Not measured: what TP > 1 adds (NCCL and custom all-reduce buffers): `extra_overhead_bytes`.

The total every budget is computed from is CUDA's (cudaMemGetInfo, vllm/utils/mem_utils.py
MemorySnapshot), not nvidia-smi's: node_memory.py reads it on the node.

Config keys are read as both transformers 4.x and 5.x write them (`CONFIG_ALIASES`); a model
whose architecture the arithmetic does not cover is refused by name (`UnsupportedModelError`) rather
than estimated as something it is not.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
               "F8_E8M0": 1}
MODEL_DTYPE_BYTES = 2  # vllm/config/model.py _get_and_verify_dtype: "auto" is bf16/fp16 (fp32 downcast)
DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE
KERNEL_BLOCK_ALIGNMENT = 16  # vllm/v1/attention/backends/flash_attn.py: [MultipleOf(16)]
VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
# vllm/engine/arg_utils.py get_batch_defaults: GPUs of >= 70 GiB (H100/H200), `vllm serve`
DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS = 8192, 1024
# measured on real vLLM 0.26.0, one H200, TP 1: requested (from CUDA's total, 143156 MiB) -
# "Available KV cache memory" minus our weights and activation estimate, on the 11 recordings of
# tests/unit/test_memory_estimate.py RECORDED (the fitting set; 0.3 GiB less than the constants
# fitted against nvidia-smi's total at utilization 0.5, which they had absorbed). V2 model runner (dense models; vllm/config/vllm.py
# use_v2_model_runner) has no CUDA-graph estimate (vllm/v1/worker/gpu/model_runner.py
# profile_cudagraph_memory returns 0); the V1 runner (MoE, hybrid) subtracts one
# (vllm/v1/worker/gpu_worker.py determine_available_memory); gated delta-net adds its kernels.
NON_TORCH_V2 = int(0.300 * GiB)
NON_TORCH_V1 = int(0.451 * GiB)
NON_TORCH_GDN_EXTRA = int(0.220 * GiB)
# vllm/config/vllm.py DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES: MoE models that still run on V2
V2_MOE_ARCHITECTURES = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM",
                                  "Qwen2MoeForCausalLM", "LongcatFlashNgramForCausalLM"})
# models whose vLLM class builds embed_tokens (and lm_head) on every PP stage, not only the
# first (last): vllm/model_executor/models/qwen3_moe.py, qwen3_next.py, qwen3_5.py
EMBED_ON_EVERY_STAGE = frozenset({"Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
                                  "Qwen3_5ForConditionalGeneration",
                                  "Qwen3_5MoeForConditionalGeneration"})
LM_HEAD_ON_EVERY_STAGE = frozenset({"Qwen3MoeForCausalLM", "Qwen3NextForCausalLM"})
# the architectures whose vLLM classes this arithmetic follows (their layers, TP splits, KV
# specs and runner); another one is refused, naming it
SUPPORTED_ARCHITECTURES = frozenset({
    "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "LlamaForCausalLM", "MistralForCausalLM"})
# one meaning, several spellings: transformers 5.x writes Qwen3-MoE's expert count as
# num_local_experts (and keeps num_experts only as an attribute alias); vLLM reads either
CONFIG_ALIASES = {"num_experts": ("num_experts", "num_local_experts", "n_routed_experts")}
# bytes per logit element of the dummy sampler run over min(max_num_seqs, tokens) rows: the V1
# runner (vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run, v1/sample/ops/
# topk_topp_sampler.py) samples with top-k and top-p, five [rows, vocab] tensors live at once:
# bf16 logits (2), their float32 copy (4), probabilities (4), exponential noise (4) and the
# quotient argmax reads (4) = 18 B (17.7 measured on the seeds' class, 248320 vocab); the
# V2 runner (vllm/v1/worker/gpu/model_runner.py _dummy_sampler_run) skips top-k, top-p and
# logprobs ("may ... using less GPU memory"): about the float32 logits alone
SAMPLER_BYTES_V1, SAMPLER_BYTES_V2 = 18, 4


class UnsupportedModelError(ValueError):
    """The model's config names something the arithmetic cannot account for."""


def config_value(text: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """`key` under any of its spellings (CONFIG_ALIASES)."""
    for k in CONFIG_ALIASES.get(key, (key,)):
        if text.get(k) is not None:
            return text[k]
    return default


def check_supported(model: ModelFiles) -> None:
    """Refuse, naming it, what the estimate cannot account for."""
    archs = model.config.get("architectures") or []
    if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"config.json architectures {archs}: the memory estimate covers "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
    text = model.text
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size"):
        if not isinstance(text.get(key), int):
            raise UnsupportedModelError(f"config.json has no integer {key!r} ({archs[0]})")
    moe = "Moe" in archs[0] or "Qwen3Next" in archs[0] or "Qwen3_5Moe" in archs[0]
    if moe and not config_value(text, "num_experts"):
        raise UnsupportedModelError(
            f"config.json of {archs[0]} has no expert count (num_experts or num_local_experts)")
    if moe and not text.get("moe_intermediate_size"):
        raise UnsupportedModelError(f"config.json of {archs[0]} has no 'moe_intermediate_size'")
    if not moe and not text.get("intermediate_size"):
        raise UnsupportedModelError(f"config.json of {archs[0]} has no 'intermediate_size'")
    rope = rope_parameters(text)
    if str(rope.get("rope_type") or rope.get("type") or "default") not in ("default", "mrope"):
        raise UnsupportedModelError(
            f"config.json rope_type {rope.get('rope_type') or rope.get('type')!r}: its rotary "
            f"cache is not sized here (only 'default' and mrope)")


def rope_parameters(text: Mapping[str, Any]) -> dict[str, Any]:
    """transformers 5.x rope_parameters, or 4.x rope_scaling + rope_theta +
    partial_rotary_factor at the top (vLLM's patch_rope_parameters merges them the same way)."""
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    if "partial_rotary_factor" not in rope and text.get("partial_rotary_factor"):
        rope["partial_rotary_factor"] = text["partial_rotary_factor"]
    return rope


def rotary_cache_bytes(text: Mapping[str, Any]) -> int:
    """The cos/sin cache every attention layer shares (vllm/model_executor/layers/
    rotary_embedding/base.py: [max_position, rotary_dim] in the model dtype, one per distinct
    shape through get_rope's _ROPE_DICT; mrope.py makes it 4 x max_position long). It is a
    buffer of the model, so vLLM counts it in "Model loading took" (the weights)."""
    rope = rope_parameters(text)
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    rotary_dim = int(rope.get("rope_dim") or head_dim * float(rope.get("partial_rotary_factor",
                                                                       1.0)))
    positions = int(text.get("max_position_embeddings") or 0)
    if rope.get("mrope_section"):
        positions *= 4
    return positions * rotary_dim * MODEL_DTYPE_BYTES


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ModelFiles:
    """config.json and every tensor's (safetensors dtype, shape, bytes in the file)."""

    config: dict[str, Any]
    tensors: dict[str, tuple[str, tuple[int, ...], int]]

    @property
    def text(self) -> dict[str, Any]:
        """The language model's config (a multimodal config nests it in text_config)."""
        return {**self.config, **(self.config.get("text_config") or {})}


def read_header(path: str) -> dict[str, Any]:
    """A safetensors file's header: 8 bytes little-endian length, then that much JSON."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 1 << 28:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        return dict(json.loads(f.read(n)))


def read_model(snapshot: str | Mapping[str, Any]) -> ModelFiles:
    """A snapshot directory, or a dict standing in for one: {"config.json": config dict,
    "<name>.safetensors": that file's header dict, ...}. With model.safetensors.index.json only
    the files its weight_map names count, as vLLM's loader does
    (vllm/model_executor/model_loader/weight_utils.py filter_duplicate_safetensors_files)."""
    if isinstance(snapshot, str):
        with open(os.path.join(snapshot, "config.json")) as f:
            files: dict[str, Any] = {"config.json": json.load(f)}
        names = sorted(n for n in os.listdir(snapshot) if n.endswith(".safetensors"))
        index = os.path.join(snapshot, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        for name in names:
            files[name] = read_header(os.path.join(snapshot, name))
    else:
        files = dict(snapshot)
    tensors: dict[str, tuple[str, tuple[int, ...], int]] = {}
    for name, header in files.items():
        if not name.endswith(".safetensors"):
            continue
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            shape = tuple(int(d) for d in info["shape"])
            start, end = info.get("data_offsets") or (0, math.prod(shape) * DTYPE_BYTES[info["dtype"]])
            tensors[tensor] = (info["dtype"], shape, int(end) - int(start))
    return ModelFiles(dict(files["config.json"]), tensors)


def layer_kinds(text: Mapping[str, Any]) -> list[str]:
    """"attention" (KV cache) or "linear" (gated delta-net: a per-sequence state) per decoder
    layer: config layer_types, else 1 in full_attention_interval (vllm/transformers_utils/
    configs/qwen3_next.py, qwen3_5_moe.py: layer i is full when (i + 1) % interval == 0)."""
    n = int(text["num_hidden_layers"])
    if text.get("layer_types"):
        return ["linear" if t in ("linear_attention", "mamba") else "attention"
                for t in text["layer_types"][:n]]
    if text.get("linear_num_value_heads"):
        every = int(text.get("full_attention_interval", 4))
        return ["attention" if (i + 1) % every == 0 else "linear" for i in range(n)]
    return ["attention"] * n


def pp_layer_ranges(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """vllm/distributed/utils.py get_pp_indices: the remainder goes to the stages before the
    last (VLLM_PP_LAYER_PARTITION is not read here)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    starts = [sum(parts[:s]) for s in range(pp)]
    return [(starts[s], starts[s] + parts[s]) for s in range(pp)]


def _rank_bytes(name: str, dtype: str, shape: tuple[int, ...], nbytes: int,
                text: Mapping[str, Any], tp: int) -> int:
    """One TP rank's share of a tensor (vllm/model_executor/layers/linear.py: Column/Row/
    QKVParallelLinear split, ReplicatedLinear and norms do not; FusedMoE splits each expert's
    intermediate; vocab_parallel_embedding.py pads the vocab to 64 then divides it by TP)."""
    parts = name.split(".")
    if dtype in ("F64", "F32", "F16", "BF16") and "scale" not in name:
        nbytes = math.prod(shape) * MODEL_DTYPE_BYTES  # loaded in the model dtype
    if (math.prod(shape) <= 1 or "norm" in name or name.endswith("mlp.gate.weight")
            or "shared_expert_gate" in name):
        return nbytes  # norms, the MoE router, scalar scales: replicated
    if "k_proj" in parts or "v_proj" in parts:  # QKVParallelLinear: at least one kv head a rank
        kv = int(text.get("num_key_value_heads") or text["num_attention_heads"])
        return nbytes * max(1, kv // tp) // kv
    if "embed_tokens" in parts or "lm_head" in parts:
        rows = shape[0]
        return nbytes // rows * cdiv(rows, VOCAB_PADDING) * VOCAB_PADDING // tp
    if parts[-1] == "bias" and parts[-2] in ("o_proj", "down_proj", "out_proj"):
        return nbytes  # RowParallelLinear's bias is added once, whole
    return cdiv(nbytes, tp)


def _stages_of(name: str, stage_of_layer: list[int], arch: str, tied: bool, pp: int) -> set[int]:
    """Which PP stages hold a tensor: decoder layer i on its get_pp_indices stage, the
    embedding on the first (and the last when tied: qwen2.py), final norm and lm_head on the
    last; mtp.* is skipped by vLLM's loader unless speculative decoding uses it."""
    parts = name.split(".")
    if parts[0] == "mtp":
        return set()
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit() and "visual" not in parts[:i]:
            return {stage_of_layer[int(parts[i + 1])]}
    every = set(range(pp))
    if "embed_tokens" in parts and "visual" not in parts:
        return every if arch in EMBED_ON_EVERY_STAGE else ({0, pp - 1} if tied else {0})
    if "lm_head" in parts:
        return set() if tied else (every if arch in LM_HEAD_ON_EVERY_STAGE else {pp - 1})
    if len(parts) > 1 and "norm" in parts[-2] and "visual" not in parts:
        return {pp - 1}
    return {0}


def weights_per_stage(model: ModelFiles, tp: int = 1, pp: int = 1) -> list[int]:
    """Weight bytes of one rank of each PP stage (every TP rank of a stage holds the same), the
    rotary cache included (a model buffer vLLM's "Model loading took" counts)."""
    text = model.text
    arch = (model.config.get("architectures") or [""])[0]
    tied = bool(text.get("tie_word_embeddings", False))
    ranges = pp_layer_ranges(int(text["num_hidden_layers"]), pp)
    stage_of_layer = [s for s, (a, b) in enumerate(ranges) for _ in range(a, b)]
    out = [rotary_cache_bytes(text) if "attention" in layer_kinds(text)[a:b] else 0
           for a, b in ranges]  # the rotary cache, on every stage with attention layers
    for name, (dtype, shape, nbytes) in model.tensors.items():
        for s in _stages_of(name, stage_of_layer, arch, tied, pp):
            out[s] += _rank_bytes(name, dtype, shape, nbytes, text, tp)
    return out


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
    non_torch: int
    max_len_cap: int  # the config's max_position_embeddings
    len_step: int = DEFAULT_BLOCK_SIZE  # --block-size: max_model_len answers are multiples of it
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    full_cudagraphs: bool = True  # vLLM's default cudagraph_mode FULL_AND_PIECEWISE (not eager)

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
        """gpu_worker.py's non_kv_cache_memory (+ the CUDA-graph estimate) of a stage's rank."""
        return self.weights[stage] + self.activation[stage] + self.non_torch


def _activation(text: Mapping[str, Any], tp: int, last: bool, tokens: int, seqs: int,
                v1: bool = True) -> int:
    """Estimated torch peak of profile_run (vllm/v1/worker/gpu_model_runner.py, gpu/
    model_runner.py): a forward of max_num_batched_tokens tokens with attention skipped (about
    4 hidden-wide and 4 MLP-wide tensors live at the MLP: residual, input, gate_up output,
    activation), and on the last stage the dummy sampler over min(max_num_seqs, tokens) rows of
    full-vocab logits, all-gathered to every TP rank (vllm/model_executor/layers/
    logits_processor.py): SAMPLER_BYTES_V1 or _V2 a logit, by the model runner."""
    hidden = int(text["hidden_size"])
    if config_value(text, "num_experts"):
        mlp = (int(text.get("num_experts_per_tok", 1)) * int(text["moe_intermediate_size"])
               + int(text.get("shared_expert_intermediate_size") or 0)) // tp
    else:
        mlp = int(text["intermediate_size"]) // tp
    forward = tokens * MODEL_DTYPE_BYTES * (4 * hidden + 4 * mlp)
    per_logit = SAMPLER_BYTES_V1 if v1 else SAMPLER_BYTES_V2
    sampler = (tokens * MODEL_DTYPE_BYTES * hidden
               + min(seqs, tokens) * int(text["vocab_size"]) * per_logit)
    return max(forward, sampler) if last else forward


def estimate(model: ModelFiles, tp: int = 1, pp: int = 1, *, max_model_len: int | None = None,
             kv_cache_dtype: str = "auto", block_size: int | None = None,
             max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
             mamba_ssm_cache_dtype: str = "auto", extra_overhead_bytes: int = 0,
             enforce_eager: bool = False) -> Estimate:
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
    v1 = hybrid or (moe and arch not in V2_MOE_ARCHITECTURES)
    non_torch = (NON_TORCH_V1 if v1 else NON_TORCH_V2) + (NON_TORCH_GDN_EXTRA if hybrid else 0)
    return Estimate(
        tp=tp, pp=pp, max_model_len=n_len, block_size=block, page_bytes=block * attn_token,
        attn_token_bytes=attn_token, linear_state_bytes=state,
        groups=tuple(kv_groups(kinds)), stages=tuple(stages),
        weights=tuple(weights_per_stage(model, tp, pp)),
        activation=tuple(_activation(text, tp, s == pp - 1, tokens, seqs, v1)
                         for s in range(pp)),
        non_torch=non_torch + extra_overhead_bytes, max_len_cap=cap,
        len_step=block_size or DEFAULT_BLOCK_SIZE, max_num_seqs=seqs,
        full_cudagraphs=not enforce_eager)


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
    """vLLM's four refusals in order: free memory below utilization x total (request_memory),
    nothing left for the KV cache, not one max_model_len request (_check_enough_kv_cache_memory),
    and, for a hybrid model with full CUDA graphs (the default), fewer KV blocks than
    --max-num-seqs (vllm/config/compilation.py: each decode sequence holds one Mamba cache
    block; recorded on 0.26.0: the seeds' class at 0.066, auto length, 106 blocks)."""
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
    elif avail[worst] <= 0:
        reason = (f"No available memory for the cache blocks: weights {_gib(est.weights[worst])}"
                  f" GiB + activation and non-torch {_gib(est.non_kv(worst) - est.weights[worst])}"
                  f" GiB exceed {utilization} x {_gib(total_bytes)} GiB. Try increasing "
                  f"`gpu_memory_utilization` or more tensor/pipeline parallel ranks.")
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


def table(rows: Iterable[tuple[str, Fit]]) -> list[str]:
    """node | free | weights | KV needed | left, in GiB, for an error message."""
    cells: list[tuple[str, ...]] = [("node", "free", "weights", "KV needed", "left")]
    cells += [(node, *(f"{b / GiB:.2f}" for b in (f.free, f.weights, f.kv_needed, f.left)))
              for node, f in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(5)]
    return [" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in cells]
