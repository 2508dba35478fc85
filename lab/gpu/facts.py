"""What the program depends on, read out of a runner's observations (real vLLM or vllm-sim).

One function for both sides: tests/gpu_tier/test_fidelity.py runs the same runner against
vllm-sim playing the recorded version and asserts `facts(sim) == facts(real)`. Timings are
kept apart (`timings`): they describe the hardware, not a behaviour the simulator must match,
except as bounds the program's waits rely on (BOUNDS).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Bounds the program relies on, checked on both sides: e.g. the liveness read must see a
# killed rank as dead soon after vLLM notices.
BOUNDS = {"health_503_after_kill_s": 1.0, "exit_after_kill_s": 10.0, "exit_after_sigterm_s": 5.0}
PROGRAM_METRICS = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
                   "vllm:generation_tokens_total": "counter"}


def load(path: str | Path) -> dict[str, Any]:
    """A merged observations file: {"header": …, "runs": {run: {"scenarios": …}}}."""
    return json.loads(Path(path).read_text())


def scenarios(obs: dict[str, Any]) -> dict[str, Any]:
    """Every run's scenarios in one mapping; a later run's wins (runs are recorded in order,
    and a later one re-ran what an earlier one got wrong)."""
    merged: dict[str, Any] = {}
    for run in obs.get("runs", {"only": obs}).values():
        merged.update(run.get("scenarios", {}))
    return merged


def message_kind(resp: dict[str, Any]) -> str:
    """A chat completion's shape: content null / empty / text, plus reasoning and tool calls."""
    if resp.get("status") != 200:
        return f"http {resp.get('status')}"
    msg = resp["json"]["choices"][0]["message"]
    content = msg.get("content")
    kind = "content null" if content is None else "content empty" if content == "" else "text"
    if msg.get("reasoning") or msg.get("reasoning_content"):
        kind += " + reasoning"
    if msg.get("tool_calls"):
        kind += " + tool_calls"
    return kind


def facts(obs: dict[str, Any]) -> dict[str, Any]:
    s = scenarios(obs)
    out: dict[str, Any] = {}
    out["serve: the program's vLLM command succeeds"] = s["serve_cold"]["rc"] == 0
    out["serve: its smoke request is answered"] = any(
        "smoke request answered" in line for _, line in s["serve_cold"]["stderr"])
    out["gate passes"] = s["gate"]["rc"] == 0
    out["staging (copy) passes"] = s["stage"]["rc"] == 0
    out["liveness while serving"] = s["liveness_serving"]["state"]
    out["probe modes exit"] = {m: r["rc"] for m, r in sorted(s["probe_modes"].items())
                                if isinstance(r, dict)}
    for route, codes in sorted(s["routes"].items()):
        if route == "scenario_seconds":
            continue
        out[f"route {route}: without the key"] = codes["no_key"]
        out[f"route {route}: the key passes auth"] = codes["with_key"] != 401
    for name in ("reasoning", "reasoning_off"):
        out[f"chat {name}"] = message_kind(s[name])
    out["chat named tool_choice (reasoning parser on)"] = message_kind(s["tool_call"]["named"])
    names = s["metric_names"]
    for metric in PROGRAM_METRICS:
        entry = names.get(metric, {})
        out[f"metric {metric}"] = (entry.get("type"),
                                   sorted({"engine", "model_name"} & set(entry.get("labels", []))))
    busy = s["busy_queue"]["samples"]
    out["busy: requests running"] = any(x.get("num_requests_running", 0) > 0 for x in busy)
    out["busy: the canary streams a first token"] = (
        s["busy_queue"]["canary"].get("first_token_s") is not None)
    if "liveness_while_busy" in s["busy_queue"]:  # the canary + token-counter check
        # a long queue is never wedged: "running" (busy or serving: which of the two depends
        # on how long the queue holds the canary against its bound, i.e. on the hardware)
        out["busy: liveness state"] = s["busy_queue"]["liveness_while_busy"]["state"]
        out["busy: requests wait"] = any(x.get("num_requests_waiting", 0) > 0 for x in busy)
        out["liveness while serving: the canary's token came"] = any(
            x.startswith("serving:") for x in s["liveness_serving"].get("seen", []))
    fr = s["frozen_idle"]
    out["frozen: /health"] = sorted({x["health"] for x in fr["samples"]})
    out["frozen: num_requests_running"] = sorted({x.get("num_requests_running")
                                                  for x in fr["samples"]})
    out["frozen: generation_tokens_total moves"] = len(
        {x.get("generation_tokens_total") for x in fr["samples"]}) > 1
    out["frozen: the canary gets a first token"] = (
        fr["canary_while_frozen"].get("first_token_s") is not None)
    out["frozen: liveness state"] = fr["liveness_while_frozen"]["state"]
    out["frozen under load: liveness state"] = (
        s["frozen_loaded"]["liveness_while_frozen"]["state"])
    out["frozen: serves again after SIGCONT"] = (
        fr["canary_after_sigcont"].get("first_token_s") is not None)
    if "frozen_inflight" in s:  # requests in flight: the gauges stay at their last value
        fi = s["frozen_inflight"]
        running = {x.get("num_requests_running") for x in fi["samples"]}
        out["frozen in flight: num_requests_running stays at one value > 0"] = (
            len(running) == 1 and next(iter(running)) > 0)
        out["frozen in flight: generation_tokens_total moves"] = len(
            {x.get("generation_tokens_total") for x in fi["samples"]}) > 1
        out["frozen in flight: /health"] = sorted({x["health"] for x in fi["samples"]})
        out["frozen in flight: the canary gets a first token"] = (
            fi["canary_while_frozen"].get("first_token_s") is not None)
        out["frozen in flight: every request answered after SIGCONT"] = (
            fi["load_answered"] == fi["load"])
    k = s["rank_killed"]
    first_503 = next((t for t, code, _ in k["health_and_state"] if code == 503), None)
    exited = next((t for t, _, st in k["health_and_state"] if st.startswith("exited")), None)
    out["killed rank: /health 503 soon"] = (first_503 is not None
                                           and first_503 <= BOUNDS["health_503_after_kill_s"])
    out["killed rank: vLLM exits soon"] = (exited is not None
                                          and exited <= BOUNDS["exit_after_kill_s"])
    out["killed rank: exit state"] = k["final"][1]
    out["killed rank: liveness after"] = k["liveness_after"]
    t = s["sigterm"]
    out["SIGTERM: exit state"] = t["state"]
    out["SIGTERM: exits soon"] = (t["exited_after_s"] is not None
                                  and t["exited_after_s"] <= BOUNDS["exit_after_sigterm_s"])
    tp2 = s["tp2_one_gpu"]
    out["TP 2 on one GPU: the program refuses it"] = tp2["rc"] != 0
    out["TP 2 on one GPU: as a placement group Ray cannot place"] = any(
        "placement group that Ray cannot place" in line for _, line in tp2["stderr"])
    out["VLLM_HOST_IP not on the machine: serves"] = s["host_ip_not_local"]["rc"] == 0
    out["parser"] = s["parser"].get("parsed")
    out["parser: CLI exit for --disable-log-requests"] = s["parser"][
        "cli --disable-log-requests"]["exit"]
    out["parser: CLI exit for an unknown flag"] = s["parser"]["cli --no-such-flag"]["exit"]
    rank = rank_env(s["rank_env"])
    for key in ("VLLM_API_KEY", "NCCL_SOCKET_IFNAME", "VLLM_RPC_BASE_PATH"):
        out[f"rank env {key}"] = rank.get(key)
    out["rank env HF_TOKEN present"] = rank.get("HF_TOKEN") is not None
    out["rank env VLLM_HOST_IP is the identity"] = rank.get("VLLM_HOST_IP") == obs["header"][
        "identity_ip"]
    return out


def rank_env(scenario: dict[str, Any]) -> dict[str, Any]:
    """The rank's env as its process saw it once vLLM set it: the env probe's actor entry
    (real vLLM), else vllm-sim's own report (/sim/ranks)."""
    for p in scenario.get("processes", []):
        if p.get("actor"):
            return p["env"]
    for r in scenario.get("sim_ranks", []):
        env = r.get("env", {})
        return {k: (v.get("value") if "value" in v else ("<set>" if v.get("present") else None))
                for k, v in env.items()}
    return {}


def timings(obs: dict[str, Any]) -> dict[str, Any]:
    """Seconds, per run: what the hardware did (not compared with the simulator)."""
    rows: dict[str, Any] = {}
    for run, data in obs.get("runs", {}).items():
        sc = data.get("scenarios", {})
        for name in ("head_start", "head_start_again", "gate", "serve_cold", "serve_cache_kept",
                     "tp2_one_gpu", "host_ip_not_local"):
            if name in sc and "seconds" in sc[name]:
                rows[f"{run}/{name}"] = sc[name]["seconds"]
        for name in ("serve_cold", "serve_cache_kept"):
            for line in sc.get(name, {}).get("log", []):
                if "init engine" in line:
                    rows[f"{run}/{name} engine init"] = line.split("took ")[-1]
    return rows
