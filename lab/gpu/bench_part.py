"""The GPU tier's `bench` part: real vLLM 0.26.0 on one GPU in the program's layout (the Ray
head's and vLLM's start scripts, as lab/gpu/runner.py runs them), then what `spark-vllm bench`
and `spark-vllm top` read (lab/gpu/serving_bench.py: /metrics, llama-benchy's stream, a small
benchmark) and the benchmark at its `spark` profile (llama-benchy's pp2048/tg128, concurrency
1 to 8), whose figures docs/operations.md quotes. A part of its own so that runner.py does not
grow; device.sh runs it as `run bench` (llama-benchy's wheel carried beside the stash).

    python3 lab/gpu/bench_part.py --out DIR [--site DIR] [--hf DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lab.gpu import serving_bench  # noqa: E402
from lab.gpu.runner import API_KEY, Tier  # noqa: E402
from spark_vllm import bench_load  # noqa: E402
from spark_vllm.components.render import commands  # noqa: E402

MODEL = "spark-vllm/tiny-dense"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--site", default="/root/site")
    ap.add_argument("--hf", default="/root/hf")
    ap.add_argument("--vllm-cache", default="/root/vllm-cache")
    ap.add_argument("--shim-dir", default="/root/shim-bin")
    ap.add_argument("--ip", default="")
    ap.add_argument("--image-env", default="")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    tier = Tier(args)
    tier.header("bench")
    s = tier.spec(model=MODEL, vllm_args=("--max-model-len", "4096",
                                          "--gpu-memory-utilization", "0.5"))
    tier.probe_dir.mkdir(parents=True, exist_ok=True)
    tier.record("bench_head_start", lambda: tier.head_up(s))
    tier.record("bench_serve", lambda: {**tier.vllm_up(s),
                                        "log": tier.container_log(s, commands.VLLM)})
    tokenizer = serving_bench.tokenizer_of(args.hf, MODEL)
    text = (REPO / "README.md").read_text()
    serving_bench.record(tier, s.served_name, tokenizer, text)
    base = f"http://{tier.api_addr}:{tier.port}"
    for name in ("spark", "quick"):
        profile = bench_load.PROFILES[name]
        tier.record(f"bench_profile_{name}", lambda p=profile: serving_bench.bench_run(
            base, API_KEY, s.served_name, tokenizer, text, p))
    tier.record("bench_cleanup", lambda: {r: tier.remove(s, r) for r in (commands.VLLM,
                                                                        commands.HEAD)})
    tier.save()


if __name__ == "__main__":
    main()
