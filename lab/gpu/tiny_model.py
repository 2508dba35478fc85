"""Tiny random models for real vLLM, in huggingface_hub's cache layout (NOT trained weights).

Runs where torch, transformers and tokenizers are (the GPU machine's image has them):
    python3 lab/gpu/tiny_model.py HF_HOME KIND [KIND ...]     KIND: dense | moe | hybrid
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


def tokenizer_files(out: Path) -> int:
    """Writes the tokenizer files into `out`; returns its vocabulary size, which the config
    takes (a model that can sample an id the tokenizer lacks breaks detokenization)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 64, special_tokens=SPECIALS,
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
                                 for i, t in enumerate(SPECIALS)},
    }, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return int(tok.get_vocab_size())


def write(hf_home: Path, kind: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    start = time.monotonic()
    cfg = {**BASE, **CONFIGS[kind]}
    commit = hashlib.sha1(json.dumps([GENERATOR_VERSION, cfg, SPECIALS, CHAT_TEMPLATE],
                                     sort_keys=True).encode()).hexdigest()
    repo = hf_home / "hub" / f"models--spark-vllm--tiny-{kind}"
    snap = repo / "snapshots" / commit
    if not (snap / "config.json").exists():
        snap.mkdir(parents=True, exist_ok=True)
        cfg["vocab_size"] = tokenizer_files(snap)
        model_type = cfg.pop("model_type")
        config = AutoConfig.for_model(model_type, **cfg)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)  # config: bf16
        model.save_pretrained(snap, safe_serialization=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    files = sorted(p.name for p in snap.iterdir())
    return {"repo": f"spark-vllm/tiny-{kind}", "commit": commit, "files": files,
            "bytes": sum((snap / f).stat().st_size for f in files),
            "seconds": round(time.monotonic() - start, 2)}


def main(argv: list[str]) -> None:
    hf_home = Path(argv[0])
    for kind in argv[1:] or ["dense"]:
        print(json.dumps(write(hf_home, kind)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
