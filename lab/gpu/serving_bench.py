"""`spark-vllm bench` and `spark-vllm top` against real vLLM: what they read, recorded by a tier
runner (the CPU tier's `--part bench`, two nodes at TP 2; the GPU tier's `lab/gpu/bench_part.py`,
one GPU), and the facts the CPU tests compare between a recording and vllm-sim.

Recorded, on a served stack: /metrics as the API serves it (the whole text, before and after the
load), one streamed chat completion exactly as llama-benchy asks for it (its payload: stream,
`return_token_ids`, `stream_options.include_usage`, `ignore_eos`; every event kept with its
arrival time), and the benchmark's own run (spark_vllm.bench_load with a small profile: every
request, the figures, llama-benchy's table).
"""

from __future__ import annotations

import glob
import json
import time
import urllib.request
from typing import Any

from spark_vllm import bench_load, bench_report, top_data

PROFILE = bench_load.Profile("tier", prompt_tokens=128, output_tokens=32, concurrency=(1, 2),
                             runs=2)
STREAM_TOKENS = 8


def tokenizer_of(hf: str, model: str) -> str:
    found = sorted(glob.glob(f"{hf}/hub/models--{model.replace('/', '--')}/snapshots/*/"
                             "tokenizer.json"))
    if not found:
        raise FileNotFoundError(f"no tokenizer.json for {model} under {hf}")
    return found[0]


def stream_events(base: str, key: str, served: str, timeout: float = 60) -> dict[str, Any]:
    """One streamed chat as llama-benchy sends it (client.py _build_generation_payload with
    exact_tg): each `data:` event parsed, with its arrival time after the request."""
    body = {"model": served, "messages": [{"role": "user", "content": "count to ten"}],
            "max_tokens": STREAM_TOKENS, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}, "min_tokens": STREAM_TOKENS,
            "ignore_eos": True}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {key}"})
    start = time.monotonic()
    events: list[dict[str, Any]] = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (the tier's)
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            at = round(time.monotonic() - start, 4)
            data = line[5:].strip()
            events.append({"at": at, "data": data if data == "[DONE]" else json.loads(data)})
    return {"events": events}


def metrics_text(base: str, key: str) -> str:
    req = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (the tier's)
        return str(resp.read().decode(errors="replace"))


def bench_run(base: str, key: str, served: str, tokenizer: str, text: str,
              profile: bench_load.Profile = PROFILE) -> dict[str, Any]:
    load = bench_load.run(f"{base}/v1", key, served, tokenizer, text, profile,
                          progress=lambda s: print(f"[bench] {s}", flush=True))
    return {"profile": profile.describe(), "llamaBenchy": load.benchy_version,
            "figures": {str(k): v for k, v in bench_report.figures(load.requests).items()},
            "requests": [r.as_dict() for r in load.requests], "benchyTable": load.benchy_table}


def record(tier: Any, served: str, tokenizer: str, text: str, prefix: str = "bench") -> None:
    """The four records, on a tier whose API answers at tier.api_addr:tier.port."""
    from lab.gpu.runner import API_KEY

    base = f"http://{tier.api_addr}:{tier.port}"
    tier.record(f"{prefix}_metrics_before", lambda: {"text": metrics_text(base, API_KEY)})
    tier.record(f"{prefix}_stream", lambda: stream_events(base, API_KEY, served))
    tier.record(f"{prefix}_load", lambda: bench_run(base, API_KEY, served, tokenizer, text))
    tier.record(f"{prefix}_metrics_after", lambda: {"text": metrics_text(base, API_KEY)})


# --- facts: what must be the same on vllm-sim as on real vLLM ---------------------------------
def facts(obs: dict[str, Any], prefix: str = "bench") -> dict[str, str]:
    s = obs["scenarios"]
    out: dict[str, str] = {}
    before = top_data.parse_metrics(s[f"{prefix}_metrics_before"].get("text", ""))
    after = top_data.parse_metrics(s[f"{prefix}_metrics_after"].get("text", ""))
    out["metrics: what top reads is there"] = " ".join(
        sorted(n for n in (*top_data.GAUGES, *top_data.COUNTERS) if n in before))
    out["metrics: the generation counter counts the load's tokens"] = str(
        after.get("vllm:generation_tokens_total", 0) - before.get(
            "vllm:generation_tokens_total", 0) >= PROFILE.output_tokens * 6)
    events = s[f"{prefix}_stream"].get("events", [])
    chunks = [e["data"] for e in events if isinstance(e["data"], dict)]
    out["stream: ends with [DONE]"] = str(bool(events) and events[-1]["data"] == "[DONE]")
    with_text = [c for c in chunks if c.get("choices") and any(
        c["choices"][0].get("delta", {}).get(k) for k in ("content", "reasoning",
                                                          "reasoning_content"))]
    out["stream: text arrives in several chunks"] = str(len(with_text) > 1)
    out["stream: text chunks carry token_ids"] = str(bool(with_text) and all(
        isinstance(c["choices"][0].get("token_ids"), list) for c in with_text))
    usage = [c for c in chunks if c.get("usage")]
    out["stream: the usage counts the completion"] = str(
        bool(usage) and usage[-1]["usage"].get("completion_tokens") == STREAM_TOKENS)
    out["stream: the usage comes in a chunk of its own"] = str(
        bool(usage) and all(c.get("choices") == [] for c in usage))
    finished = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")
                and c["choices"][0].get("finish_reason")]
    out["stream: the finish reason (ignore_eos)"] = " ".join(finished)
    out["stream: the role's chunk carries the prompt's token ids"] = str(
        bool(chunks) and isinstance(chunks[0].get("prompt_token_ids"), list))
    load = s[f"{prefix}_load"]
    reqs = [bench_load.Request.from_dict(r) for r in load.get("requests", [])]
    out["bench: every request answered"] = str(
        len(reqs) == PROFILE.runs * sum(PROFILE.concurrency) and all(
            r.error is None for r in reqs))
    out["bench: llama-benchy counts at most the answer's tokens"] = str(
        bool(reqs) and all(0 < r.counted <= PROFILE.output_tokens for r in reqs))
    # the ITL figures need tokens spread over the answer's time, not sent at its end (how
    # finely is the engine's pace: real vLLM on CPU ~20 ms a token, vllm-sim 2.5 ms)
    out["bench: each answer's tokens arrive over time"] = str(bool(reqs) and all(
        len(r.token_times) > 1 and r.token_times[-1] - r.token_times[0] > 0 for r in reqs))
    return out
