"""What vLLM 0.26.0's memory profile measures besides the weights and the KV cache: the profile
run's peak activation, the memory outside torch, the CUDA-graph estimate it subtracts, and the
temporary KV cache its CUDA-graph profile allocates (the second part of the memory admission;
memory_model.py reads the model, memory_estimate.py does the KV arithmetic and the verdict).

vllm/v1/worker/gpu_worker.py determine_available_memory:
    available = requested - (weights + peak activation + non-torch) - CUDA-graph estimate
with the peak taken over profile_run (gpu_model_runner.py: the multimodal encoder on its
largest input, a forward of max_num_batched_tokens tokens, the dummy sampler) and the
CUDA-graph estimate measured by profile_cudagraph_memory (V1 model runner only).

Computed from vLLM's source: the capture sizes and graph counts (vllm/config/vllm.py), the
fused-MoE workspace (fused_moe/experts/triton_moe.py workspace_shapes, kept by
v1/worker/workspace.py for the life of the worker), the encoder budget (multimodal/
encoder_budget.py), the profile's temporary KV cache (gpu_model_runner.py
profile_cudagraph_memory: min(max_num_seqs, largest capture size) blocks on every KV slot).
Measured, not derivable from the source (`MEASURED` below, real vLLM 0.26.0 on one H200:
tests/fixtures/real-vllm/vllm-0.26.0-real-scale.json and the earlier recordings): the bytes
per logit of the sampler, the vision tower's profile peak, the non-torch memory, the load's
transient, and the CUDA-graph memory per captured layer and token. Each is set at or above
every recording (never optimistic): docs/memory.md has the table.

Pure, standard library only: memory_check.py runs it on the head with a bare python3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .memory_model import MODEL_DTYPE_BYTES, GiB, ModelFiles, config_value

# vllm/engine/arg_utils.py get_batch_defaults: GPUs of >= 70 GiB (H100/H200), `vllm serve`
DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS = 8192, 1024
MAX_CAPTURE_SIZE = 512  # vllm/config/vllm.py: max_cudagraph_capture_size's cap
# Qwen3-VL's image processor default (Qwen2VLImageProcessor size.longest_edge, in pixels),
# used when the snapshot has no preprocessor_config.json
DEFAULT_LONGEST_EDGE = 16777216

# measured (see the module's docstring), each rounded towards refusing:
# - the dummy sampler, per logit of its [min(max_num_seqs, tokens), vocab] rows: the V1 runner
#   samples with top-k and top-p (float32 logits, their sorted copy, the probabilities, the
#   exponential noise: 4 x 4 B); 15.5 B measured at real scale once the MoE workspace alive
#   beside it is counted. The V2 runner (dense models) skips top-k/top-p: its float32 logits.
SAMPLER_BYTES_V1, SAMPLER_BYTES_V2 = 15.5, 4
# - the vision tower's profile (one image of the largest size, patches = its tokens x
#   merge^2): at a ViT block's widest point, 2 MLP-wide (fc1's output, its activation) and
#   2.5 hidden-wide bf16 tensors a patch; 1.36 and 1.40 GiB measured for Qwen3.5's tower
#   (65536 patches) on two models, this gives 1.40
VISION_MLP_TENSORS, VISION_HIDDEN_TENSORS = 2, 2.5
# - memory outside torch vLLM's profile sees grow (CUDA modules, cuBLAS/NCCL workspaces):
#   0.22-0.27 GiB at real scale, the V1 runner's the larger
NON_TORCH_V1, NON_TORCH_V2 = int(0.275 * GiB), int(0.25 * GiB)
# - "Model loading took" exceeds the weights' bytes by up to 0.04 GiB on the seeds' class
#   (a transient of the load: 116.23 against 116.19 GiB for the 122B's dimensions)
LOAD_TRANSIENT = int(0.045 * GiB)
# - the model runner's own persistent buffers beside the workspace during the CUDA-graph
#   profile (0.2 GiB in the one out-of-memory recording: 137.65 GiB allocated, of which
#   116.23 weights, 10 temporary-KV slots of 2.05 and the 0.75 GiB MoE workspace)
RUNNER_BUFFERS = int(0.25 * GiB)
# - the CUDA-graph estimate (V1 only): a fixed part, bytes per token of the largest capture
#   size per hidden unit, and per token of each split op's output (piecewise graphs keep
#   every attention and gated delta-net layer's output at their boundaries: heads x head_dim
#   and value heads x value dim wide on the rank); fitted on the 11 recordings that print
#   vLLM's estimate (residuals -0.03 ... +0.05 GiB), the fixed part then raised by 0.03 so that
#   none is under
CUDAGRAPH_BASE = int(0.143 * GiB)
CUDAGRAPH_PER_TOKEN_HIDDEN = 230.4  # bytes
CUDAGRAPH_PER_TOKEN_ATTENTION = 3.27  # bytes, per attention layer and unit of its output
CUDAGRAPH_PER_TOKEN_GDN = 5.46  # bytes, per gated delta-net layer and unit of its output


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[list[int], list[int]]:
    """(PIECEWISE sizes, FULL decode sizes) of vLLM's default FULL_AND_PIECEWISE mode:
    vllm/config/vllm.py _set_cudagraph_sizes (max size min(2 x max_num_seqs, 512, tokens);
    1, 2, 4, then every 8 up to 256, then every 16) and v1/cudagraph_dispatcher.py (FULL decode
    graphs up to max_num_seqs)."""
    top = min(2 * max_num_seqs, MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = {s for s in (1, 2, 4) if s <= top}
    sizes |= set(range(8, min(top + 1, 256), 8)) | set(range(256, top + 1, 16))
    if max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    pw = sorted(sizes)
    return pw, [s for s in pw if s <= max_num_seqs]


def _mlp_width(text: Mapping[str, Any], tp: int) -> int:
    """Per token on one rank: the routed experts' and shared expert's intermediates, or the
    dense MLP's."""
    if config_value(text, "num_experts"):
        return (int(text.get("num_experts_per_tok", 1)) * int(text["moe_intermediate_size"])
                + int(text.get("shared_expert_intermediate_size") or 0)) // tp
    return int(text["intermediate_size"]) // tp


def moe_workspace(text: Mapping[str, Any], tp: int, tokens: int) -> int:
    """The fused-MoE workspace of the profile's forward, kept for the worker's life: workspace13
    (M, topk, max(N/2, K)) and workspace2 (M, topk, max(N, K)) in the model dtype, N the
    gate_up width on the rank (fused_moe/experts/triton_moe.py workspace_shapes,
    modular_kernel.py _allocate_buffers)."""
    if not config_value(text, "num_experts"):
        return 0
    hidden, topk = int(text["hidden_size"]), int(text.get("num_experts_per_tok", 1))
    n = 2 * int(text["moe_intermediate_size"]) // tp
    return tokens * topk * (max(n // 2, hidden) + max(n, hidden)) * MODEL_DTYPE_BYTES


def vision_profile(model: ModelFiles, tokens: int) -> tuple[int, int]:
    """(peak of the encoder's profile, the encoder outputs kept to the end of profile_run):
    one image of the largest size when max_num_batched_tokens is under its tokens
    (multimodal/encoder_budget.py: budget max(tokens, per item), items budget // per item),
    its tokens longest_edge / (patch x merge)^2 (models/qwen2_vl.py)."""
    vision = model.config.get("vision_config")
    if not vision or "text_config" not in model.config:
        return 0, 0
    size = model.processor.get("size") or {}
    edge = int(size.get("longest_edge") or DEFAULT_LONGEST_EDGE)
    merge = int(vision.get("spatial_merge_size", 2))
    per_item = edge // (int(vision.get("patch_size", 16)) * merge) ** 2
    items = max(1, max(tokens, per_item) // per_item)
    patches = items * per_item * merge * merge
    peak = int(patches * MODEL_DTYPE_BYTES * (
        VISION_MLP_TENSORS * int(vision["intermediate_size"])
        + VISION_HIDDEN_TENSORS * int(vision["hidden_size"])))
    kept = items * per_item * int(vision.get("out_hidden_size") or model.text["hidden_size"])
    return peak, kept * MODEL_DTYPE_BYTES


def activation(model: ModelFiles, tp: int, first: bool, last: bool, tokens: int, seqs: int,
               v1: bool, language_only: bool = False) -> int:
    """The profile run's torch peak on one rank of a stage: the larger of
    - the forward of `tokens` tokens with attention skipped (4 hidden-wide and 4 MLP-wide
      tensors on the V1 runner; the V2 runner's dense forward 6 and 3), on the first stage
      beside the encoder profile's peak and outputs (a multimodal model unless
      --language-model-only), the MoE workspace inside it;
    - on the last stage, the dummy sampler over min(seqs, tokens) rows of the vocabulary
      (SAMPLER_BYTES_*), beside the hidden states, the encoder outputs and the MoE workspace,
      all still alive."""
    text = model.text
    hidden = int(text["hidden_size"])
    mlp = _mlp_width(text, tp)
    workspace = moe_workspace(text, tp, tokens)
    peak_vision, kept = (0, 0) if language_only or not first else vision_profile(model, tokens)
    if v1:
        forward = tokens * MODEL_DTYPE_BYTES * (4 * hidden + 4 * mlp)
    else:
        forward = tokens * MODEL_DTYPE_BYTES * (6 * hidden + 3 * mlp)
    out = max(forward, workspace) + peak_vision + kept
    if last:
        rows = min(seqs, tokens)
        sampler = math.ceil(rows * int(text["vocab_size"])
                            * (SAMPLER_BYTES_V1 if v1 else SAMPLER_BYTES_V2))
        out = max(out, tokens * MODEL_DTYPE_BYTES * hidden + kept + workspace + sampler)
    return out


def cudagraph_estimate(text: Mapping[str, Any], tp: int, attention_layers: int,
                       gdn_layers: int, seqs: int, tokens: int, v1: bool, eager: bool) -> int:
    """vLLM's "Estimated CUDA graph memory" on a rank whose stage holds that many layers: 0 on
    the V2 runner (v1/worker/gpu/model_runner.py profile_cudagraph_memory) and with
    --enforce-eager; else a function of the largest capture size (capture_sizes), the hidden
    size and the split ops' outputs (MEASURED)."""
    if not v1 or eager:
        return 0
    largest = max(capture_sizes(seqs, tokens)[0])
    heads = int(text["num_attention_heads"])
    attention = heads * int(text.get("head_dim") or int(text["hidden_size"]) // heads) // tp
    gdn = (int(text.get("linear_num_value_heads") or 0)
           * int(text.get("linear_value_head_dim") or 0) // tp)
    return int(CUDAGRAPH_BASE + largest * (
        CUDAGRAPH_PER_TOKEN_HIDDEN * int(text["hidden_size"])
        + CUDAGRAPH_PER_TOKEN_ATTENTION * attention * attention_layers
        + CUDAGRAPH_PER_TOKEN_GDN * gdn * gdn_layers))


def profile_kv_blocks(seqs: int, tokens: int) -> int:
    """Blocks of the temporary KV cache vLLM's CUDA-graph profile allocates on every KV slot
    before any graph (gpu_model_runner.py: min(max_num_seqs, max capture size))."""
    return max(1, min(seqs, max(capture_sizes(seqs, tokens)[0])))
