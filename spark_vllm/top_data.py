"""What `spark-vllm top` shows, read without changing anything: `spark-vllm status`'s report
(each container's state, Ray's node table, vLLM's verdict: serving / busy / wedged / dead, the
endpoint), each node's GPU memory (nvidia-smi's, or /proc/meminfo's on GB10's unified memory:
components/node_memory.py), vLLM's `/metrics` through the endpoint (behind the API key) as
rates between two reads, the fabric check's last verdict from the stack's outputs, and the last
repairs `spark-vllm status --watch` made from this machine. A stack with several models
(`models:`) is read per model: each model's verdict, and its own vLLM's `/metrics` at its own
endpoint (the stack's endpoint is the gateway, whose LiteLLM has no vLLM metrics).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .components import node_memory, ssh
from .status_report import Report, collect, node_target

# vLLM's metric names (vllm/v1/metrics/loggers.py), summed over their label sets
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
REPAIRS_DIR = Path.home() / ".spark-vllm" / "repairs"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition: every sample of the wanted names, summed per name."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in GAUGES + COUNTERS:
            continue
        try:
            value = float(line.rsplit("}", 1)[-1].split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass
class Metrics:
    at: float  # monotonic
    values: dict[str, float]


def rates(prev: Metrics | None, cur: Metrics | None) -> dict[str, float | None]:
    """Prompt and generation tokens/s between two reads (None until there are two, or after a
    counter went back: vLLM restarted)."""
    out: dict[str, float | None] = {"prompt": None, "generation": None}
    if prev is None or cur is None or cur.at <= prev.at:
        return out
    for key, name in (("prompt", COUNTERS[0]), ("generation", COUNTERS[1])):
        if name in cur.values and name in prev.values and cur.values[name] >= prev.values[name]:
            out[key] = (cur.values[name] - prev.values[name]) / (cur.at - prev.at)
    return out


def read_metrics(endpoint: str, api_key: str | None, timeout: float = 5) -> Metrics:
    """GET <endpoint without /v1>/metrics with the API key; raises OSError with why."""
    url = endpoint.rstrip("/").removesuffix("/v1") + "/metrics"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"}
                                 if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (the stack's)
            return Metrics(time.monotonic(), parse_metrics(resp.read().decode(errors="replace")))
    except urllib.error.HTTPError as err:
        raise OSError(f"HTTP {err.code} from {url}") from None
    except (urllib.error.URLError, TimeoutError) as err:
        raise OSError(f"{url}: {getattr(err, 'reason', err)}") from None


def node_memory_of(node: dict[str, Any], key: str) -> str:
    try:
        proc = ssh.run(node_target(node, key), node_memory.SCRIPT, timeout=20)
    except ssh.NodeUnreachableError:
        return "unreachable"
    gpus = node_memory.parse(proc.stdout)
    if gpus is None:
        return "no nvidia-smi"
    if not gpus:
        return "unknown"
    return ", ".join(f"{(g.total_mib - g.free_mib) / 1024:.1f}/{g.total_mib / 1024:.1f} GiB"
                     f"{' (unified)' if g.source == 'meminfo' else ''}" for g in gpus)


def record_repair(stack: str, what: str, result: str) -> None:
    """One line per repair of `status --watch` (read back by `top`)."""
    REPAIRS_DIR.mkdir(parents=True, exist_ok=True)
    with open(REPAIRS_DIR / f"{stack}.jsonl", "a") as f:
        f.write(json.dumps({"at": time.strftime("%F %T"), "what": what, "result": result})
                + "\n")


def last_repairs(stack: str, n: int = 3) -> list[dict[str, str]]:
    try:
        lines = (REPAIRS_DIR / f"{stack}.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines[-n:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@dataclass
class Snapshot:
    stack: str
    at: str  # wall clock, for the screen
    report: Report | None = None
    problem: str = ""  # why there is no report
    memory: dict[str, str] = field(default_factory=dict)
    metrics: Metrics | None = None
    metrics_problem: str = ""
    rates: dict[str, float | None] = field(default_factory=dict)
    fabric: str = ""
    repairs: list[dict[str, str]] = field(default_factory=list)
    models: dict[str, ModelRead] = field(default_factory=dict)  # several models: each one's


@dataclass
class ModelRead:
    """One served model's reading (several models): its own vLLM's metrics and their rates."""

    metrics: Metrics | None = None
    problem: str = ""
    rates: dict[str, float | None] = field(default_factory=dict)


def _metrics_or_why(future: Any) -> tuple[Metrics | None, str]:
    try:
        return future.result(), ""
    except OSError as err:
        return None, str(err)


def fabric_verdict(outputs: dict[str, Any]) -> str:
    summary = outputs.get("fabric")
    if not isinstance(summary, dict):
        return "no check recorded"
    outcome = summary.get("outcome") or "unknown"
    when = summary.get("checkedAt") or ""
    message = " ".join(str(summary.get("message") or "").split())
    if len(message) > 100:
        message = message[:99].rsplit(" ", 1)[0] + " …"
    return f"{outcome}{f' ({when})' if when else ''}{f': {message}' if message else ''}"


def snapshot(stack: Any, api_key: str | None, previous: Snapshot | None) -> Snapshot:
    """Everything on the screen, read once (the nodes in parallel). Never raises for a node or
    the metrics: each says why it could not be read."""
    snap = Snapshot(stack.name, time.strftime("%T"))
    try:
        report = collect(stack)
    except Exception as err:  # noqa: BLE001 - the screen says it, and the next refresh retries
        snap.problem = f"{type(err).__name__}: {err}"
        return snap
    snap.report = report
    try:
        outputs = {k: v.value for k, v in stack.outputs().items()}
        snap.fabric = fabric_verdict(outputs)
    except Exception as err:  # noqa: BLE001
        snap.fabric = f"unknown ({err})"
    with ThreadPoolExecutor(max_workers=len(report.nodes) + 1 + len(report.models)) as pool:
        memory = {n["name"]: pool.submit(node_memory_of, n, report.key)
                  for n in report.nodes if n["name"] not in report.unreachable}
        per_model = {m.key: pool.submit(read_metrics, m.endpoint, api_key)
                     for m in report.models}
        metrics = None if report.models else pool.submit(read_metrics, report.endpoint, api_key)
        for name in (n["name"] for n in report.nodes):
            snap.memory[name] = memory[name].result() if name in memory else "unreachable"
        if metrics is not None:
            snap.metrics, snap.metrics_problem = _metrics_or_why(metrics)
        for key, future in per_model.items():
            got, why = _metrics_or_why(future)
            before = previous.models.get(key) if previous else None
            snap.models[key] = ModelRead(got, why, rates(before.metrics if before else None, got))
    snap.rates = rates(previous.metrics if previous else None, snap.metrics)
    snap.repairs = last_repairs(stack.name)
    return snap


def render(snap: Snapshot) -> list[str]:
    """The screen as lines of plain text."""
    lines = [f"spark-vllm top: stack {snap.stack}   {snap.at}   (q quit, l logs, r refresh)"]
    if snap.report is None:
        return [*lines, "", f"cannot read the stack: {snap.problem}"]
    r = snap.report
    verdict = r.vllm_state.upper() if r.vllm_state else "UNKNOWN"
    lines += [f"vLLM {verdict}: {r.vllm}" if r.vllm else f"vLLM {verdict}",
              f"endpoint {r.endpoint}: {'ok' if r.endpoint_ok else r.endpoint_check}",
              f"fabric: {snap.fabric}", ""]
    width = max([12, *(len(c.role) + 1 for c in r.containers)])  # "big/vllm-leader" with several
    for node in r.nodes:
        name = node["name"]
        if name in r.unreachable:
            lines.append(f"{name}  UNREACHABLE: {r.unreachable[name]}")
            continue
        ray = r.ray.get(name, "")
        lines.append(f"{name}  {node.get('identityIp', node['host'])}  memory "
                     f"{snap.memory.get(name, '?')}{f'  Ray: {ray}' if ray else ''}")
        for c in (c for c in r.containers if c.node == name):
            lines.append(f"    {c.role:<{width}} {c.describe()}")
    lines.append("")
    if r.models:
        for m in r.models:
            read = snap.models.get(m.key, ModelRead(problem="not read"))
            lines.append(f"model {m.key} ({m.served}) on {', '.join(m.nodes)}: "
                         f"{m.state.upper()}{f': {m.seen}' if m.seen and not m.ok else ''}")
            lines += ["    " + ln for ln in serving_lines(read.metrics, read.problem, read.rates)]
    else:
        lines += serving_lines(snap.metrics, snap.metrics_problem, snap.rates)
    if snap.repairs:
        lines.append("last repairs (status --watch): " + "; ".join(
            f"{x.get('at')} {x.get('what')}: {x.get('result')}" for x in snap.repairs))
    return lines


def serving_lines(metrics: Metrics | None, problem: str,
                  rate_of: dict[str, float | None]) -> list[str]:
    """One vLLM's requests, KV cache and tokens/s, or why its metrics could not be read."""
    if metrics is None:
        return [f"metrics: unreachable ({problem})"]
    v = metrics.values
    kv = v.get("vllm:kv_cache_usage_perc")

    def rate(x: float | None) -> str:
        return "…" if x is None else f"{x:.1f}"
    return [f"requests: {v.get('vllm:num_requests_running', 0):.0f} running, "
            f"{v.get('vllm:num_requests_waiting', 0):.0f} waiting   KV cache: "
            + (f"{kv * 100:.1f} %" if kv is not None else "?"),
            f"tokens/s: prompt {rate(rate_of.get('prompt'))}, generation "
            f"{rate(rate_of.get('generation'))}"]
