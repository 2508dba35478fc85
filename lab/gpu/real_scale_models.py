"""Real-dimension models for the memory admission's real-scale recordings (issue 45).

Every model here has a real checkpoint's dimensions (hidden size, heads, experts, vocabulary,
the vision tower), so its weights are tens of GiB a GPU, but no weights exist: vLLM runs them
with `--load-format dummy`, which opens no `*.safetensors` and no index
(vllm/model_executor/model_loader/dummy_loader.py initialises every parameter in place). The
shards are written as the checkpoint would have them *in their headers*: the real tensor
names, dtypes and shapes, then `truncate` to the size the header promises, so the files are
sparse (tens of GiB apparent, kilobytes on disk) and the admission (components/
memory_estimate.py) reads exactly the bytes it would read on a node.

Pure standard library apart from the tokenizer (tiny_model.padded_tokenizer): the CPU tests
rebuild the same headers from the same configs (`headers`), so nothing but the recordings
has to come back from the GPU machine.

    python3 lab/gpu/real_scale_models.py HF_HOME KIND [KIND ...]   (prints one JSON line each)
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

try:  # as a module of the repository (tests) or as a script on the GPU machine
    from lab.gpu import tiny_model
except ImportError:  # pragma: no cover - the device runs it as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tiny_model  # type: ignore[no-redef]

GENERATOR_VERSION = 1
SHARD_BYTES = 5 << 30  # the Qwen checkpoints' shard size; irrelevant to vLLM's dummy load
DTYPE_BYTES = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
FP8 = dict(tiny_model.FP8_QUANT)

# Qwen3.5-MoE (the seeds' class): Qwen3.5-122B-A10B's text and vision dimensions
_Q35_TEXT = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 3072,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 2,
    "head_dim": 256, "hidden_act": "silu", "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "attention_bias": False, "attn_output_gate": True,
    "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 64,
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 1024,
    "shared_expert_intermediate_size": 1024, "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
    "router_aux_loss_coef": 0.001, "output_router_logits": False, "dtype": "bfloat16",
    "use_cache": True, "tie_word_embeddings": False, "eos_token_id": 2, "pad_token_id": None,
    "bos_token_id": None, "initializer_range": 0.02,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": True}}
_Q35_VISION = {
    "model_type": "qwen3_5_moe", "depth": 27, "hidden_size": 1152, "hidden_act":
    "gelu_pytorch_tanh", "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "out_hidden_size": 3072, "num_position_embeddings": 2304, "deepstack_visual_indexes": [],
    "initializer_range": 0.02}


def _qwen35(layers: int, **text: Any) -> dict[str, Any]:
    t = {**_Q35_TEXT, **text, "num_hidden_layers": layers}
    every = t["full_attention_interval"]
    t["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                        for i in range(layers)]
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe", "image_token_id": None, "video_token_id": None,
            "vision_start_token_id": None, "vision_end_token_id": None,
            "tie_word_embeddings": False, "text_config": t,
            "vision_config": {**_Q35_VISION, "out_hidden_size": t["hidden_size"]},
            "quantization_config": dict(FP8), "transformers_version": "4.57.0.dev0"}


_QWEN3 = {"vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
          "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 151643,
          "eos_token_id": 151645, "head_dim": 128}

REAL: dict[str, dict[str, Any]] = {
    # Qwen3.5-122B-A10B-FP8 whole: one GPU's worth of the 122B at TP 1 (~117 GiB)
    "q35-122b": _qwen35(48),
    # its first 24 layers: one PP-2 rank's (or, near enough, one TP-2 rank's) worth (~59 GiB)
    "q35-122b-half": _qwen35(24),
    # Qwen3.5-35B-A3B-FP8 (~34 GiB)
    "q35-35b": _qwen35(40, hidden_size=2048, num_attention_heads=16, linear_num_value_heads=32,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512),
    # dense: Qwen3-32B in bf16 (~61 GiB; vLLM's V2 model runner)
    "qwen3-32b": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **_QWEN3,
                  "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                  "num_attention_heads": 64, "num_key_value_heads": 8},
    # plain MoE: Qwen3-30B-A3B-FP8 (~29 GiB; the V1 runner, no linear attention, no vision)
    "qwen3-30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                      **_QWEN3, "hidden_size": 2048, "intermediate_size": 6144,
                      "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
                      "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                      "norm_topk_prob": True, "mlp_only_layers": [],
                      "quantization_config": dict(FP8)},
}


def dense_tensors(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """A Qwen3 dense checkpoint's tensors in bf16, as transformers saves them."""
    hid, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nh, kv, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    t = [("model.embed_tokens.weight", (vocab, hid)), ("model.norm.weight", (hid,)),
         ("lm_head.weight", (vocab, hid))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", (hid,)),
              (p + "post_attention_layernorm.weight", (hid,)),
              (p + "self_attn.q_proj.weight", (nh * hd, hid)),
              (p + "self_attn.k_proj.weight", (kv * hd, hid)),
              (p + "self_attn.v_proj.weight", (kv * hd, hid)),
              (p + "self_attn.o_proj.weight", (hid, nh * hd)),
              (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
              (p + "mlp.gate_proj.weight", (inter, hid)), (p + "mlp.up_proj.weight", (inter, hid)),
              (p + "mlp.down_proj.weight", (hid, inter))]
    return [(n, s, "BF16") for n, s in t]


def tensors(kind: str) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], str]]]:
    """The config (with modules_to_not_convert for FP8) and every tensor (name, shape, dtype)
    in file order: block FP8 e4m3 with a float32 weight_scale_inv per 128x128 block for the
    quantized projections (tiny_model.fp8_tensors' names), bf16 for the rest."""
    cfg = copy.deepcopy(REAL[kind])
    if "quantization_config" not in cfg:
        return cfg, dense_tensors(cfg)
    listed, keep = tiny_model.fp8_tensors(cfg)
    cfg["quantization_config"]["modules_to_not_convert"] = keep
    out: list[tuple[str, tuple[int, ...], str]] = []
    for name, shape, quantized in listed:
        if quantized:
            out += [(name, shape, "F8_E4M3"),
                    (name + "_scale_inv", tuple(math.ceil(d / 128) for d in shape), "F32")]
        else:
            out.append((name, shape, "BF16"))
    return cfg, out


def headers(kind: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """config.json and {shard file name: its safetensors header}, shards of SHARD_BYTES."""
    cfg, listed = tensors(kind)
    shards: list[dict[str, Any]] = [{}]
    offset = 0
    for name, shape, dtype in listed:
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        if offset + nbytes > SHARD_BYTES and shards[-1]:
            shards.append({})
            offset = 0
        shards[-1][name] = {"dtype": dtype, "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    n = len(shards)
    return cfg, {f"model-{i + 1:05d}-of-{n:05d}.safetensors": h for i, h in enumerate(shards)}


def weight_bytes(kind: str) -> int:
    return sum(h["data_offsets"][1] - h["data_offsets"][0]
               for hdr in headers(kind)[1].values() for h in hdr.values())


def _sparse_shard(path: Path, header: dict[str, Any]) -> None:
    """The header as safetensors writes it (8-byte length, JSON padded to 8 bytes), then the
    file extended to the data's length without writing it: a sparse file."""
    body = json.dumps({"__metadata__": {"format": "pt"}, **header},
                      separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    data = max((h["data_offsets"][1] for h in header.values()), default=0)
    with open(path, "wb") as f:
        f.write(len(body).to_bytes(8, "little") + body)
    os.truncate(path, 8 + len(body) + data)


def write(hf_home: Path, kind: str) -> dict[str, Any]:
    """The model in huggingface_hub's cache layout under HF_HOME/hub (refs/main, snapshots/
    <commit>/): config.json, sparse shards, the index, the tokenizer padded to the real
    vocabulary, and for the multimodal one the processor configs (tiny_model.write_sized's)."""
    start = time.monotonic()
    cfg, shards = headers(kind)
    multimodal = "text_config" in cfg
    specials = tiny_model.QWEN_SPECIALS if multimodal else tiny_model.SPECIALS
    repo, snap, commit = tiny_model.hub_paths(hf_home, kind, [GENERATOR_VERSION, kind, cfg,
                                                              specials])
    if not (snap / "config.json").exists():
        snap.mkdir(parents=True, exist_ok=True)
        text = cfg.get("text_config", cfg)
        ids = tiny_model.padded_tokenizer(snap, text["vocab_size"], specials)
        if multimodal:
            tiny_model.multimodal_files(snap, cfg, ids)
        weight_map = {}
        for fname, header in shards.items():
            _sparse_shard(snap / fname, header)
            weight_map.update(dict.fromkeys(header, fname))
        total = sum(h["data_offsets"][1] - h["data_offsets"][0]
                    for hdr in shards.values() for h in hdr.values())
        (snap / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}))
        (snap / "config.json").write_text(json.dumps(cfg, indent=1))
    files = tiny_model.finish(repo, snap, commit)
    return {"repo": f"spark-vllm/{kind}", "commit": commit, "path": str(snap),
            "apparent_bytes": sum((snap / f).stat().st_size for f in files),
            "disk_bytes": sum((snap / f).stat().st_blocks * 512 for f in files),
            "weight_bytes": weight_bytes(kind), "seconds": round(time.monotonic() - start, 2)}


def main(argv: list[str]) -> None:
    hf_home = Path(argv[0])
    for kind in argv[1:]:
        print(json.dumps(write(hf_home, kind)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
