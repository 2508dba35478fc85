"""The model as vLLM 0.26.0 loads it: its config.json, its safetensors headers (never the
data) and the weight bytes each rank holds (the first part of the memory admission,
memory_estimate.py; memory_profile.py is the second).

Pure, standard library only: memory_check.py runs it on the head with a bare python3.
Config keys are read as both transformers 4.x and 5.x write them (`CONFIG_ALIASES`); a model
whose architecture the arithmetic does not cover is refused by name (`UnsupportedModelError`)
rather than estimated as something it is not.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GiB = 1 << 30
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
               "F8_E8M0": 1}
MODEL_DTYPE_BYTES = 2  # vllm/config/model.py _get_and_verify_dtype: "auto" is bf16/fp16 (fp32 downcast)
VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
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
    # preprocessor_config.json where the snapshot has one: a multimodal model's largest image,
    # which sizes vLLM's encoder profile (memory_profile.vision_profile)
    processor: dict[str, Any] = field(default_factory=dict)

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
    "<name>.safetensors": that file's header dict, ["preprocessor_config.json": dict]}. With model.safetensors.index.json only
    the files its weight_map names count, as vLLM's loader does
    (vllm/model_executor/model_loader/weight_utils.py filter_duplicate_safetensors_files)."""
    if isinstance(snapshot, str):
        with open(os.path.join(snapshot, "config.json")) as f:
            files: dict[str, Any] = {"config.json": json.load(f)}
        processor = os.path.join(snapshot, "preprocessor_config.json")
        if os.path.exists(processor):
            with open(processor) as f:
                files["preprocessor_config.json"] = json.load(f)
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
    return ModelFiles(dict(files["config.json"]), tensors,
                      dict(files.get("preprocessor_config.json") or {}))


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
