"""The cases of the estimator section: every committed recording of real vLLM 0.26.0 that sized
a KV cache (or refused to start), read by the unit tests that hold spark-vllm's estimate to it,
and spark-vllm's own estimate of each, computed here.

One definition of each recording's inputs: the tests' own readers are imported, not copied
(tests/unit/test_memory_estimate.py: the tiny models of vllm-0.26.0.json;
test_memory_faults.py: vllm-0.26.0-qwen35.json; test_memory_real_scale.py:
vllm-0.26.0-real-scale.json). So the model (config.json + safetensors headers), the flags
(--max-model-len, --gpu-memory-utilization, --max-num-seqs, --max-num-batched-tokens,
--kv-cache-dtype), the GPU's total (CUDA's, what vLLM budgets from) and free memory, and vLLM's
logged "Available KV cache memory" / "GPU KV cache size" are the tests'. TP is 1 in all of them
(one H200). tests/fixtures/real-vllm/gpu-vllm-0.26.0-bench.json (one H100) is left out: no
test reads it for memory and its CUDA total was not recorded (nvidia-smi's only).
"""

from __future__ import annotations

import json
import re
from typing import Any

from spark_vllm.components import memory_estimate as me

GiB = me.GiB
# vLLM's own refusals, as 0.26.0 words them (the recordings' logs), and a short name for each
REFUSALS = (
    (r"exceeds available Mamba cache blocks", "max_num_seqs over the Mamba cache blocks"),
    (r"OutOfMemoryError|CUDA out of memory", "CUDA out of memory (CUDA-graph memory profile)"),
    (r"No available memory for the cache blocks", "no memory left for the KV cache"),
    (r"To serve at least one request with the model's max seq len", "one max_model_len "
                                                                    "request does not fit"),
    (r"less than desired GPU memory utilization", "free memory below utilization x total"),
)


def refusal(log: str) -> str:
    """vLLM's refusal named in a log, "" when it started."""
    return next((name for pattern, name in REFUSALS if re.search(pattern, log)), "")


def _tokens(log: str) -> int | None:
    found = re.search(r"GPU KV cache size: ([\d,]+) tokens", log)
    return int(found[1].replace(",", "")) if found else None


def weight_bytes(model: me.ModelFiles) -> int:
    """The checkpoint's tensor bytes, every safetensors file (what a repository's safetensors
    index calls total_size; the files' sizes less their headers)."""
    return sum(nbytes for _, _, nbytes in model.tensors.values())


def _case(source: str, r: dict[str, Any], model: me.ModelFiles, label: str, est: me.Estimate,
          total: int, free: int, held_out: bool, available_gib: float | None,
          tokens: int | None, log: str) -> dict[str, Any]:
    cause = refusal(log)
    return {
        "id": f"{source}:{r['id']}", "fixture": f"tests/fixtures/real-vllm/{source}.json",
        "model": label, "set": "held out" if held_out else "fitted",
        "config": model.config, "weight_bytes": weight_bytes(model),
        "max_position_embeddings": int(model.text.get("max_position_embeddings") or 0),
        "tp": 1, "utilization": r["utilization"], "max_model_len": r["max_model_len"],
        "max_num_seqs": r["max_num_seqs"], "max_num_batched_tokens":
            r.get("max_num_batched_tokens"), "kv_cache_dtype": r["kv_cache_dtype"],
        "total_bytes": total, "free_bytes": free,
        "vllm": {"available_gib": available_gib, "tokens": tokens,
                 "outcome": "refused" if cause else "started", "refusal": cause},
        "spark-vllm": ours(est, total, free, r["utilization"], r["max_model_len"]),
    }


def ours(est: me.Estimate, total: int, free: int, utilization: float,
         max_model_len: int | None) -> dict[str, Any]:
    """spark-vllm's estimate and admission, as memory_check runs them (with --max-model-len auto
    one short request must fit now, and the length it reports is the longest that fits)."""
    avail = me.available_kv(est, total, utilization)[0]
    f = me.fit(est, total, free, utilization, est.len_step if max_model_len is None else None)
    length = max_model_len or f.max_model_len
    tokens = me.tokens_for(est, avail, length) if avail > 0 and length else 0
    return {"available_bytes": avail, "tokens": tokens, "admits": f.ok,
            "raw": {"weights": est.weights[0], "activation": est.activation[0],
                    "non_torch": est.non_torch, "cudagraph": est.cudagraph[0],
                    "block_size": est.block_size, "page_bytes": est.page_bytes,
                    "max_model_len": length, "reason": f.reason}}


def _tiny() -> list[dict[str, Any]]:
    from tests.unit import test_memory_estimate as t

    runs = json.loads(t.FIXTURE.read_text())["runs"]

    def log(rid: str) -> str:
        run, name = rid.split(".", 1)
        return "\n".join(runs[run]["scenarios"][name]["log"])

    # held out: the memory part, recorded after the overheads were fitted on the others
    return [_case("vllm-0.26.0", r, t.model(t.tiny_config(r["kind"])), f"tiny-{r['kind']}",
                  t.recorded_estimate(r), t.H200_CUDA, t.H200_CUDA,
                  r["id"].startswith("memory."), r["available_gib"], r["tokens"], log(r["id"]))
            for r in t.RECORDINGS]


def _qwen35() -> list[dict[str, Any]]:
    from tests.unit import test_memory_faults as t

    return [_case("vllm-0.26.0-qwen35", r, t.MODELS[r["model"]], r["model"], t.estimate_of(r),
                  t.H200_CUDA, t.H200_CUDA, r["held_out"], r["available_gib"], r["tokens"],
                  r["log"])
            for r in t.RECORDINGS]


def _real_scale() -> list[dict[str, Any]]:
    from tests.unit import test_memory_real_scale as t

    return [_case("vllm-0.26.0-real-scale", r, t.model_of(r["kind"]), r["kind"],
                  t.estimate_of(r), t.TOTAL, t.FREE, False, r["available"], _tokens(r["log"]),
                  r["log"])
            for r in t.RECORDINGS]


def cases() -> list[dict[str, Any]]:
    return _tiny() + _qwen35() + _real_scale()


def peer_input(c: dict[str, Any]) -> dict[str, Any]:
    """What the peers are given: the model's config.json and checkpoint size, the GPU's total,
    and the flags each can express (bench/estimators_peer.py). No --max-num-seqs,
    --max-num-batched-tokens or free memory: neither estimator has an input for them. For
    --max-model-len auto, kvfit (which needs a context) gets max_position_embeddings, the
    length vLLM's auto fit tries first; sparkrun takes "auto" itself."""
    return {"id": c["id"], "config": c["config"], "weight_bytes": c["weight_bytes"],
            "total_bytes": c["total_bytes"], "tp": c["tp"], "utilization": c["utilization"],
            "max_model_len": c["max_model_len"], "kv_cache_dtype": c["kv_cache_dtype"],
            "context": c["max_model_len"] or c["max_position_embeddings"]}
