"""Tiny random models for real vLLM, in huggingface_hub's cache layout (NOT trained weights).

Runs where torch, transformers and tokenizers are (the GPU machine's image has them):
    python3 lab/gpu/tiny_model.py HF_HOME KIND [KIND ...]
KIND: dense | moe | hybrid (tiny, bf16, ~0 GiB of weights), or one of the sized models of
`SIZED` (1.4-3.6 GiB, the real vocabularies): qwen3-vocab (dense bf16), qwen3moe-vocab
(Qwen3-MoE bf16, the config as transformers 5.x writes it: `num_local_experts`),
qwen3moe-fp8 (Qwen3-MoE in block FP8, as Qwen's -FP8 checkpoints) and qwen35-fp8 (the
seeds' class: Qwen3_5MoeForConditionalGeneration, a vision tower, gated delta-net layers with
full attention every 4th, routed and shared experts, block FP8 e4m3 with weight_scale_inv per
128x128 block and the quantization_config vLLM reads; `fp8_model` writes its safetensors
itself, with the checkpoint's tensor names, since transformers cannot save block FP8).
Each KIND is written as `spark-vllm/tiny-<kind>` under HF_HOME/hub: refs/main holds a commit
named from the generator's parameters, snapshots/<commit>/ the files (config.json, random
weights via transformers' own save_pretrained, so every architecture's tensor names are right,
tokenizer.json, tokenizer_config.json with the chat template). vLLM then finds it with
HF_HUB_OFFLINE=1 exactly as a staged model.

The tokenizer is a byte-level BPE trained here on a few lines (nothing is downloaded), with
Qwen's ChatML and reasoning/tool tokens as added special tokens, so vLLM's `qwen3` reasoning
parser and `hermes` tool parser find their token ids. Prints one JSON line per model.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

GENERATOR_VERSION = 1
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
            "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB = 2048

# Qwen3's template, reduced to what vLLM's chat path exercises: system/user/assistant turns,
# tools in the system turn, tool calls and tool responses, the generation prompt with <think>.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{%- endif %}"
    "# Tools\n<tools>{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Call a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", "
    "\"arguments\": {{ tc.function.arguments }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- endif %}{%- endif %}"
)

CORPUS = [
    "spark-vllm serves one model across several GPU hosts over a RoCE fabric.",
    "The quick brown fox jumps over the lazy dog. 0123456789 {\"name\": \"get_time\"}",
    "<think> reasoning about tensor parallel ranks </think> The answer is 42.",
    "def main():\n    return {'a': [1, 2, 3], \"b\": None}\n",
] * 50

BASE = {"vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "bos_token_id": None, "eos_token_id": 2, "pad_token_id": 0}
CONFIGS = {
    "dense": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
    "moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": []},
    # Qwen3-Next: one full-attention layer in `full_attention_interval`, the rest gated
    # delta-net (linear attention): the KV cache lives only in the full-attention layers
    "hybrid": {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
               "num_hidden_layers": 4, "full_attention_interval": 4,
               "layer_types": ["linear_attention"] * 3 + ["full_attention"],
               "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
               "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1,
               "norm_topk_prob": True, "mlp_only_layers": [],
               "linear_num_value_heads": 4, "linear_num_key_heads": 2,
               "linear_key_head_dim": 64, "linear_value_head_dim": 64,
               "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25},
}


def tokenizer_files(out: Path, specials: list[str] = SPECIALS) -> int:
    """Writes the tokenizer files into `out`; returns its vocabulary size, which the config
    takes (a model that can sample an id the tokenizer lacks breaks detokenization)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 64, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False,
                                          "rstrip": False, "normalized": False,
                                          "single_word": False}
                                 for i, t in enumerate(specials)},
    }, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return int(tok.get_vocab_size())


# --- sized models (the memory admission's held-out class) ----------------------------------

QWEN_SPECIALS = SPECIALS + ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                            "<|image_pad|>", "<|video_pad|>"]
FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128]}
SIZED: dict[str, dict] = {
    "qwen3-vocab": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                    "num_hidden_layers": 4, "num_attention_heads": 16,
                    "num_key_value_heads": 4, "head_dim": 128,
                    "max_position_embeddings": 40960, "rope_theta": 1000000.0},
    "qwen3moe-vocab": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                       "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                       "num_hidden_layers": 4, "num_attention_heads": 32,
                       "num_key_value_heads": 4, "head_dim": 128, "num_experts": 32,
                       "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                       "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": [],
                       "max_position_embeddings": 40960, "rope_theta": 1000000.0},
    # Qwen3.5-122B-A10B-FP8's config keys and head shapes (2 KV heads of 256, delta-net heads
    # 16 x 128 keys / 64 x 128 values halved, 1 in 4 layers full attention, 248320 vocab,
    # 262144 positions, mrope) at 8 layers, 64 experts of 512, a 2-block vision tower
    "qwen35-fp8": {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "image_token_id": None, "video_token_id": None, "vision_start_token_id": None,
        "vision_end_token_id": None, "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048,
            "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 2,
            "head_dim": 256, "hidden_act": "silu", "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6, "attention_bias": False, "attn_output_gate": True,
            "full_attention_interval": 4,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"]
                           + ["linear_attention"] * 3 + ["full_attention"],
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16,
            "linear_num_value_heads": 32, "num_experts": 64, "num_experts_per_tok": 8,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
            "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False, "router_aux_loss_coef": 0.001,
            "output_router_logits": False, "dtype": "bfloat16", "use_cache": True,
            "tie_word_embeddings": False, "eos_token_id": 2, "pad_token_id": None,
            "bos_token_id": None, "initializer_range": 0.02,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                "mrope_interleaved": True}},
        "vision_config": {
            "model_type": "qwen3_5_moe", "depth": 2, "hidden_size": 1152,
            "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304, "num_heads": 16,
            "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "out_hidden_size": 2048,
            "num_position_embeddings": 2304, "deepstack_visual_indexes": [],
            "initializer_range": 0.02},
        "quantization_config": FP8_QUANT,
        "transformers_version": "4.57.0.dev0"},
}
# Qwen3-30B-A3B-FP8's layout: the real-vocabulary MoE above with more layers and experts, in
# block FP8
SIZED["qwen3moe-fp8"] = {
    **SIZED["qwen3moe-vocab"], "num_hidden_layers": 6, "num_experts": 64, "rope_scaling": None,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "quantization_config": FP8_QUANT}


def padded_tokenizer(out: Path, vocab_size: int, specials: list[str]) -> dict[str, int]:
    """The trained tokenizer, its BPE vocabulary padded with filler tokens to the config's
    vocab_size (a random model samples any id: every id decodes); returns the specials' ids."""
    tokenizer_files(out, specials)
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    n = max(vocab.values()) + 1
    for i in range(n, vocab_size):
        vocab[f"\u0120x{i}"] = i
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return {t["content"]: t["id"] for t in tok["added_tokens"]}


def fp8_block(w):  # type: ignore[no-untyped-def]
    """e4m3 weight and float32 weight_scale_inv per 128x128 block (DeepSeek/Qwen block FP8)."""
    import torch
    rows, cols = w.shape
    wp = torch.nn.functional.pad(w.float(), (0, -cols % 128, 0, -rows % 128))
    blocks = wp.view(wp.shape[0] // 128, 128, wp.shape[1] // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).view_as(wp)[:rows, :cols]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def fp8_tensors(cfg: dict) -> tuple[list[tuple[str, tuple[int, ...], bool]], list[str]]:
    """(name, shape, quantized) as the real checkpoint names them, and modules_to_not_convert:
    the 2-D projections of the language model in FP8; embeddings, lm_head, routers, the
    delta-net's in_proj_b/a and conv1d, norms and the vision tower in bf16."""
    t: list[tuple[str, tuple[int, ...], bool]] = []
    keep: list[str] = []
    multimodal = "text_config" in cfg
    c = cfg.get("text_config", cfg)
    lm = "model.language_model." if multimodal else "model."
    hid, vocab, hd = c["hidden_size"], c["vocab_size"], c["head_dim"]
    nh, kv = c["num_attention_heads"], c["num_key_value_heads"]
    gate = 2 if c.get("attn_output_gate") else 1
    t += [(lm + "embed_tokens.weight", (vocab, hid), False), (lm + "norm.weight", (hid,), False),
          ("lm_head.weight", (vocab, hid), False)]
    kinds = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    for i, kind in enumerate(kinds):
        p = f"{lm}layers.{i}."
        t += [(p + "input_layernorm.weight", (hid,), False),
              (p + "post_attention_layernorm.weight", (hid,), False)]
        if kind == "full_attention":
            t += [(p + "self_attn.q_proj.weight", (nh * hd * gate, hid), True),
                  (p + "self_attn.k_proj.weight", (kv * hd, hid), True),
                  (p + "self_attn.v_proj.weight", (kv * hd, hid), True),
                  (p + "self_attn.o_proj.weight", (hid, nh * hd), True),
                  (p + "self_attn.q_norm.weight", (hd,), False),
                  (p + "self_attn.k_norm.weight", (hd,), False)]
        else:
            nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            a = p + "linear_attn."
            t += [(a + "in_proj_qkv.weight", (2 * nk * dk + nv * dv, hid), True),
                  (a + "in_proj_z.weight", (nv * dv, hid), True),
                  (a + "in_proj_b.weight", (nv, hid), False),
                  (a + "in_proj_a.weight", (nv, hid), False),
                  (a + "conv1d.weight", (2 * nk * dk + nv * dv, 1, c["linear_conv_kernel_dim"]),
                   False),
                  (a + "dt_bias", (nv,), False), (a + "A_log", (nv,), False),
                  (a + "norm.weight", (dv,), False),
                  (a + "out_proj.weight", (hid, nv * dv), True)]
            keep += [a + "in_proj_b", a + "in_proj_a"]
        mi = c["moe_intermediate_size"]
        t.append((p + "mlp.gate.weight", (c["num_experts"], hid), False))
        keep.append(p + "mlp.gate")
        for e in range(c["num_experts"]):
            t += [(p + f"mlp.experts.{e}.gate_proj.weight", (mi, hid), True),
                  (p + f"mlp.experts.{e}.up_proj.weight", (mi, hid), True),
                  (p + f"mlp.experts.{e}.down_proj.weight", (hid, mi), True)]
        if si := c.get("shared_expert_intermediate_size"):
            t += [(p + "mlp.shared_expert.gate_proj.weight", (si, hid), True),
                  (p + "mlp.shared_expert.up_proj.weight", (si, hid), True),
                  (p + "mlp.shared_expert.down_proj.weight", (hid, si), True),
                  (p + "mlp.shared_expert_gate.weight", (1, hid), False)]
            keep.append(p + "mlp.shared_expert_gate")
    if multimodal:
        v = cfg["vision_config"]
        vh, vi, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
        merged = vh * v["spatial_merge_size"] ** 2
        t += [("model.visual.patch_embed.proj.weight",
               (vh, v["in_channels"], v["temporal_patch_size"], ps, ps), False),
              ("model.visual.patch_embed.proj.bias", (vh,), False),
              ("model.visual.pos_embed.weight", (v["num_position_embeddings"], vh), False)]
        for b in range(v["depth"]):
            p = f"model.visual.blocks.{b}."
            t += [(p + n, s, False) for n, s in (
                ("norm1.weight", (vh,)), ("norm1.bias", (vh,)), ("norm2.weight", (vh,)),
                ("norm2.bias", (vh,)), ("attn.qkv.weight", (3 * vh, vh)),
                ("attn.qkv.bias", (3 * vh,)), ("attn.proj.weight", (vh, vh)),
                ("attn.proj.bias", (vh,)), ("mlp.linear_fc1.weight", (vi, vh)),
                ("mlp.linear_fc1.bias", (vi,)), ("mlp.linear_fc2.weight", (vh, vi)),
                ("mlp.linear_fc2.bias", (vh,)))]
            keep += [p + "attn.qkv", p + "attn.proj", p + "mlp.linear_fc1", p + "mlp.linear_fc2"]
        t += [("model.visual.merger.norm.weight", (vh,), False),
              ("model.visual.merger.norm.bias", (vh,), False),
              ("model.visual.merger.linear_fc1.weight", (merged, merged), False),
              ("model.visual.merger.linear_fc1.bias", (merged,), False),
              ("model.visual.merger.linear_fc2.weight", (v["out_hidden_size"], merged), False),
              ("model.visual.merger.linear_fc2.bias", (v["out_hidden_size"],), False)]
        keep += ["model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2"]
    return t, keep


def fp8_model(snap: Path, cfg: dict) -> None:
    """Random block-FP8 weights in 2 GiB shards with model.safetensors.index.json."""
    import torch
    from safetensors.torch import save_file

    tensors, keep = fp8_tensors(cfg)
    cfg["quantization_config"] = {**cfg["quantization_config"], "modules_to_not_convert": keep}
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shards: list[dict] = [{}]
    size = total = 0
    for name, shape, quantized in tensors:
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
            w = torch.ones(shape, device=dev)
        elif name.endswith("A_log"):
            w = torch.empty(shape, device=dev).uniform_(1, 16).log()
        elif name.endswith(("dt_bias", ".bias")):
            w = torch.zeros(shape, device=dev) + (1.0 if name.endswith("dt_bias") else 0.0)
        else:
            w = torch.randn(shape, device=dev) * 0.02
        parts = dict(zip((name, name + "_scale_inv"), fp8_block(w), strict=True)) if quantized else {
            name: w.to(torch.bfloat16)}
        for n, x in parts.items():
            nbytes = x.numel() * x.element_size()
            if size + nbytes > 2 << 30 and shards[-1]:
                shards.append({})
                size = 0
            shards[-1][n] = x.cpu()
            size += nbytes
            total += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(snap / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    (snap / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def hub_paths(hf_home: Path, name: str, key: list) -> tuple[Path, Path, str]:
    """(repo dir, snapshot dir, commit) of spark-vllm/NAME in huggingface_hub's cache layout,
    the commit named from the generator's parameters `key`."""
    commit = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
    repo = hf_home / "hub" / f"models--spark-vllm--{name}"
    return repo, repo / "snapshots" / commit, commit


def finish(repo: Path, snap: Path, commit: str) -> list[str]:
    """refs/main -> commit (written last: a model is there once its ref is); the files."""
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return sorted(p.name for p in snap.iterdir())


def multimodal_files(snap: Path, cfg: dict, ids: dict[str, int]) -> None:
    """The vision token ids into the config, and Qwen3-VL's image and video processor configs
    (the sizes Qwen3.5's checkpoints ship: vLLM's encoder profile sizes its dummy image by them)."""
    for key, token in (("image_token_id", "<|image_pad|>"),
                       ("video_token_id", "<|video_pad|>"),
                       ("vision_start_token_id", "<|vision_start|>"),
                       ("vision_end_token_id", "<|vision_end|>")):
        cfg[key] = ids[token]
    processor = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                 "processor_class": "Qwen3VLProcessor"}
    (snap / "preprocessor_config.json").write_text(json.dumps({
        **processor, "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"longest_edge": 16777216, "shortest_edge": 65536}}, indent=1))
    (snap / "video_preprocessor_config.json").write_text(json.dumps({
        **processor, "video_processor_type": "Qwen3VLVideoProcessor",
        "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "fps": 2,
        "min_frames": 4, "max_frames": 768}, indent=1))


def write_sized(hf_home: Path, kind: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    start = time.monotonic()
    cfg = json.loads(json.dumps(SIZED[kind]))
    specials = QWEN_SPECIALS if "text_config" in cfg else SPECIALS
    repo, snap, commit = hub_paths(hf_home, kind,
                                   [GENERATOR_VERSION, kind, cfg, specials, CHAT_TEMPLATE])
    if not (snap / "config.json").exists():
        snap.mkdir(parents=True, exist_ok=True)
        text = cfg.get("text_config", cfg)
        ids = padded_tokenizer(snap, text["vocab_size"], specials)
        if "text_config" in cfg:
            multimodal_files(snap, cfg, ids)
        if "quantization_config" in cfg:
            fp8_model(snap, cfg)
            (snap / "config.json").write_text(json.dumps(cfg, indent=1))
        else:
            model_type = cfg.pop("model_type")
            config = AutoConfig.for_model(model_type, **cfg, tie_word_embeddings=False,
                                          eos_token_id=2, pad_token_id=0)
            torch.manual_seed(0)
            with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
                model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
            model.save_pretrained(snap, safe_serialization=True)
    files = finish(repo, snap, commit)
    return {"repo": f"spark-vllm/{kind}", "commit": commit, "files": files,
            "bytes": sum((snap / f).stat().st_size for f in files),
            "config": json.loads((snap / "config.json").read_text()),
            "seconds": round(time.monotonic() - start, 2)}


def write(hf_home: Path, kind: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    start = time.monotonic()
    cfg = {**BASE, **CONFIGS[kind]}
    repo, snap, commit = hub_paths(hf_home, f"tiny-{kind}",
                                   [GENERATOR_VERSION, cfg, SPECIALS, CHAT_TEMPLATE])
    if not (snap / "config.json").exists():
        snap.mkdir(parents=True, exist_ok=True)
        cfg["vocab_size"] = tokenizer_files(snap)
        model_type = cfg.pop("model_type")
        config = AutoConfig.for_model(model_type, **cfg)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)  # config: bf16
        model.save_pretrained(snap, safe_serialization=True)
    files = finish(repo, snap, commit)
    return {"repo": f"spark-vllm/tiny-{kind}", "commit": commit, "files": files,
            "bytes": sum((snap / f).stat().st_size for f in files),
            "seconds": round(time.monotonic() - start, 2)}


def main(argv: list[str]) -> None:
    hf_home = Path(argv[0])
    for kind in argv[1:] or ["dense"]:
        try:  # one kind that cannot be made is an observation; the others are still made
            out = write_sized(hf_home, kind) if kind in SIZED else write(hf_home, kind)
        except Exception as err:  # noqa: BLE001
            out = {"repo": f"spark-vllm/{kind}", "error": f"{type(err).__name__}: {err}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
