"""Issue 36: memory admission against the seeds' class, one test per fault (each failed before
its fix), and the held-out recordings of real vLLM 0.26.0 on one H200
(tests/fixtures/real-vllm/vllm-0.26.0-qwen35.json, made by lab/gpu/runner.py --part qwen35,
qwen35-heldout and heldout in four device calls).

Fitted vs held out: these calls were held out when they were made; since issue 45 the
profile's measured constants (memory_profile.py MEASURED: the sampler's bytes a logit, the
vision tower's peak, the non-torch memory, the CUDA-graph terms) are set from the real-scale
recordings (test_memory_real_scale.py) together with the CUDA-graph estimates these calls
print, so only the available KV of calls 2-4 is still held out from those constants."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from lab import model_gen
from lab.gpu import tiny_model
from spark_vllm.components import memory_estimate as me
from spark_vllm.components import memory_profile as profile
from spark_vllm.components import node_memory

GiB = me.GiB
FIXTURE = Path(__file__).parents[1] / "fixtures" / "real-vllm" / "vllm-0.26.0-qwen35.json"
DATA = json.loads(FIXTURE.read_text())
H200_SMI = 143771 << 20  # nvidia-smi's memory.total
H200_CUDA = 150109880320  # cudaMemGetInfo's total, recorded (gpu_memory scenario)
GOAL_UTILIZATIONS = (0.2, 0.9)  # the range for the +-1 % goal
BLOCK_FP8 = {"spark-vllm/qwen35-fp8", "spark-vllm/qwen3moe-fp8"}


def sized_model(kind: str) -> me.ModelFiles:
    """The safetensors headers lab/gpu/tiny_model.py's fp8_model writes (names, dtypes, shapes:
    block FP8 e4m3 + float32 weight_scale_inv per 128x128 block), and its config."""
    cfg = json.loads(json.dumps(tiny_model.SIZED[kind]))
    tensors, keep = tiny_model.fp8_tensors(cfg)
    cfg["quantization_config"] = {**cfg["quantization_config"], "modules_to_not_convert": keep}
    header: dict[str, Any] = {}
    offset = 0
    for name, shape, quantized in tensors:
        parts = [(name, "F8_E4M3" if quantized else "BF16", list(shape))]
        if quantized:
            parts.append((name + "_scale_inv", "F32", [math.ceil(d / 128) for d in shape]))
        for n, dtype, s in parts:
            nbytes = math.prod(s) * me.DTYPE_BYTES[dtype]
            header[n] = {"dtype": dtype, "shape": s, "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
    return me.read_model({"config.json": cfg, "model.safetensors": header})


def recorded_models() -> dict[str, me.ModelFiles]:
    """The models as the runs made them: the block-FP8 ones rebuilt from tiny_model (fp8_model
    writes exactly those tensors), the ones transformers' save_pretrained wrote from the config
    and tensor headers the run read back on the machine (`sized_models`)."""
    out = {f"spark-vllm/{k}": sized_model(k) for k in ("qwen35-fp8", "qwen3moe-fp8")}
    for body in DATA["runs"].values():
        for model, files in (body["scenarios"].get("sized_models") or {}).items():
            if isinstance(files, dict):
                out[model] = me.read_model({"config.json": files["config"], "m.safetensors": {
                    n: {"dtype": d, "shape": sh, "data_offsets": [0, b]}
                    for n, (d, sh, b) in files["tensors"].items()}})
    return out


MODELS = recorded_models()


def recordings() -> list[dict[str, Any]]:
    out = []
    for run, body in DATA["runs"].items():
        for name, s in body["scenarios"].items():
            log = "\n".join(s.get("log") or []) if isinstance(s, dict) else ""
            avail = re.search(r"Available KV cache memory: ([\d.]+) GiB", log)
            if not avail:
                continue
            args = s["args"]
            opts = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
            call = DATA["header"]["runs"][run]["call"]
            util = float(opts["--gpu-memory-utilization"])
            out.append({
                "id": f"{run}.{name}", "call": call, "held_out": call != 1,
                "model": s.get("model", "spark-vllm/qwen35-fp8"), "rc": s["rc"],
                "utilization": util,
                "in_goal": GOAL_UTILIZATIONS[0] <= util <= GOAL_UTILIZATIONS[1],
                "max_model_len": (None if opts["--max-model-len"] == "auto"
                                  else int(opts["--max-model-len"])),
                "max_num_seqs": int(opts["--max-num-seqs"]) if "--max-num-seqs" in opts else None,
                "max_num_batched_tokens": (int(opts["--max-num-batched-tokens"])
                                           if "--max-num-batched-tokens" in opts else None),
                "kv_cache_dtype": opts.get("--kv-cache-dtype", "auto"),
                "available_gib": float(avail[1]),
                "loading_gib": float(re.search(r"Model loading took ([\d.]+) GiB", log)[1]),
                "tokens": int(re.search(r"GPU KV cache size: ([\d,]+)", log)[1].replace(",", "")),
                "log": log})
    return out


RECORDINGS = recordings()
HELD_OUT = [r for r in RECORDINGS if r["held_out"]]
IN_GOAL = [r for r in RECORDINGS if r["in_goal"]]


def by_id(rid: str) -> dict[str, Any]:
    return next(r for r in RECORDINGS if r["id"] == rid)


def estimate_of(r: dict[str, Any]) -> me.Estimate:
    return me.estimate(MODELS[r["model"]], max_model_len=r["max_model_len"],
                       kv_cache_dtype=r["kv_cache_dtype"], max_num_seqs=r["max_num_seqs"],
                       max_num_batched_tokens=r["max_num_batched_tokens"])


def error(r: dict[str, Any]) -> float:
    """The estimate's available KV minus vLLM's, in GiB."""
    return me.available_kv(estimate_of(r), H200_CUDA, r["utilization"])[0] / GiB - r[
        "available_gib"]


# ---------------------------------------------------------------------------- held out


def test_the_recordings_are_read_fitted_apart_from_held_out() -> None:
    assert {r["call"] for r in RECORDINGS if not r["held_out"]} == {1}
    assert {r["call"] for r in HELD_OUT} == {2, 3, 4}
    goal = [r for r in HELD_OUT if r["in_goal"]]
    assert len(goal) >= 6 and all(r["loading_gib"] >= 1 for r in goal)
    assert sum(r["model"] in BLOCK_FP8 for r in goal) >= 2
    assert sum(r["model"] == "spark-vllm/qwen35-fp8" for r in goal) >= 3  # the seeds' class
    models = {r["model"] for r in goal}
    assert models == {"spark-vllm/qwen35-fp8", "spark-vllm/qwen3moe-fp8",
                      "spark-vllm/qwen3-vocab", "spark-vllm/qwen3moe-vocab"}
    assert {r["utilization"] for r in goal} >= {0.2, 0.25, 0.3, 0.5, 0.8, 0.85, 0.9}
    # the transformers-written models are read from what the run read back, not rebuilt
    assert MODELS["spark-vllm/qwen3moe-vocab"].config["num_local_experts"] == 32
    assert "num_experts" not in MODELS["spark-vllm/qwen3moe-vocab"].config


def test_merge_into_adds_a_call_and_refuses_a_run_twice(tmp_path: Path) -> None:
    """lab/gpu/merge.py --into: how calls 3 and 4 joined the merged file (their call number,
    the fields of a machine that differ from the first call's)."""
    from lab.gpu import merge

    part = tmp_path / "part.json"
    part.write_text(json.dumps({"header": {**DATA["header"], "kernel": "other-kernel",
                                           "part": "heldout", "date": "d", "commit": "c"},
                                "scenarios": {"x": {"rc": 0}}}))
    base = {"header": dict(DATA["header"]), "runs": {}}
    base["header"]["runs"] = {}
    out = merge.merge_into(base, [("call9", part)], 9)
    assert out["header"]["runs"]["call9"] == {"part": "heldout", "date": "d", "commit": "c",
                                              "call": 9, "kernel": "other-kernel"}
    assert out["runs"]["call9"] == {"scenarios": {"x": {"rc": 0}}}
    with pytest.raises(SystemExit, match="call9"):
        merge.merge_into(out, [("call9", part)], 10)
    assert DATA["header"]["runs"]["heldout-call3"]["call"] == 3
    assert DATA["header"]["runs"]["heldout-call4"]["call"] == 4


@pytest.mark.parametrize("r", IN_GOAL, ids=lambda r: r["id"])
def test_available_kv_within_one_percent(r: dict[str, Any]) -> None:
    """The estimator's own budget (CUDA's total x utilization - weights - activation -
    overheads) against vLLM's "Available KV cache memory", within 1 % (the log rounds to
    0.01 GiB), and the weights against "Model loading took"."""
    est = estimate_of(r)
    assert abs(error(r)) <= 0.01 * r["available_gib"], error(r)
    assert abs(est.weights[0] / GiB - r["loading_gib"]) <= 0.035
    tokens = me.tokens_for(est, int(r["available_gib"] * GiB),
                           r["max_model_len"] or est.max_len_cap)
    assert abs(tokens - r["tokens"]) <= 0.01 * r["tokens"]


def test_the_fitted_recording_is_covered_by_the_profile_arithmetic() -> None:
    """Call 1's recording (the seeds' class at 1024 sequences): what vLLM's numbers leave for the
    peak activation lies under the estimate's (the sampler, the fused-MoE workspace, the encoder
    outputs and the hidden states: memory_profile.activation) by less than 0.2 GiB."""
    r = next(r for r in RECORDINGS if not r["held_out"])
    est = estimate_of(r)
    non_kv = me.requested_memory(H200_CUDA, r["utilization"]) - r["available_gib"] * GiB
    activation = non_kv - r["loading_gib"] * GiB - est.non_torch - est.cudagraph[0]
    assert 0 <= est.activation[0] - activation < 0.2 * GiB


def test_max_model_len_auto_against_what_vllm_chose() -> None:
    """Item 3 on real runs (held out). At 0.066, where 262144 does not fit, vLLM's auto fit
    chose 108768 tokens: 103 attention blocks of 1056 + 3 linear-group blocks = all 106 blocks,
    the null block included, so a request of that length could never be scheduled; with vLLM's
    own block count the program's longest length leaves one block. vLLM then refused to start
    (1024 sequences over 106 Mamba blocks), and so does the program, naming why. At 0.2 and at
    0.066 with 64 sequences the full 262144 fit in both."""
    r = by_id("heldout-call3.held_qwen35_util0066_auto")
    chosen = re.search(r"reduced from 262144 to (\d+) .*\(([\d.]+) GiB available", r["log"])
    blocks = int(re.search(r"exceeds available Mamba cache blocks \((\d+)\)", r["log"])[1])
    assert chosen and int(chosen[1]) == r["tokens"] == 108768 and blocks == 106
    est = estimate_of(r)
    assert est.block_size == 1056 and est.page_bytes * est.group_size(0) == 4325376
    assert est.blocks_per_request(108768) == blocks  # vLLM's length: every block
    vllm_avail = blocks * est.page_bytes * est.group_size(0)
    assert me.num_blocks(est, vllm_avail) == blocks
    longest = me.max_len_that_fits(est, [vllm_avail])
    assert est.blocks_per_request(longest) == blocks - 1  # the program's: the null block left
    assert longest == 107712  # one block of 1056 under vLLM's
    # the program's own estimate, as memory_check runs it for auto (one short request)
    f = me.fit(est, H200_CUDA, H200_CUDA, r["utilization"], est.len_step)
    assert not f.ok and "max_num_seqs (1024) exceeds available Mamba cache blocks" in f.reason
    assert 0 < f.max_model_len < longest  # -0.076 GiB of available KV: 87648, on the safe side
    for rid in ("qwen35-heldout.held_qwen35_util02_auto",
                "heldout-call4.held_qwen35_util0066_auto_seqs64"):
        r = by_id(rid)
        assert "full model context length 262144 fits" in r["log"]
        est = estimate_of(r)
        f = me.fit(est, H200_CUDA, H200_CUDA, r["utilization"], est.len_step)
        assert f.ok and f.max_model_len == 262144, (rid, f)


def test_the_seeds_class_with_few_sequences() -> None:
    """Held out (call 4): --max-num-seqs 64 at 0.066, once a known gap (the estimate promised
    4.24 GiB where vLLM left 3.03: its profile peak with few sequences is the vision encoder's
    profile and the forward, 1.92 GiB, not the sampler's). The profile arithmetic now counts
    both (memory_profile.vision_profile, moe_workspace): the estimate is under vLLM's, never
    over, and vLLM's own split of the peak is under the estimate's by less than 0.1 GiB."""
    r = by_id("heldout-call4.held_qwen35_util0066_auto_seqs64")
    split = re.search(r"([\d.]+) GiB for peak activation", json.dumps(
        DATA["runs"]["heldout-call4"]["scenarios"]["held_qwen35_util0066_auto_seqs64"]))
    assert split and split[1] == "1.92"
    assert -0.25 <= error(r) <= 0
    assert 0 <= estimate_of(r).activation[0] / GiB - 1.92 < 0.1


# ---------------------------------------------------------------------------- the faults


def test_fault_total_is_cudas_not_nvidia_smis() -> None:
    """The node script reads CUDA's total (615 MiB under nvidia-smi's on the H200, recorded);
    the admission budgets from it, as vLLM's request_memory does."""
    rec = json.loads(FIXTURE.read_text())["runs"]["qwen35"]["scenarios"]["gpu_memory"]
    out = rec["node_script"]
    assert out == "cuda-total 0 150109880320 0\nnvidia-smi 143771, 143156"
    assert json.loads(rec["torch"])["total"] == H200_CUDA  # cudaMemGetInfo, what vLLM reads
    gpus = node_memory.parse(out)
    assert gpus is not None and gpus[0].total_bytes == H200_CUDA
    assert gpus[0].free_bytes == 143156 << 20
    assert (H200_SMI - H200_CUDA) >> 20 == 615
    # without CUDA (the lab's simulated nvidia-smi): nvidia-smi's total stands in
    assert node_memory.parse("nvidia-smi 12288, 12288")[0].total_bytes == 12 * GiB  # type: ignore[index]
    # a GB10: MemAvailable is vLLM's free; the total is CUDA's
    spark = node_memory.parse("cuda-total 0 128526278656 1\nmeminfo 124620, 106000")
    assert spark == [node_memory.GpuMemory("meminfo", 124620, 106000, 128526278656)]
    assert "0.5 × 119.7 = 59.8 GiB" in (node_memory.shortfall(
        "spark", [node_memory.GpuMemory("meminfo", 124620, 50000, 128526278656)], 0.5) or "")


def test_fault_the_node_script_asks_cuda_bounded_and_falls_back() -> None:
    script = node_memory.SCRIPT
    assert "cuDeviceTotalMem_v2" in script and "timeout 10 python3" in script
    assert "--query-gpu=memory.total,memory.free --format=csv,noheader,nounits" in script


def test_fault_the_rotary_cache_counts_as_weights() -> None:
    """0.125 GiB at a 524288 context (head 128, bf16); mrope keeps 4 x max_position."""
    c = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000, "hidden_size": 512,
         "intermediate_size": 1024, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1,
         "head_dim": 128, "max_position_embeddings": 524288}
    m = me.read_model({"config.json": c, "m.safetensors": {}})
    assert me.estimate(m).weights == (GiB // 8,)
    assert me.rotary_cache_bytes({**c, "rope_parameters": {
        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}}) == 524288 * 4 * 32 * 2
    # the seeds' class: "Model loading took 3.91 GiB" is the files' 3.78 + the 0.125 cache
    q = sized_model("qwen35-fp8")
    files = sum(n for _, _, n in q.tensors.values())
    assert me.estimate(q).weights[0] - files == 262144 * 4 * 64 * 2


def test_fault_activation_follows_the_runner_and_the_vocabulary() -> None:
    """A dense model (V2 runner: no top-k/top-p in the dummy sampler) with a 151936 vocabulary:
    ~0.6 GiB, not the 2.35 estimated before; an MoE one (V1 runner) ~2.8 GiB: its sampler and
    the fused-MoE workspace (0.5 GiB) beside it."""
    dense = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
             "intermediate_size": 6144, "num_hidden_layers": 4, "num_attention_heads": 16,
             "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 40960}
    est = me.estimate(me.read_model({"config.json": dense, "m.safetensors": {}}))
    assert 0.5 * GiB < est.activation[0] < 0.7 * GiB
    moe = me.estimate(sized_model("qwen3moe-fp8"))
    assert 2.7 * GiB < moe.activation[0] < 2.9 * GiB


def test_fault_num_local_experts_is_an_expert_count() -> None:
    """transformers 5.x writes Qwen3-MoE's expert count as num_local_experts (recorded: the
    qwen3moe-vocab config save_pretrained wrote on the GPU machine)."""
    c = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
         "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
         "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 4,
         "head_dim": 128, "num_local_experts": 32, "num_experts_per_tok": 8,
         "moe_intermediate_size": 768, "max_position_embeddings": 40960}
    v5 = me.estimate(me.read_model({"config.json": c, "m.safetensors": {}}))
    v4 = me.estimate(me.read_model({"config.json": {**c, "num_experts": 32},
                                    "m.safetensors": {}}))
    assert v5 == v4
    assert v5.non_torch == profile.NON_TORCH_V1 + profile.LOAD_TRANSIENT  # the MoE runner's
    assert v5.cudagraph[0] > 0  # the V1 runner subtracts a CUDA-graph estimate
    assert v5.activation[0] > 2.5 * GiB  # V1's sampler


@pytest.mark.parametrize(("change", "named"), [
    ({"architectures": ["DeepseekV3ForCausalLM"]}, "DeepseekV3ForCausalLM"),
    ({"architectures": []}, "architectures []"),
    ({"num_local_experts": None}, "no expert count"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"hidden_size": None}, "'hidden_size'"),
])
def test_fault_an_architecture_it_cannot_account_for_is_refused_by_name(
        change: dict[str, Any], named: str) -> None:
    c = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "num_local_experts": 8, "num_experts_per_tok": 2,
         "moe_intermediate_size": 128, "max_position_embeddings": 4096}
    with pytest.raises(me.UnsupportedModelError, match=re.escape(named)):
        me.estimate(me.read_model({"config.json": {**c, **change}, "m.safetensors": {}}))


def test_fault_a_hybrid_model_needs_a_block_per_sequence() -> None:
    """Recorded (call 3): vLLM 0.26.0 refuses a hybrid model whose KV blocks are fewer than
    --max-num-seqs once full CUDA graphs are on (the default); the admission said it fit."""
    est = me.estimate(sized_model("qwen35-fp8"))
    room = est.non_kv(0) + 100 * est.page_bytes * est.group_size(0)  # 100 blocks
    util = room / H200_CUDA
    f = me.fit(est, H200_CUDA, H200_CUDA, util, est.len_step)
    assert not f.ok and "max_num_seqs (1024) exceeds available Mamba cache blocks (100)" in f.reason
    assert "--max-num-seqs to at most 100" in f.reason
    assert me.fit(me.estimate(sized_model("qwen35-fp8"), max_num_seqs=100), H200_CUDA,
                  H200_CUDA, util, est.len_step).ok
    assert me.fit(me.estimate(sized_model("qwen35-fp8"), enforce_eager=True), H200_CUDA,
                  H200_CUDA, util, est.len_step).ok  # no CUDA graphs: no such check
    dense = me.estimate(sized_model("qwen3moe-fp8"))  # no linear layers: no such check
    room = dense.non_kv(0) + 100 * dense.page_bytes * dense.group_size(0)
    assert me.fit(dense, H200_CUDA, H200_CUDA, room / H200_CUDA, 16).ok


def test_fault_auto_length_leaves_the_null_block() -> None:
    """--max-model-len auto: vLLM fits the length whose one request takes ALL the blocks, the
    null block included, so a request of exactly that length waits forever. The length this
    admission reports (and the seeds' 262144 at 0.2 recorded as "full model context length
    262144 fits") leaves one block of every group free."""
    est = me.estimate(sized_model("qwen3moe-fp8"), max_model_len=4096)
    for avail in (int(0.7 * GiB), int(0.71 * GiB), 3 * GiB + 12345):
        est_long = me.estimate(sized_model("qwen3moe-fp8"))
        est_long = type(est_long)(**{**est_long.__dict__, "max_len_cap": 1 << 30})
        n = me.max_len_that_fits(est_long, [avail])
        assert 0 < n and me.kv_needed(est_long, n) + me.null_block_bytes(est_long) <= avail
        assert me.kv_needed(est_long, n + 16) + me.null_block_bytes(est_long) > avail
        # vLLM's own fit (without the null block) would give one block more
        assert me.kv_needed(est_long, n + 16) <= avail
    assert me.null_block_bytes(est) == est.page_bytes * est.group_size(0)


# ---------------------------------------------------------------------------- the lab (test_6)


def test_the_lab_models_wedge_scenario_still_holds() -> None:
    """tests/integration/test_wedge.py test_6, here: the lab model (model_gen's config and
    shards, 512 MiB) at TP 2 on nodes of 12 GiB (the simulated nvidia-smi: no CUDA line), 0.9,
    --max-model-len 262144: refused, the longest context strictly between 65536 and 262144,
    and the table's 12.00 columns."""
    size, shards = 512 * 2**20, 4
    plan = model_gen.plan_shards(size, shards)
    small = model_gen.small_files("Qwen/Qwen3.5-122B-A10B-FP8", size, shards, plan)
    files: dict[str, Any] = {"config.json": json.loads(small["config.json"])}
    for name, header, _ in plan:
        files[name] = json.loads(header[8:])
    gpus = node_memory.parse("nvidia-smi 12288, 12288")
    assert gpus is not None
    total, free = gpus[0].total_bytes, gpus[0].free_bytes
    est = me.estimate(me.read_model(files), tp=2, max_model_len=262144)
    f = me.fit(est, total, free, 0.9)
    assert not f.ok and f.kv_needed == 12 * GiB
    assert 65536 < f.max_model_len < 262144
    row = me.table([("node-2", f)])[1]
    assert re.search(r"node-2 +\| +12\.00 \| +[\d.]+ \| +12\.00 \| +-[\d.]+", row), row
    assert me.fit(est, total, free, 0.9, f.max_model_len).ok
