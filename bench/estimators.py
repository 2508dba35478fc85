"""`python -m bench --only estimators`: memory admission against the peers' estimators, no lab.

For every committed recording of real vLLM 0.26.0 (bench/estimators_cases.py), spark-vllm's
estimate (components/memory_estimate.py, in this process) beside kvfit 0.3.0's and sparkrun
0.4.2's, each run in its own venv by bench/estimators_peer.py (one process for all cases):
available KV and KV tokens against vLLM's "Available KV cache memory" and "GPU KV cache size",
the signed error of each, and the configurations each would admit that vLLM refused. Writes
bench/results/<stamp>-estimators.json (every row, raw outputs included) and
<stamp>-estimators.md (bench/estimators_report.py)."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import estimators_cases, estimators_report
from bench.common import REPO, dump_json, say

PEER = Path(__file__).resolve().parent / "estimators_peer.py"
TOOLS = ("spark-vllm", "kvfit", "sparkrun")
GiB = 1 << 30
# What each estimator has no input for, among what vLLM's budget depends on (read from their
# sources: kvfit planner.py / cli.py, sparkrun models/vram.py / core/recipe.py). spark-vllm's
# own gaps are memory_estimate.py's docstring's.
CANNOT_EXPRESS = {
    "spark-vllm": [
        "what TP > 1 adds (NCCL and custom all-reduce buffers): not measured, an "
        "extra_overhead_bytes input (every recording here is TP 1)",
    ],
    "kvfit": [
        "--max-num-seqs and --max-num-batched-tokens: no input (the activation peak, the "
        "sampler and the CUDA-graph sizes vLLM derives from them are not counted)",
        "the peak activation, CUDA graphs and memory outside torch: not modelled; its "
        "--runtime-reserve-gib is the user's guess (default 0, used here)",
        "vLLM's block size and the hybrid page padding: KV is per-token bytes x context "
        "(+ a recurrent state a sequence)",
        "the GPU's free memory at start and vLLM's CUDA-graph profile: no check",
        "--max-model-len auto: needs a context; given max_position_embeddings, the length "
        "vLLM's auto fit tries first",
        "the weights: the repository's safetensors bytes (here passed as weight_bytes, as "
        "--weight-gib does), every file (an MTP head or vision tower vLLM skips included)",
    ],
    "sparkrun": [
        "--max-num-seqs and --max-num-batched-tokens: estimate_vram has no concurrency input "
        "(a recipe's max_num_seqs reaches only vLLM's command line)",
        "the peak activation, CUDA graphs and memory outside torch: not modelled "
        "(available KV = total x utilization - weights)",
        "vLLM's block size and the hybrid page padding: tokens = (budget - one sequence's "
        "recurrent state) / per-token bytes",
        "the GPU's free memory at start and vLLM's CUDA-graph profile: check_fit compares "
        "weights + one max_model_len request with total x utilization only",
        "the weights: the checkpoint's size (model.safetensors.index.json total_size, offline; "
        "list_repo_tree's file sizes online), every file",
    ],
}


def pct(value: float | None, ref: float | None) -> float | None:
    """Signed error of value against ref, in percent (None where either is missing)."""
    if value is None or ref is None or ref == 0:
        return None
    return 100.0 * (value - ref) / ref


def build_row(case: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One recording: vLLM's numbers and each tool's, with the tool's signed errors and whether
    it admits what vLLM refused (or refuses what vLLM started)."""
    vllm = case["vllm"]
    refused = vllm["outcome"] == "refused"
    tools = {}
    for name, r in results.items():
        avail = r["available_bytes"] / GiB if r.get("available_bytes") is not None else None
        tools[name] = {
            "available_gib": avail, "tokens": r.get("tokens"), "admits": bool(r.get("admits")),
            "err_available_pct": pct(avail, vllm["available_gib"]),
            "err_tokens_pct": pct(r.get("tokens"), vllm["tokens"]),
            "admitted_refused": bool(r.get("admits")) and refused,
            "refused_started": not r.get("admits") and not refused,
            **({"error": r["error"]} if r.get("error") else {}),
            "raw": r.get("raw", {}),
        }
    keep = ("id", "fixture", "model", "set", "tp", "utilization", "max_model_len",
            "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "total_bytes",
            "free_bytes", "weight_bytes")
    return {**{k: case[k] for k in keep}, "vllm": vllm, "tools": tools}


def _stats(errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"n": 0}
    return {"n": len(errors), "median_abs_pct": statistics.median(abs(e) for e in errors),
            "max_pct": max(errors), "min_pct": min(errors),
            "max_abs_pct": max(abs(e) for e in errors),
            "within_1pct": sum(abs(e) <= 1 for e in errors)}


def summary(rows: list[dict[str, Any]], tools: tuple[str, ...] = TOOLS) -> dict[str, Any]:
    out = {}
    for name in tools:
        t = [(r["id"], r["tools"][name]) for r in rows if name in r["tools"]]
        out[name] = {
            "available": _stats([x["err_available_pct"] for _, x in t
                                 if x["err_available_pct"] is not None]),
            "tokens": _stats([x["err_tokens_pct"] for _, x in t
                              if x["err_tokens_pct"] is not None]),
            "admitted_but_vllm_refused": [i for i, x in t if x["admitted_refused"]],
            "refused_but_vllm_started": [i for i, x in t if x["refused_started"]],
            "no_estimate": [i for i, x in t if x["available_gib"] is None],
            # per recording file: the tiny models' weights are ~0.01 GiB, so there nearly
            # all of the budget is KV whatever an estimator leaves out
            "available_by_fixture": {
                f: _stats([r["tools"][name]["err_available_pct"] for r in rows
                           if r["fixture"] == f and name in r["tools"]
                           and r["tools"][name]["err_available_pct"] is not None])
                for f in dict.fromkeys(r["fixture"] for r in rows)},
        }
    return out


def run_peers(inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """bench/estimators_peer.py once, in the peers' venv (-I: not bench/ on its sys.path, where
    profile.py would shadow the standard library's)."""
    from bench import sparkrun_env

    proc = subprocess.run([str(sparkrun_env.python()), "-I", str(PEER)],
                          input=json.dumps(inputs), capture_output=True, text=True,
                          env=sparkrun_env.env(), timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench: the peers' estimators failed (rc {proc.returncode}):\n"
                         f"{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                         text=True, check=False)
    return out.stdout.strip()


def collect() -> dict[str, Any]:
    cases = estimators_cases.cases()
    say(f"estimators: {len(cases)} recordings; kvfit and sparkrun in their own venv")
    peers = run_peers([estimators_cases.peer_input(c) for c in cases])
    by_id = {p["id"]: p for p in peers["results"]}
    rows = [build_row(c, {"spark-vllm": c["spark-vllm"], "kvfit": by_id[c["id"]]["kvfit"],
                          "sparkrun": by_id[c["id"]]["sparkrun"]}) for c in cases]
    from importlib import metadata

    return {
        "machine": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "commit": _commit(), "kernel": platform.release(),
                    "python": platform.python_version(),
                    "peers_python": peers["versions"]["python"]},
        "versions": {"spark-vllm": metadata.version("spark-vllm"),
                     "vllm (recorded)": "0.26.0", **peers["versions"]},
        "cannot_express": CANNOT_EXPRESS,
        "rows": rows,
        "summary": summary(rows),
    }


def main(results_dir: Path) -> int:
    result = collect()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = results_dir / f"{stamp}-estimators"
    dump_json(base.with_suffix(".json"), result)
    text = estimators_report.markdown(result)
    base.with_suffix(".md").write_text(text)
    shown = base.relative_to(REPO) if base.is_relative_to(REPO) else base
    say(f"wrote {shown}.json and .md")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(__file__).resolve().parent / "results"))
