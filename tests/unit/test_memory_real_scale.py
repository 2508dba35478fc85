"""Issue 45: the memory admission at real scale, against real vLLM 0.26.0 on one H200
(tests/fixtures/real-vllm/vllm-0.26.0-real-scale.json, made by lab/gpu/real_scale.py in four
device calls): real-dimension models of the seeds' class (Qwen3.5-122B-A10B-FP8 whole, its first
24 layers, Qwen3.5-35B-A3B-FP8), a dense model (Qwen3-32B, bf16) and a plain MoE one
(Qwen3-30B-A3B-FP8), 29 to 116 GiB of weights, loaded with `--load-format dummy` from sparse
shards whose headers are the checkpoints' (lab/gpu/real_scale_models.py rebuilds them here).

The goal: the estimate's available KV within -1 % ... +0.25 % of vLLM's "Available KV cache
memory" (never more than 0.25 % above: the admission must not promise what vLLM does not
give), every configuration vLLM started admitted, every one it refused refused with its cause.
Before this issue the estimate was +10 to +23 % above vLLM's on the 122B with few sequences.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from lab.gpu import real_scale, real_scale_models
from spark_vllm.components import memory_estimate as me
from spark_vllm.components import memory_profile as profile

GiB = me.GiB
FIXTURE = Path(__file__).parents[1] / "fixtures" / "real-vllm" / "vllm-0.26.0-real-scale.json"
DATA = json.loads(FIXTURE.read_text())
TOTAL = DATA["header"]["gpu"]["torch"]["total"]  # cudaMemGetInfo, what vLLM budgets from
FREE = DATA["header"]["gpu"]["torch"]["free"]  # "Free memory on device (139.29/139.8 GiB)"
LOW, HIGH = -0.01, 0.0025  # the goal, as fractions of vLLM's available KV


@functools.cache
def model_of(kind: str) -> me.ModelFiles:
    cfg, shards = real_scale_models.headers(kind)
    files: dict[str, Any] = {"config.json": cfg, **shards}
    if "text_config" in cfg:  # tiny_model.multimodal_files wrote Qwen3-VL's processor sizes
        files["preprocessor_config.json"] = {"size": {"longest_edge": 16777216}}
    return me.read_model(files)


def logged(pattern: str, log: str) -> float | None:
    found = re.search(pattern, log)
    return float(found[1].replace(",", "")) if found else None


def recordings() -> list[dict[str, Any]]:
    out = []
    for name, s in DATA["scenarios"].items():
        log = "\n".join(s["log"] + s["tail"])
        args = s["args"]
        opts = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
        split = re.search(r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak "
                          r"activation, ([\d.]+) GiB for non-torch memory", log)
        out.append({
            "id": name, "kind": s["kind"], "outcome": s["outcome"], "log": log,
            "utilization": float(opts["--gpu-memory-utilization"]),
            "max_model_len": (None if opts["--max-model-len"] == "auto"
                              else int(opts["--max-model-len"])),
            "max_num_seqs": int(opts["--max-num-seqs"]) if "--max-num-seqs" in opts else None,
            "kv_cache_dtype": opts.get("--kv-cache-dtype", "auto"),
            "available": logged(r"Available KV cache memory: ([\d.]+) GiB", log),
            "loading": logged(r"Model loading took ([\d.]+) GiB", log),
            "peak": float(split[2]) if split else None,
            "non_torch": float(split[3]) if split else None,
            "cudagraph": logged(r"Estimated CUDA graph memory: ([\d.]+) GiB", log)})
    return out


RECORDINGS = recordings()
STARTED = [r for r in RECORDINGS if r["outcome"] == "started"]
SPLIT = [r for r in STARTED if r["peak"] is not None]


def estimate_of(r: dict[str, Any]) -> me.Estimate:
    return me.estimate(model_of(r["kind"]), max_model_len=r["max_model_len"],
                       kv_cache_dtype=r["kv_cache_dtype"], max_num_seqs=r["max_num_seqs"])


def fit_of(r: dict[str, Any]) -> me.Fit:
    """As memory_check runs it: with auto, one short request must fit now."""
    est = estimate_of(r)
    return me.fit(est, TOTAL, FREE, r["utilization"],
                  est.len_step if r["max_model_len"] is None else None)


def test_the_recordings_span_what_the_issue_asks() -> None:
    assert len(RECORDINGS) == 9 and len(STARTED) == 8
    kinds = {r["kind"] for r in RECORDINGS}
    assert kinds == set(real_scale_models.REAL)  # 3 of the seeds' class, dense, plain MoE
    weights = [model_of(k).tensors for k in kinds]
    gib = sorted(sum(b for _, _, b in t.values()) / GiB for t in weights)
    assert gib[0] < 30 and gib[-1] > 115  # ~30 GiB to nearly the whole GPU (139.8)
    assert {r["max_num_seqs"] or 1024 for r in RECORDINGS} == {32, 64, 128, 1024}
    assert {r["utilization"] for r in RECORDINGS} == {0.5, 0.6, 0.9, 0.95}
    assert any(r["max_model_len"] is None for r in STARTED)  # auto and fixed lengths
    # every recording's weights are what the sparse headers say, to vLLM's rounding
    for r in (r for r in RECORDINGS if r["loading"]):
        assert abs(me.estimate(model_of(r["kind"])).weights[0] / GiB - r["loading"]) < 0.045


@pytest.mark.parametrize("r", STARTED, ids=lambda r: r["id"])
def test_available_kv_within_the_goal_and_never_above(r: dict[str, Any]) -> None:
    est = estimate_of(r)
    ours = me.available_kv(est, TOTAL, r["utilization"])[0] / GiB
    err = (ours - r["available"]) / r["available"]
    assert LOW <= err <= HIGH, f"{ours:.3f} against vLLM's {r['available']}: {100 * err:+.2f} %"


@pytest.mark.parametrize("r", STARTED, ids=lambda r: r["id"])
def test_every_configuration_vllm_started_is_admitted(r: dict[str, Any]) -> None:
    f = fit_of(r)
    assert f.ok, f.reason
    assert f.tokens > 0


@pytest.mark.parametrize("r", SPLIT, ids=lambda r: r["id"])
def test_each_part_against_vllms_own_split(r: dict[str, Any]) -> None:
    """vLLM's "Actual usage is W for weight, P for peak activation, N for non-torch" line and its
    "Estimated CUDA graph memory": each part of the estimate at or above vLLM's (the log rounds
    to 0.01 GiB), and not far above."""
    est = estimate_of(r)
    assert 0 <= (est.weights[0] + profile.LOAD_TRANSIENT) / GiB - r["loading"] < 0.05
    assert -0.005 <= est.activation[0] / GiB - r["peak"] < 0.13
    assert 0 <= (est.non_torch - profile.LOAD_TRANSIENT) / GiB - r["non_torch"] < 0.08
    if r["cudagraph"] is None:  # the V2 runner (the dense model) subtracts none
        assert est.cudagraph[0] == 0 and "Profiling CUDA graph memory" not in r["log"]
    else:
        assert 0 <= est.cudagraph[0] / GiB - r["cudagraph"] < 0.1


@pytest.mark.parametrize("r", [r for r in RECORDINGS if "Profiling CUDA graph" in r["log"]],
                         ids=lambda r: r["id"])
def test_capture_sizes_as_vllm_counts_them(r: dict[str, Any]) -> None:
    """"Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=51 (largest=512)"."""
    line = re.search(r"PIECEWISE=(\d+) \(largest=(\d+)\), FULL=(\d+) \(largest=(\d+)\)", r["log"])
    assert line
    pw, full = profile.capture_sizes(r["max_num_seqs"] or 1024, 8192)
    assert (len(pw), max(pw), len(full), max(full)) == tuple(int(x) for x in line.groups())


@pytest.mark.parametrize("r", [r for r in SPLIT + [r for r in RECORDINGS if r["outcome"] ==
                                                  "exited"] if r["kind"].startswith("q35")],
                         ids=lambda r: r["id"])
def test_block_size_and_encoder_budget_as_vllm_logs_them(r: dict[str, Any]) -> None:
    est = estimate_of(r)
    block = logged(r"Setting attention block size to (\d+) tokens", r["log"])
    assert block == est.block_size
    budget = re.search(r"budget of (\d+) tokens, and profiled with (\d+) image items", r["log"])
    assert budget and (int(budget[1]), int(budget[2])) == (16384, 1)
    model = model_of(r["kind"])
    peak, kept = profile.vision_profile(model, 8192)
    assert kept == 16384 * model.text["hidden_size"] * 2  # one image's 16384 encoder outputs


@pytest.mark.parametrize("r", [r for r in STARTED if "Maximum concurrency" in r["log"]],
                         ids=lambda r: r["id"])
def test_concurrency_from_vllms_available(r: dict[str, Any]) -> None:
    """The KV arithmetic at real scale: vLLM's available memory in, its "Maximum concurrency
    for L tokens per request: Nx" out (blocks // blocks per request, to two decimals)."""
    line = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", r["log"])
    assert line
    length = int(line[1].replace(",", ""))
    est = estimate_of(r)
    lo, hi = (me.num_blocks(est, int((r["available"] + d) * GiB)) / est.blocks_per_request(length)
              for d in (-0.005, 0.005))
    assert lo - 0.01 <= float(line[2]) <= hi + 0.01


def test_the_cuda_graph_profile_out_of_memory_is_refused_with_vllms_cause() -> None:
    """Recorded: the 122B's dimensions at 0.95 with vLLM's default 1024 sequences died in the
    CUDA-graph memory profile ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate
    2.05 GiB"), allocating its temporary KV cache: 512 blocks on each of the 12 KV slots, one
    tensor a slot. The admission said "max_num_seqs (1024) exceeds available Mamba cache
    blocks", a check vLLM never reached; it now names the out-of-memory, and the largest
    --max-num-seqs it proposes is admitted."""
    r = next(r for r in RECORDINGS if r["id"] == "q122_u095_s1024_l8k")
    assert r["outcome"] == "exited"
    assert "Tried to allocate 2.05 GiB" in r["log"] and "Available KV cache" not in r["log"]
    est = estimate_of(r)
    assert est.profile_blocks == 512 and est.group_size(0) == 12
    assert round(est.profile_blocks * est.page_bytes / GiB, 2) == 2.05  # one slot's tensor
    f = fit_of(r)
    assert not f.ok
    assert f.reason.startswith("CUDA out of memory in vLLM's CUDA-graph memory profile")
    assert "Mamba" not in f.reason
    seqs = int(re.search(r"Lower --max-num-seqs to at most (\d+)", f.reason)[1])
    assert 128 <= seqs < 512  # 128 started (recorded)
    lower = me.estimate(model_of(r["kind"]), max_model_len=8192, max_num_seqs=seqs)
    assert me.fit(lower, TOTAL, FREE, 0.95).ok
    # the check is on the GPU's free memory, not the utilization: a GPU half used refuses it
    assert not me.fit(lower, TOTAL, FREE // 2, 0.4).ok


def test_the_refusals_come_in_vllms_order() -> None:
    """Startup free memory first (vLLM checks it before loading), then the CUDA-graph profile,
    then the KV budget."""
    est = me.estimate(model_of("q35-122b"), max_model_len=8192)
    assert "Free memory on device" in me.fit(est, TOTAL, FREE // 2, 0.95).reason
    assert "CUDA-graph memory profile" in me.fit(est, TOTAL, FREE, 0.95).reason
    few = me.estimate(model_of("q35-122b"), max_model_len=8192, max_num_seqs=32)
    assert "No available memory for the cache blocks" in me.fit(few, TOTAL, FREE, 0.8).reason
    eager = me.estimate(model_of("q35-122b"), max_model_len=8192, enforce_eager=True)
    assert eager.profile_blocks == 0 and eager.cudagraph == (0,)  # no graphs, no such profile
    assert me.fit(eager, TOTAL, FREE, 0.95).ok


def test_language_model_only_drops_the_encoder_profile() -> None:
    model = model_of("q35-35b")
    full = me.estimate(model, max_model_len=8192, max_num_seqs=32)
    lmo = me.estimate(model, max_model_len=8192, max_num_seqs=32, language_model_only=True)
    peak, kept = profile.vision_profile(model, 8192)
    assert peak > GiB and full.activation[0] > lmo.activation[0] + GiB
    # without the encoder the sampler's moment is the peak: hidden states, workspace, sampler
    sampler = 8192 * 2 * 2048 + profile.moe_workspace(model.text, 1, 8192) + 32 * 248320 * 15.5
    assert lmo.activation[0] == sampler


def test_the_driver_cases_are_the_recordings(tmp_path: Path) -> None:
    """The fixture's cases are real_scale.CASES' (same args), and the sparse shards the driver
    writes carry the headers the estimate reads, at ~0 disk."""
    for name, s in DATA["scenarios"].items():
        assert (s["kind"], tuple(s["args"])) == real_scale.CASES[name]
    cfg, shards = real_scale_models.headers("qwen3-30b-a3b")
    name, header = next(iter(shards.items()))
    real_scale_models._sparse_shard(tmp_path / name, header)
    assert me.read_header(str(tmp_path / name)) == {"__metadata__": {"format": "pt"}, **header}
    stat = (tmp_path / name).stat()
    assert stat.st_size > 4 << 30 and stat.st_blocks * 512 < 4 << 20
