"""Memory admission (components/memory_estimate.py) against real vLLM 0.26.0 on one H200
(tests/fixtures/real-vllm/vllm-0.26.0.json: the "Available KV cache memory" and "GPU KV cache
size" lines each run logged), then unit tables of the TP/PP/KV rules.

The tiny models' weights are not in the repository (the GPU machine makes them with
transformers' save_pretrained): `header()` synthesizes their safetensors headers with the names
and shapes those transformers classes save (Qwen3, Qwen3-MoE with per-expert tensors, Qwen3-Next
with gated delta-net layers), from lab/gpu/tiny_model.py's configs."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from lab.gpu import tiny_model
from spark_vllm.components import memory_estimate as me

FIXTURE = Path(__file__).parents[1] / "fixtures" / "real-vllm" / "vllm-0.26.0.json"
H200 = 143771 << 20  # the fixture header's "NVIDIA H200, 143771 MiB" (nvidia-smi)
H200_CUDA = 150109880320  # CUDA's total of the same GPU (what vLLM budgets from; 615 MiB less)
GiB = me.GiB

# (run, scenario) -> model kind; the vLLM flags of scenarios that do not record their args are
# lab/gpu/runner.py's (load_part: serve_for_load; restart_part: serve_cache_kept; serve_part:
# serve_cold with --max-num-seqs 16)
RECORDED = {
    ("load", "serve_for_load"): ("dense", ["--max-model-len", "4096",
                                           "--gpu-memory-utilization", "0.5"]),
    ("restart", "serve_cache_kept"): ("dense", ["--max-model-len", "2048",
                                                "--gpu-memory-utilization", "0.5"]),
    ("restart", "kv_fp8_util03"): ("dense", None),
    ("load", "kv_moe_util05"): ("moe", None),
    ("load", "kv_hybrid_util05"): ("hybrid", None),
    **{(run, "serve_cold"): ("dense", ["--max-model-len", "2048", "--gpu-memory-utilization",
                                       "0.5", "--max-num-seqs", "16"])
       for run in ("serve", "serve-warm", "serve-wedge")},
    # held out: recorded after the overheads were fitted on the ones above (runner memory_part)
    ("memory", "kv_dense_util03_seqs256_batch2048"): ("dense", None),
    ("memory", "kv_moe_util03_fp8"): ("moe", None),
    ("memory", "kv_hybrid_util03_len4096"): ("hybrid", None),
}


def rope(c: dict[str, Any]) -> int:
    """The rotary cache the weights include (memory_estimate.rotary_cache_bytes)."""
    return me.rotary_cache_bytes(c)


def tiny_config(kind: str) -> dict[str, Any]:
    """lab/gpu/tiny_model.py's config; the vocabulary is the tokenizer trainer's target (the
    trained one may be smaller: only the embedding's few hundred KiB depend on it)."""
    return {**tiny_model.BASE, **tiny_model.CONFIGS[kind], "vocab_size": tiny_model.VOCAB - 64,
            "torch_dtype": "bfloat16"}


def tensor_shapes(c: dict[str, Any], prefix: str = "model.") -> dict[str, list[int]]:
    """What transformers' save_pretrained writes for Qwen3 / Qwen3-MoE / Qwen3-Next / Qwen3.5
    (MoE experts in their original per-expert form)."""
    hid, vocab, hd = c["hidden_size"], c["vocab_size"], c["head_dim"]
    nh, kv = c["num_attention_heads"], c["num_key_value_heads"]
    gated = c["model_type"] in ("qwen3_next", "qwen3_5_moe_text")  # q_proj also emits the gate
    t = {f"{prefix}embed_tokens.weight": [vocab, hid], f"{prefix}norm.weight": [hid]}
    if not c.get("tie_word_embeddings"):
        t["lm_head.weight"] = [vocab, hid]
    for i, kind in enumerate(me.layer_kinds(c)):
        p = f"{prefix}layers.{i}."
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = [hid]
        if kind == "attention":
            t[p + "self_attn.q_proj.weight"] = [nh * hd * (2 if gated else 1), hid]
            t[p + "self_attn.k_proj.weight"] = t[p + "self_attn.v_proj.weight"] = [kv * hd, hid]
            t[p + "self_attn.o_proj.weight"] = [hid, nh * hd]
            t[p + "self_attn.q_norm.weight"] = t[p + "self_attn.k_norm.weight"] = [hd]
        else:
            nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            a = p + "linear_attn."
            t[a + "in_proj_qkvz.weight"] = [2 * nk * dk + 2 * nv * dv, hid]
            t[a + "in_proj_ba.weight"] = [2 * nv, hid]
            t[a + "conv1d.weight"] = [2 * nk * dk + nv * dv, 1, c["linear_conv_kernel_dim"]]
            t[a + "dt_bias"] = t[a + "A_log"] = [nv]
            t[a + "norm.weight"] = [dv]
            t[a + "out_proj.weight"] = [hid, nv * dv]
        if c.get("num_experts"):
            mi = c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = [c["num_experts"], hid]
            for e in range(c["num_experts"]):
                t[p + f"mlp.experts.{e}.gate_proj.weight"] = [mi, hid]
                t[p + f"mlp.experts.{e}.up_proj.weight"] = [mi, hid]
                t[p + f"mlp.experts.{e}.down_proj.weight"] = [hid, mi]
            if si := c.get("shared_expert_intermediate_size"):
                t[p + "mlp.shared_expert.gate_proj.weight"] = [si, hid]
                t[p + "mlp.shared_expert.up_proj.weight"] = [si, hid]
                t[p + "mlp.shared_expert.down_proj.weight"] = [hid, si]
                t[p + "mlp.shared_expert_gate.weight"] = [1, hid]
        else:
            im = c["intermediate_size"]
            t[p + "mlp.gate_proj.weight"] = t[p + "mlp.up_proj.weight"] = [im, hid]
            t[p + "mlp.down_proj.weight"] = [hid, im]
    return t


def header(shapes: dict[str, list[int]], fp8: bool = False) -> dict[str, Any]:
    """A safetensors header: BF16, or FP8 (e4m3, 128x128 blocks with float32 weight_scale_inv)
    for every 2-D projection as Qwen's FP8 checkpoints are (embedding, lm_head, router, norms
    kept in BF16)."""
    out: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0

    def put(name: str, dtype: str, shape: list[int]) -> None:
        nonlocal offset
        n = math.prod(shape) * me.DTYPE_BYTES[dtype]
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n

    for name, shape in shapes.items():
        quantized = (fp8 and len(shape) == 2 and "_proj" in name and "embed" not in name
                     and "lm_head" not in name)
        put(name, "F8_E4M3" if quantized else "BF16", shape)
        if quantized:
            put(name + "_scale_inv", "F32", [math.ceil(d / 128) for d in shape])
    return out


def model(c: dict[str, Any], fp8: bool = False, prefix: str = "model.") -> me.ModelFiles:
    return me.read_model({"config.json": c,
                          "model.safetensors": header(tensor_shapes(c, prefix), fp8)})


def logged(pattern: str, log: str) -> str:
    found = re.search(pattern, log)
    assert found, pattern
    return found[1]


def recorded() -> list[dict[str, Any]]:
    runs = json.loads(FIXTURE.read_text())["runs"]
    out = []
    for (run, name), (kind, args) in RECORDED.items():
        scenario = runs[run]["scenarios"][name]
        log = "\n".join(scenario["log"])
        flags = args or scenario["args"]
        opts = dict(zip(flags[::2], flags[1::2], strict=True))
        out.append({
            "id": f"{run}.{name}", "kind": kind,
            "max_model_len": int(opts["--max-model-len"]),
            "utilization": float(opts["--gpu-memory-utilization"]),
            "kv_cache_dtype": opts.get("--kv-cache-dtype", "auto"),
            "max_num_seqs": int(opts["--max-num-seqs"]) if "--max-num-seqs" in opts else None,
            "max_num_batched_tokens": (int(opts["--max-num-batched-tokens"])
                                       if "--max-num-batched-tokens" in opts else None),
            "available_gib": float(logged(r"Available KV cache memory: ([\d.]+) GiB", log)),
            "tokens": int(logged(r"GPU KV cache size: ([\d,]+) tokens", log).replace(",", "")),
            "loading_gib": float(logged(r"Model loading took ([\d.]+) GiB", log)),
        })
    return out


RECORDINGS = recorded()


def recorded_estimate(r: dict[str, Any]) -> me.Estimate:
    return me.estimate(model(tiny_config(r["kind"])), max_model_len=r["max_model_len"],
                       kv_cache_dtype=r["kv_cache_dtype"], max_num_seqs=r["max_num_seqs"],
                       max_num_batched_tokens=r["max_num_batched_tokens"])


# ---------------------------------------------------------------------------- the recordings


def test_every_recording_is_read() -> None:
    assert len(RECORDINGS) == 11
    assert {r["kind"] for r in RECORDINGS} == {"dense", "moe", "hybrid"}
    assert all(r["tokens"] > 10**7 and r["available_gib"] > 40 for r in RECORDINGS)


@pytest.mark.parametrize("r", RECORDINGS, ids=lambda r: r["id"])
def test_kv_math_reproduces_the_token_count(r: dict[str, Any]) -> None:
    """(a) the logged available memory in, vLLM's token count out; and exactly: the logged
    count lies between the counts of the two ends of the log's 0.01 GiB rounding window."""
    est = recorded_estimate(r)
    tokens = me.tokens_for(est, int(r["available_gib"] * GiB))
    assert abs(tokens - r["tokens"]) <= 0.01 * r["tokens"]
    low = me.tokens_for(est, int((r["available_gib"] - 0.005) * GiB))
    high = me.tokens_for(est, int((r["available_gib"] + 0.005) * GiB))
    assert low <= r["tokens"] <= high


@pytest.mark.parametrize("r", RECORDINGS, ids=lambda r: r["id"])
def test_end_to_end_available_and_tokens(r: dict[str, Any]) -> None:
    """(b) the estimator's own budget from utilization x CUDA's total (the fitting set of the
    NON_TORCH constants)."""
    est = recorded_estimate(r)
    available = me.available_kv(est, H200_CUDA, r["utilization"])[0]
    assert abs(available / GiB - r["available_gib"]) <= 0.05 * r["available_gib"]
    tokens = me.tokens_for(est, available)
    assert abs(tokens - r["tokens"]) <= 0.05 * r["tokens"]
    # the weights are tiny here, as "Model loading took" says
    assert abs(est.weights[0] / GiB - r["loading_gib"]) < 0.035


def test_hybrid_page_padding_explains_the_tokens() -> None:
    """Qwen3-Next: the 3 delta-net states (35840 B each) set the attention block to 80 tokens
    (page 40960 B, the states padded to it); a 2048 request holds cdiv(2048, 80) = 26 attention
    blocks + 1 block per linear group, so tokens = blocks / 29 x 2048, not bytes / 512."""
    est = me.estimate(model(tiny_config("hybrid")), max_model_len=2048)
    assert (est.attn_token_bytes, est.linear_state_bytes) == (2 * 2 * 64 * 2, 35840)
    assert (est.block_size, est.page_bytes) == (80, 80 * 512)
    assert [kind for kind, _ in est.groups] == ["linear"] * 3 + ["attention"]
    assert est.blocks_per_request() == 26 + 3
    r = next(r for r in RECORDINGS if r["kind"] == "hybrid")
    naive = int(r["available_gib"] * GiB) // est.kv_bytes_per_token()
    assert naive > 1.1 * r["tokens"]  # the naive count is more than 10 % off
    assert me.kv_needed(est) == est.page_bytes * 29


# ---------------------------------------------------------------------------- unit tables


def dense(kv_heads: int = 2, layers: int = 4, tie: bool = False) -> dict[str, Any]:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1000,
            "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": layers,
            "num_attention_heads": 8, "num_key_value_heads": kv_heads, "head_dim": 64,
            "max_position_embeddings": 32768, "tie_word_embeddings": tie}


def test_dense_tp_split_and_kv_heads_replicated_at_tp4() -> None:
    c = dense()
    m = model(c)
    b, hid, hd, inter = 2, 512, 64, 1024
    vocab_rows = 1024  # 1000 padded to a multiple of 64, then divided by TP
    for tp, kv_rank in ((1, 2), (2, 1), (4, 1)):
        per_layer = (8 * hd * hid // tp  # q_proj
                     + 2 * kv_rank * hd * hid  # k_proj, v_proj: whole heads, at least one
                     + hid * 8 * hd // tp  # o_proj
                     + 3 * inter * hid // tp  # gate, up, down
                     + 2 * hid + 2 * hd)  # norms, replicated
        expected = b * (2 * vocab_rows * hid // tp + hid + 4 * per_layer) + rope(c)
        est = me.estimate(m, tp=tp, max_model_len=4096)
        assert est.weights == (expected,)
        assert me.weights_per_rank(est) == [expected] * tp
        assert est.kv_bytes_per_token() == 4 * 2 * kv_rank * hd * b
    tp1, tp2, tp4 = (me.estimate(m, tp=t).kv_bytes_per_token() for t in (1, 2, 4))
    assert tp2 == tp1 // 2 and tp4 == tp2  # 2 kv heads: replicated beyond TP 2


def test_moe_experts_split_router_replicated() -> None:
    c = tiny_config("moe")
    m = model(c)
    hid, mi, experts = 256, 128, 8
    w1, w2 = (me.estimate(m, tp=t).weights[0] - rope(c) for t in (1, 2))
    router = 2 * experts * hid * 2  # 2 layers, [8, 256] bf16, on every rank
    norms = (2 * (2 * hid + 2 * 64) + hid) * 2
    assert w2 == (w1 - router - norms) // 2 + router + norms  # all the rest halves at TP 2
    expert_bytes = experts * 3 * mi * hid * 2
    only_router = me.read_model({"config.json": c, "r.safetensors": header(
        {"model.layers.0.mlp.gate.weight": [experts, hid]})})
    only_experts = me.read_model({"config.json": c, "e.safetensors": header(
        {f"model.layers.0.mlp.experts.{e}.{p}.weight": [mi, hid]
         for e in range(experts) for p in ("gate_proj", "up_proj", "down_proj")})})
    assert me.weights_per_stage(only_router, tp=2) == [experts * hid * 2 + rope(c)]
    assert me.weights_per_stage(only_experts, tp=2) == [expert_bytes // 2 + rope(c)]


def test_replicated_norms() -> None:
    shapes = {"model.layers.0.input_layernorm.weight": [4096],
              "model.layers.0.self_attn.q_norm.weight": [128], "model.norm.weight": [4096]}
    m = me.read_model({"config.json": dense(layers=1), "n.safetensors": header(shapes)})
    assert {t: me.weights_per_stage(m, tp=t)[0] for t in (1, 2, 8)} == {
        t: (4096 + 128 + 4096) * 2 + rope(dense(layers=1)) for t in (1, 2, 8)}


def test_hybrid_kv_only_in_full_attention_layers() -> None:
    c = {**tiny_config("hybrid"), "num_hidden_layers": 8, "layer_types": None}
    kinds = me.layer_kinds(c)
    assert kinds == (["linear"] * 3 + ["attention"]) * 2  # 1 in full_attention_interval 4
    est = me.estimate(model(c), max_model_len=2048)
    assert est.kv_bytes_per_token() == 2 * (2 * 2 * 64 * 2)  # 2 full-attention layers
    assert [(kind, layers) for kind, layers in est.groups] == [
        ("linear", (0, 4)), ("linear", (1, 5)), ("linear", (2, 6)), ("attention", (3, 7))]
    # one request: 2 layers a group x (26 attention blocks + a padded state per linear group)
    assert me.kv_needed(est, 2048) == 2 * est.page_bytes * (26 + 3)
    assert me.kv_needed(est, 2048) - me.kv_needed(est, 1024) == 2 * est.page_bytes * (26 - 13)


def test_pp_split_embedding_first_lm_head_last() -> None:
    assert me.pp_layer_ranges(5, 2) == [(0, 3), (3, 5)]
    assert me.pp_layer_ranges(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]  # middle stages
    m = model(dense(layers=4))
    r = rope(dense())  # the rotary cache: on every stage with attention layers
    one = me.estimate(m).weights[0] - r
    est = me.estimate(m, pp=2)
    embed = lm_head = 1024 * 512 * 2
    norm = 512 * 2
    layer = (one - embed - lm_head - norm) // 4
    assert est.weights == (embed + 2 * layer + r, 2 * layer + norm + lm_head + r)
    assert sum(est.weights) == one + 2 * r
    assert me.weights_per_rank(me.estimate(m, tp=2, pp=2)) == [
        *[me.estimate(m, tp=2, pp=2).weights[0]] * 2, *[me.estimate(m, tp=2, pp=2).weights[1]] * 2]
    assert est.kv_bytes_per_token(0) == est.kv_bytes_per_token(1) == 2 * 2 * 2 * 64 * 2
    # tied (Qwen2-style model code): the last stage keeps its own copy of the embedding
    tied = me.estimate(model(dense(layers=4, tie=True)), pp=2)
    assert tied.weights == (embed + 2 * layer + r, 2 * layer + norm + embed + r)
    # Qwen3-MoE's vLLM class builds embed_tokens and lm_head on every stage
    moe = model(tiny_config("moe"))
    moe_pp = me.estimate(moe, pp=2).weights
    vocab = 1984 * 256 * 2
    assert sum(moe_pp) == me.estimate(moe).weights[0] + 2 * vocab + rope(moe.text)


def test_fp8_kv_halves_kv_bytes() -> None:
    m = model(dense())
    auto, fp8 = me.estimate(m, max_model_len=8192), me.estimate(m, max_model_len=8192,
                                                                kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token() * 2 == auto.kv_bytes_per_token()
    assert me.kv_needed(fp8) * 2 == me.kv_needed(auto)
    assert me.tokens_for(fp8, 10 * GiB) == 2 * me.tokens_for(auto, 10 * GiB)
    per_head = me.estimate(m, kv_cache_dtype="fp8_per_token_head")
    assert per_head.kv_bytes_per_token() == fp8.kv_bytes_per_token() + 4 * 2 * 8
    with pytest.raises(ValueError, match="nvfp4"):
        me.estimate(m, kv_cache_dtype="nvfp4")


def qwen35_like() -> dict[str, Any]:
    """Qwen3.5-122B-A10B's shape: hybrid MoE, 48 layers, 1 in 4 full attention, 2 kv heads of
    256, a multimodal config with the language model in text_config."""
    text = {"model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 3072,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 2,
            "head_dim": 256, "full_attention_interval": 4, "linear_num_key_heads": 16,
            "linear_num_value_heads": 64, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 256,
            "num_experts_per_tok": 8, "moe_intermediate_size": 1024,
            "shared_expert_intermediate_size": 1024, "max_position_embeddings": 262144,
            "tie_word_embeddings": False, "dtype": "bfloat16"}
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "text_config": text, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def qwen35() -> me.ModelFiles:
    c = qwen35_like()
    shapes = tensor_shapes(c["text_config"], prefix="model.language_model.")
    files = {"config.json": c, "model.safetensors": header(shapes, fp8=True),
             "mtp.safetensors": header({"mtp.fc.weight": [3072, 6144]})}  # not loaded
    return me.read_model(files)


def test_qwen35_like_at_tp2(qwen35: me.ModelFiles) -> None:
    total = sum(nbytes for name, (_, _, nbytes) in qwen35.tensors.items()
                if not name.startswith("mtp."))
    assert 115e9 < total < 130e9  # FP8: about 120 GB
    one, two = me.estimate(qwen35).weights[0], me.estimate(qwen35, tp=2).weights[0]
    assert one == total + rope(qwen35.text)
    assert 0.5 < two / one < 0.51  # half, plus what every rank keeps whole (norms, routers)
    est = me.estimate(qwen35, tp=2, max_model_len=262144)
    kinds = me.layer_kinds(qwen35.text)
    assert kinds.count("attention") == 12 and kinds[3] == "attention"
    # 12 full-attention layers x K and V x max(1, 2 // 2) head x 256 x 2 bytes
    assert est.kv_bytes_per_token() == 12 * 2 * 1 * 256 * 2
    # delta-net state: conv (2x16x128 + 64x128) / 2 x 3 + 64 / 2 heads x 128 x 128, bf16
    assert est.linear_state_bytes == (6144 * 3 + 32 * 128 * 128) * 2
    assert est.block_size == 16 * math.ceil(est.linear_state_bytes / (16 * 1024)) == 1072
    assert [len(layers) for _, layers in est.groups] == [12] * 4
    assert me.kv_needed(est) == 12 * est.page_bytes * (math.ceil(262144 / 1072) + 3)
    f = me.fit(est, H200, H200 - 2 * GiB, 0.9)
    assert f.ok and f.reason == ""
    assert f.weights == two and f.kv_needed == me.kv_needed(est)
    assert f.left == f.kv_available - f.kv_needed > 50 * GiB
    assert f.max_model_len == 262144  # capped at max_position_embeddings
    # pipeline parallel: each stage holds half the layers, so half a group
    assert me.estimate(qwen35, pp=2).group_size(1) == 6


def test_cannot_fit_says_why(qwen35: me.ModelFiles) -> None:
    est = me.estimate(qwen35, max_model_len=262144)  # TP 1: 115 GiB of weights on one H200
    tight = me.fit(est, H200, H200, 0.8)
    assert not tight.ok and tight.kv_available <= 0 and tight.max_model_len == 0
    assert tight.reason.startswith("No available memory for the cache blocks: weights 115.34 GiB")
    busy = me.fit(me.estimate(model(dense())), H200, 60 * GiB, 0.5)
    assert not busy.ok and busy.max_model_len == 0
    assert busy.reason == (
        "Free memory on device (60.0/140.4 GiB) on startup is less than desired GPU memory "
        "utilization (0.5, 70.2 GiB). Decrease GPU memory utilization or reduce GPU memory "
        "used by other processes.")
    at_tp2 = me.fit(me.estimate(qwen35, tp=2, max_model_len=262144), H200, H200, 0.8)
    assert at_tp2.ok  # what TP 2 is for
    small = me.estimate(model({**dense(), "max_position_embeddings": 1 << 22}),
                        max_model_len=1 << 21)  # 2048 B a token: 4 GiB for one request
    long = me.fit(small, H200, H200, 0.01)
    assert not long.ok and 0 < long.kv_available < long.kv_needed == 4 * GiB
    assert 0 < long.max_model_len < 1 << 21 and long.max_model_len % 16 == 0
    assert long.reason.startswith("To serve at least one request with the model's max seq len "
                                  "(2097152), (4.0 GiB KV cache is needed, which is larger than "
                                  "the available KV cache memory (0.")
    assert f"estimated maximum model length is {long.max_model_len}." in long.reason
    shorter = me.fit(small, H200, H200, 0.01, max_model_len=long.max_model_len)
    page = 16 * 2048  # the null block vLLM keeps back is left over (issue 36)
    assert shorter.ok and page <= shorter.left < 2 * page
    assert not me.fit(small, H200, H200, 0.01, long.max_model_len + 32).ok


def test_longest_fit_is_monotone_in_free_memory() -> None:
    est = me.estimate(model(tiny_config("hybrid")), max_model_len=4096)
    est = dataclasses.replace(est, max_len_cap=1 << 40)  # no position limit
    lengths = [me.fit(est, H200, free * GiB, 0.3).max_model_len for free in range(0, 141, 5)]
    assert lengths == sorted(lengths)
    assert lengths[0] == 0 and lengths[-1] > 10**7 and lengths[-1] % 16 == 0
    by_util = [me.fit(est, H200, H200, u / 100).max_model_len for u in range(1, 100, 7)]
    assert by_util == sorted(by_util) and by_util[0] < by_util[-1]


def test_kv_groups_rule() -> None:
    assert me.kv_groups(["attention"] * 5) == [("attention", (0, 1, 2, 3, 4))]
    a, lin = "attention", "linear"
    # 3 full, 4 linear: 4 < 1.5 x 3, so groups of 4 (the full group padded by one)
    assert me.kv_groups([a, lin, a, lin, a, lin, lin]) == [(a, (0, 2, 4)), (lin, (1, 3, 5, 6))]
    # 2 full, 3 linear: 3 is not < 1.5 x 2, so groups of 2, the linear layers split [i::2]
    assert me.kv_groups([a, lin, a, lin, lin]) == [(a, (0, 2)), (lin, (1, 4)), (lin, (3,))]
    est = me.estimate(me.read_model({"config.json": {
        **tiny_config("hybrid"), "num_hidden_layers": 5, "layer_types": [
            "full_attention", "linear_attention", "full_attention", "linear_attention",
            "linear_attention"]}, "m.safetensors": {}}), max_model_len=800)
    assert est.group_size(0) == 2
    assert me.kv_needed(est) == 2 * est.page_bytes * (800 // 80 + 2)


def test_read_model_from_a_snapshot_reads_headers_only(tmp_path: Path) -> None:
    c = tiny_config("dense")
    h = header(tensor_shapes(c))
    (tmp_path / "config.json").write_text(json.dumps(c))
    raw = json.dumps(h).encode()
    # the header and no data at all: the reader never looks past the header
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (tmp_path / "tokenizer.json").write_text("{}")
    from_dir = me.read_model(str(tmp_path))
    assert from_dir == me.read_model({"config.json": c, "model.safetensors": h})
    assert from_dir.tensors["lm_head.weight"] == ("BF16", (1984, 256), 1984 * 256 * 2)
    assert "__metadata__" not in from_dir.tensors
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(ValueError, match="not a safetensors file"):
        me.read_model(str(tmp_path))
    # with an index, only the files it names count (a stray copy is not loaded by vLLM)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: "model.safetensors" for name in h if name != "__metadata__"}}))
    assert me.read_model(str(tmp_path)) == from_dir


def test_table() -> None:
    est = me.estimate(model(dense()), max_model_len=4096)
    rows = [("node-1", me.fit(est, H200, H200, 0.5)),
            ("node-22", me.fit(est, H200, 10 * GiB, 0.5))]
    lines = me.table(rows)
    assert [line.split(" | ")[0].strip() for line in lines] == ["node", "node-1", "node-22"]
    assert lines[0].split(" | ")[1:] == ["  free", "weights", "KV needed", " left"]
    assert lines[2].split(" | ")[1].strip() == "10.00"
    assert lines[1].split(" | ")[3].strip() == f"{me.kv_needed(est) / GiB:.2f}"
    assert len({len(line) for line in lines}) == 1
