"""What the program depends on, read out of a runner's observations (real vLLM or vllm-sim).

One function for both sides: tests/gpu_tier/test_fidelity.py runs the same runner against
vllm-sim playing the recorded version and asserts `facts(sim) == facts(real)`, fact by fact.
Every fact is compared exactly; where a fact is a bound instead (a time, or something this
simulator does not reproduce), the comment next to it says why and how tight it is. Timings
are kept apart (`timings`): they describe the hardware, not a behaviour the simulator must
match, except as the bounds the program's waits rely on (BOUNDS).

Each scenario is read from the runner part that ran it (`scenarios(obs, part)`), so both
sides are read in the same vLLM configuration: `serve` (--max-num-seqs 16, the qwen3 reasoning
parser, auto tool choice), `restart` (the defaults), `cache` (the compile-cache replacements).
Within a part, a later run replaces an earlier one scenario by scenario (runs in the order
they ran: the header's dates); the recorded file keeps superseded runs as history only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# Times the program's waits rely on, checked as upper bounds on both sides (a time is the
# hardware's, never equal on two machines):
# - health_503_after_kill_s: a killed rank's /health reads 503 this soon (real 0.35-0.38 s);
#   the runner's loop (a `docker inspect` per sample) takes up to ~0.8 s on a 2-core CPU
#   machine, so 1 s is the tightest bound both sides meet.
# - exit_after_kill_s: vLLM exits after a killed rank (real 2.4-3.2 s), before the program's
#   liveness read (which then says `exited (0)`, compared exactly).
# - exit_after_sigterm_s: `docker stop`'s grace before SIGKILL is 10 s; vLLM exits well
#   within it (real 0.61 s), so the remove never kills it.
BOUNDS = {"health_503_after_kill_s": 1.0, "exit_after_kill_s": 10.0, "exit_after_sigterm_s": 5.0}
PROGRAM_METRICS = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
                   "vllm:generation_tokens_total": "counter"}
# Where the runner put its machine directories on each side (runner.py's defaults are what
# the GPU machine ran with: lab/gpu/device.sh); the env of a rank names them.
RUNNER_PATHS = {"site": "/root/site", "vllm_cache": "/root/vllm-cache"}
# The runner's spec: the Ray port, --max-num-seqs of the serve part, the concurrent requests
# of its long queue (busy: a pool of 64 connections)
RAY_PORT = 6391
SERVE_MAX_NUM_SEQS = 16
BUSY_CONNECTIONS = 64
# the compile-cache part's four Ray-container replacements (runner.py cache_part)
CACHE_STARTS = ("cache_first_start", "cache_after_replacement", "nocache_first_start",
                "nocache_after_replacement")


def load(path: str | Path) -> dict[str, Any]:
    """A merged observations file: {"header": …, "runs": {run: {"scenarios": …}}}."""
    return json.loads(Path(path).read_text())


def scenarios(obs: dict[str, Any], part: str) -> dict[str, Any]:
    """The scenarios the runner's `part` recorded: every run of that part, oldest first (by
    the header's date, not the file's key order), a later run's scenario replacing an earlier
    one's (a later run re-ran what an earlier one got wrong, with the runner of its time)."""
    meta = obs.get("header", {}).get("runs", {})
    runs = [(name, data) for name, data in obs.get("runs", {}).items()
            if (meta.get(name) or {}).get("part") == part]
    runs.sort(key=lambda r: (meta[r[0]].get("date") or "", r[0]))
    merged: dict[str, Any] = {}
    for _, data in runs:
        merged.update(data.get("scenarios", {}))
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


def liveness(read: dict[str, Any] | None) -> list[Any]:
    """The liveness read's state line and what it saw (serving / busy / unknown): "running"
    alone cannot tell a canary answered in time (serving) from one held by a long queue while
    tokens flow (busy)."""
    read = read or {}
    return [read.get("state"), [line.split(":", 1)[0] for line in read.get("seen") or []]]


def _values(samples: list[dict[str, Any]], key: str) -> list[Any]:
    return sorted({x.get(key) for x in samples}, key=lambda v: (v is None, v))


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def frozen(prefix: str, fr: dict[str, Any], out: dict[str, Any]) -> None:
    """A rank stopped (SIGSTOP) with `load` requests sent 3 s before: every fact exact."""
    samples = fr.get("samples", [])
    out[f"{prefix}: /health"] = _values(samples, "health")
    # the gauges keep what the last finished step published: 0 idle, the requests in flight
    # under load (vLLM 0.26.0 read 0 while a request hung)
    out[f"{prefix}: num_requests_running"] = _values(samples, "num_requests_running")
    out[f"{prefix}: num_requests_waiting"] = _values(samples, "num_requests_waiting")
    out[f"{prefix}: generation_tokens_total moves"] = len(
        {x.get("generation_tokens_total") for x in samples}) > 1
    out[f"{prefix}: the canary gets a first token"] = (
        fr.get("canary_while_frozen", {}).get("first_token_s") is not None)
    out[f"{prefix}: liveness"] = liveness(fr.get("liveness_while_frozen"))
    out[f"{prefix}: serves again after SIGCONT"] = (
        fr.get("canary_after_sigcont", {}).get("first_token_s") is not None)
    out[f"{prefix}: every request answered after SIGCONT"] = fr.get("load_answered") == fr.get(
        "load")


def _compile_line(log: list[str]) -> str | None:
    """vLLM's torch.compile outcome: compiled, or loaded from the compile cache."""
    for line in log:
        m = re.search(r"Compiling a graph for compile range (\(\d+, \d+\))", line)
        if m:
            return f"compiled {m.group(1)}"
        m = re.search(r"Directly load the compiled graph\(s\) for compile range (\(\d+, \d+\)) "
                      r"from the cache", line)
        if m:
            return f"loaded {m.group(1)}"
    return None


def _cache_dir(log: list[str]) -> tuple[str | None, str | None]:
    """The rank's compile cache dir with its hash masked (the hash covers vLLM's code and the
    machine's compiler: never the same for the simulator), and the hash."""
    for line in log:
        m = re.search(r"Using cache directory: (\S+) for vLLM's torch\.compile", line)
        if m:
            parts = m.group(1).split("/")
            i = parts.index("torch_compile_cache") + 1 if "torch_compile_cache" in parts else 0
            if 0 < i < len(parts):
                key, parts[i] = parts[i], "<hash>"
                return "/".join(parts), key
            return m.group(1), None
    return None, None


def _head_cache_line(start: dict[str, Any]) -> tuple[list[str], list[int], list[int]]:
    """The head's `compile cache DIR: N KiB (M compiled rank dirs)` lines, with N and M
    masked; N and M apart."""
    lines, kib, dirs = [], [], []
    for _, line in start.get("head", {}).get("cache_lines", []):
        m = re.search(r"(\d+) KiB \((\d+) compiled rank dirs\)", line)
        if m:
            kib.append(int(m.group(1)))
            dirs.append(int(m.group(2)))
        lines.append(re.sub(r"\d+ KiB \(\d+ compiled", "<n> KiB (<m> compiled",
                            line.split("] ", 1)[-1]))
    return lines, kib, dirs


def compile_cache_facts(c: dict[str, Any], out: dict[str, Any]) -> None:
    """The program's compileCache across Ray-container replacements (runner.py cache_part):
    with it, the replacement loads what the first start compiled; without it (the caches in
    the containers), every replacement compiles again."""
    keys: dict[str, str | None] = {}
    for name in CACHE_STARTS:
        start = c.get(name, {})
        p = f"compile cache, {name}"
        out[f"{p}: vLLM's start exits"] = start.get("rc")
        out[f"{p}: its smoke request is answered"] = any(
            "smoke request answered" in line for _, line in start.get("stderr", []))
        out[f"{p}: torch.compile"] = _compile_line(start.get("log", []))
        out[f"{p}: the rank's cache dir"], keys[name] = _cache_dir(start.get("log", []))
        lines, kib, dirs = _head_cache_line(start)
        out[f"{p}: the head's compile-cache line"] = lines
        # A bound: how many rank dirs, not the count. vLLM 0.26.0 keeps two per rank (the
        # backbone's graph dir and torch_aot_compile/<hash>/rank_0_0, its AOT artefact: the
        # real head saw 2 with one rank); vllm-sim writes the backbone's only (1). Exact
        # where it matters to the program: none before a first start, some after it.
        out[f"{p}: compiled rank dirs in the node's cache before the start"] = [
            "none" if n == 0 else "some" for n in dirs]
        # the node dir's size after the start (du -sk), against the head's line before it:
        # grown after a compile into it, the same after a load from it; no dir without it
        after = start.get("cache_kib")
        out[f"{p}: the node's cache after the start"] = (
            None if after is None else "no head line" if not kib
            else "grown" if after > kib[0] else "unchanged" if after == kib[0] else "shrunk")
    out["compile cache: the replacement reads the first start's cache dir (same hash)"] = (
        keys["cache_first_start"] is not None
        and keys["cache_first_start"] == keys["cache_after_replacement"])
    out["compile cache, none: the replacement's cache dir has the same hash"] = (
        keys["nocache_first_start"] is not None
        and keys["nocache_first_start"] == keys["nocache_after_replacement"])


def facts(obs: dict[str, Any], site: str = RUNNER_PATHS["site"],
          vllm_cache: str = RUNNER_PATHS["vllm_cache"]) -> dict[str, Any]:
    """Every fact, keyed "group: fact" (the test reports the groups apart). `site` and
    `vllm_cache`: the runner's --site and --vllm-cache on this side."""
    s = scenarios(obs, "serve")
    r = scenarios(obs, "restart")
    identity = obs["header"]["identity_ip"]
    out: dict[str, Any] = {}
    out["serve: the program's vLLM start exits"] = s["serve_cold"]["rc"]
    out["serve: its smoke request is answered"] = any(
        "smoke request answered" in line for _, line in s["serve_cold"]["stderr"])
    out["serve: the gate exits"] = s["gate"]["rc"]
    out["serve: staging (copy) exits"] = s["stage"]["rc"]
    out["serve: probe modes exit"] = {m: x["rc"] for m, x in sorted(s["probe_modes"].items())
                                      if isinstance(x, dict)}
    for route, codes in sorted(s["routes"].items()):
        if route == "scenario_seconds":
            continue
        out[f"routes: {route} without the key"] = codes["no_key"]
        # the status itself, not "not 401": a 500 or a missing route passes auth too
        out[f"routes: {route} with the key"] = codes["with_key"]
    for name in ("reasoning", "reasoning_off"):
        out[f"chat: {name}"] = message_kind(s[name])
    out["chat: named tool_choice (reasoning parser on)"] = message_kind(s["tool_call"]["named"])
    names = s["metric_names"]
    for metric in PROGRAM_METRICS:
        entry = names.get(metric, {})
        out[f"metrics: {metric}"] = (entry.get("type"), entry.get("labels"))

    out["liveness: while serving"] = liveness(s["liveness_serving"])
    b = s["busy_queue"]
    busy = b.get("samples", [])
    # a long queue (300 requests of 1500 tokens through the runner's 64 connections, with
    # --max-num-seqs 16): the canary waits behind 4 batches while tokens flow, so the liveness
    # read sees busy, not serving (vLLM 0.26.0: "the canary waited 10 s; 84384 tokens ...")
    out["liveness: a long queue"] = liveness(b.get("liveness_while_busy"))
    out["busy: the canary streams a first token"] = (
        b.get("canary", {}).get("first_token_s") is not None)
    # the scheduler's cap: never more than --max-num-seqs run at once, and the cap is reached
    out["busy: most requests running at once"] = max(
        (x.get("num_requests_running", 0) for x in busy), default=None)
    # what waits while the queue is full: the connections the cap leaves out (64 - 16 = 48).
    # The median sample: one sample may fall between a batch's answers and the connections'
    # next sends (fewer), or count a canary (one more); most read the full queue.
    out["busy: requests waiting while the queue is full (median sample)"] = _median(
        [x["num_requests_waiting"] for x in busy if "num_requests_waiting" in x])

    frozen("frozen idle", s["frozen_idle"], out)
    # the rank frozen with 16 requests in flight, in the serve part's configuration on both
    # sides (the restart part's frozen_loaded, with vLLM's defaults, is another scenario:
    # recorded by an older runner, whose liveness read had no wedge rule yet)
    frozen("frozen under load", s["frozen_loaded"], out)
    # 64 requests in flight: the load part's on the GPU (--max-model-len 4096, 4000 tokens
    # each); the runner runs it in the restart part on the CPU (2048, 1900 tokens), to save
    # an engine start. Either way all 64 run at once (vLLM's default --max-num-seqs) and the
    # facts read the gauges, /health, the canary and the answers, none of which depends on
    # the length.
    fi = scenarios(obs, "load").get("frozen_inflight") or r["frozen_inflight"]
    running = {x.get("num_requests_running") for x in fi["samples"]}
    # A bound: the value is how many of the 64 had reached the engine when the rank stopped
    # (62 half a second before, 64 at the stop, on the GPU); the fact the program relies on
    # is that the gauge stays at that one value, and that it is not 0.
    out["frozen in flight: num_requests_running stays at one value > 0"] = (
        len(running) == 1 and (next(iter(running)) or 0) > 0)
    out["frozen in flight: num_requests_waiting"] = _values(fi["samples"],
                                                            "num_requests_waiting")
    out["frozen in flight: generation_tokens_total moves"] = len(
        {x.get("generation_tokens_total") for x in fi["samples"]}) > 1
    out["frozen in flight: /health"] = _values(fi["samples"], "health")
    out["frozen in flight: the canary gets a first token"] = (
        fi["canary_while_frozen"].get("first_token_s") is not None)
    out["frozen in flight: every request answered after SIGCONT"] = (
        fi["load_answered"] == fi["load"])

    k = s["rank_killed"]
    first_503 = next((t for t, code, _ in k["health_and_state"] if code == 503), None)
    exited = next((t for t, _, st in k["health_and_state"] if st.startswith("exited")), None)
    # soon: within the bound, or already at the first read after the kill (a runner slowed by
    # a busy machine takes its first sample late; a 503 there is as soon as it can see)
    first_read = k["health_and_state"][0][1] if k["health_and_state"] else None
    out["killed rank: /health 503 soon"] = (first_503 is not None and (
        first_503 <= BOUNDS["health_503_after_kill_s"] or first_read == 503))
    out["killed rank: vLLM exits soon"] = (exited is not None
                                          and exited <= BOUNDS["exit_after_kill_s"])
    # what /health answered from the first 503 on (503, then no server), in order
    codes = [code for t, code, _ in k["health_and_state"]
             if first_503 is not None and t >= first_503]
    out["killed rank: /health from the first 503 on"] = [
        c for i, c in enumerate(codes) if i == 0 or codes[i - 1] != c]
    out["killed rank: exit state"] = k["final"][1]
    out["killed rank: liveness after"] = k["liveness_after"]
    t = r["sigterm"]
    out["SIGTERM: exit state"] = t["state"]
    out["SIGTERM: exits soon"] = (t["exited_after_s"] is not None
                                  and t["exited_after_s"] <= BOUNDS["exit_after_sigterm_s"])
    out["restart: vLLM's start after a head replacement exits"] = r["serve_cache_kept"]["rc"]
    out["restart: an fp8 KV cache start exits"] = r["kv_fp8_util03"]["rc"]
    tp2 = r["tp2_one_gpu"]
    out["TP 2 on one GPU: the program's start exits"] = tp2["rc"]
    out["TP 2 on one GPU: as a placement group Ray cannot place"] = any(
        "placement group that Ray cannot place" in line for _, line in tp2["stderr"])
    out["VLLM_HOST_IP not on the machine: the start exits"] = r["host_ip_not_local"]["rc"]
    out["parser: parsed"] = r["parser"].get("parsed")
    out["parser: CLI exit for --disable-log-requests"] = r["parser"][
        "cli --disable-log-requests"]["exit"]
    out["parser: CLI exit for an unknown flag"] = r["parser"]["cli --no-such-flag"]["exit"]

    # every key the env probe records, read inside the rank once vLLM set its env; the
    # runner's machine paths and the identity masked (they are the machine's, not vLLM's)
    masks = [(site, "<site>"), (vllm_cache, "<vllm-cache>"), (identity, "<identity>")]
    rank = rank_env(s["rank_env"])
    if rank is None:
        out["rank env"] = "no rank process seen by the env probe"
    else:
        for key, value in sorted(rank.items()):
            if isinstance(value, str):
                for path, name in masks:
                    value = value.replace(path, name)
            out[f"rank env: {key}"] = value

    compile_cache_facts(scenarios(obs, "cache"), out)
    return out


def rank_env(scenario: dict[str, Any]) -> dict[str, Any] | None:
    """The rank's env as its process saw it once vLLM set it: the env probe's entry for the
    rank's Ray actor (lab/gpu/envprobe, a vLLM general plugin: real vLLM and vllm-sim load it
    in the rank alike). None when the probe saw no rank."""
    for p in scenario.get("processes", []):
        if p.get("actor"):
            return dict(p["env"])
    return None


def timings(obs: dict[str, Any]) -> dict[str, Any]:
    """Seconds, per run: what the hardware did (not compared with the simulator)."""
    rows: dict[str, Any] = {}
    for run, data in obs.get("runs", {}).items():
        sc = data.get("scenarios", {})
        for name in ("head_start", "head_start_again", "gate", "serve_cold", "serve_cache_kept",
                     "tp2_one_gpu", "host_ip_not_local", *CACHE_STARTS):
            if name in sc and "seconds" in sc[name]:
                rows[f"{run}/{name}"] = sc[name]["seconds"]
        for name in ("serve_cold", "serve_cache_kept", *CACHE_STARTS):
            for line in sc.get(name, {}).get("log", []):
                if "init engine" in line:
                    rows[f"{run}/{name} engine init"] = line.split("took ")[-1]
    return rows
