"""The serving benchmark's figures, its comparison with the stack's baseline, and its outputs
(JSON, Markdown, a PNG chart).

Per concurrency level, from every request llama-benchy made (bench_load.py):
- output tok/s: the tokens of a batch over the batch's wall time (first start to last end),
  the median over the batches;
- requests/s: the batch's requests over the same wall time, the median;
- TTFT: each request's time to its first token, p50 and p99 over every request;
- ITL: each request's time from its first token to its last over the tokens after the first
  ((end - first token) / (tokens - 1): guidellm's inter-token latency, vLLM's TPOT), p50 and
  p99 over the requests. Gaps between single chunks are not used: a client reading a fast
  stream gets several chunks in one read, with one arrival time;
- errors: requests that failed.
A figure worse than the baseline's by more than the profile's margin is a regression, named
with both figures and with what changed in the stack since the baseline.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bench_load import Profile, Request

# (key, label, unit, higher is better)
FIGURES = (("outputTokensPerS", "output", "tok/s", True),
           ("requestsPerS", "requests", "req/s", True),
           ("ttftP50Ms", "TTFT p50", "ms", False), ("ttftP99Ms", "TTFT p99", "ms", False),
           ("itlP50Ms", "ITL p50", "ms", False), ("itlP99Ms", "ITL p99", "ms", False))
COMPARED = ("outputTokensPerS", "requestsPerS", "ttftP50Ms", "itlP50Ms")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def figures(requests: Iterable[Request]) -> dict[int, dict[str, float]]:
    """{concurrency: {figure: value}} from the recorded requests."""
    by_level: dict[int, list[Request]] = {}
    for r in requests:
        by_level.setdefault(r.concurrency, []).append(r)
    out: dict[int, dict[str, float]] = {}
    for level, reqs in sorted(by_level.items()):
        batches: dict[int, list[Request]] = {}
        for r in reqs:
            batches.setdefault(r.batch, []).append(r)
        tok_s, req_s = [], []
        for batch in batches.values():
            ok = [r for r in batch if not r.error]
            wall = max(r.end for r in batch) - min(r.start for r in batch)
            if ok and wall > 0:
                tok_s.append(sum(r.tokens for r in ok) / wall)
                req_s.append(len(ok) / wall)
        good = [r for r in reqs if not r.error and r.first_token is not None]
        ttft = [(r.first_token or r.start) - r.start for r in good]
        itl = [(r.end - (r.first_token or r.start)) / (r.tokens - 1) for r in good
               if r.tokens > 1]
        out[level] = {
            "outputTokensPerS": statistics.median(tok_s) if tok_s else 0.0,
            "requestsPerS": statistics.median(req_s) if req_s else 0.0,
            "ttftP50Ms": percentile(ttft, 50) * 1000, "ttftP99Ms": percentile(ttft, 99) * 1000,
            "itlP50Ms": percentile(itl, 50) * 1000, "itlP99Ms": percentile(itl, 99) * 1000,
            "requests": float(len(reqs)), "errors": float(len(reqs) - len(good)),
        }
    return out


@dataclass(frozen=True)
class Regression:
    concurrency: int
    figure: str
    baseline: float
    now: float

    def text(self) -> str:
        label, unit = next((lb, u) for k, lb, u, _ in FIGURES if k == self.figure) \
            if self.figure != "errors" else ("errors", "")
        change = (self.now - self.baseline) / self.baseline * 100 if self.baseline else 0.0
        return (f"concurrency {self.concurrency}: {label} {self.baseline:.1f} → {self.now:.1f}"
                f"{' ' + unit if unit else ''}" + (f" ({change:+.0f} %)" if self.baseline else ""))


def regressions(baseline: dict[str, Any], now: dict[str, Any], profile: Profile) -> list[Regression]:
    """Each figure of `now` worse than `baseline`'s by more than the profile's margin, and any
    new errors, at every concurrency level both ran."""
    found = []
    for level, was in baseline["figures"].items():
        cur = now["figures"].get(level)
        if cur is None:
            continue
        for key, _, _, higher_better in FIGURES:
            if key not in COMPARED or not was.get(key):
                continue
            if higher_better and cur[key] < was[key] * (1 - profile.throughput_drop):
                found.append(Regression(int(level), key, was[key], cur[key]))
            if not higher_better and cur[key] > was[key] * (1 + profile.latency_rise):
                found.append(Regression(int(level), key, was[key], cur[key]))
        if cur.get("errors", 0) > was.get("errors", 0):
            found.append(Regression(int(level), "errors", was.get("errors", 0), cur["errors"]))
    return found


def changes(baseline: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two deployment snapshots (bench.deployment): the image, each
    config key, each env name (values are kept as digests, never shown)."""
    out = []
    was_img, now_img = baseline.get("image") or {}, now.get("image") or {}
    if (was_img.get("name"), was_img.get("id")) != (now_img.get("name"), now_img.get("id")):
        out.append(f"image {was_img.get('name')} ({str(was_img.get('id', ''))[:19]}) → "
                   f"{now_img.get('name')} ({str(now_img.get('id', ''))[:19]})")
    was_cfg, now_cfg = baseline.get("config") or {}, now.get("config") or {}
    for key in sorted(set(was_cfg) | set(now_cfg)):
        if key == "env":
            was_env, now_env = was_cfg.get("env") or {}, now_cfg.get("env") or {}
            for name in sorted(set(was_env) | set(now_env)):
                if was_env.get(name) != now_env.get(name):
                    what = ("added" if name not in was_env else
                            "removed" if name not in now_env else "changed")
                    out.append(f"env {name} {what}")
        elif was_cfg.get(key) != now_cfg.get(key):
            out.append(f"{key}: {_short(was_cfg.get(key))} → {_short(now_cfg.get(key))}")
    return out


def _short(v: Any) -> str:
    text = "unset" if v is None else str(v)
    return text if len(text) <= 80 else text[:77] + "..."


def markdown(run: dict[str, Any], baseline: dict[str, Any] | None,
             found: list[Regression], changed: list[str]) -> str:
    lines = [f"# spark-vllm bench: stack {run['stack']}, {run['when']}", "",
             f"Endpoint {run['endpoint']}, model {run['model']}; profile {run['profileText']}; "
             f"load by llama-benchy {run['llamaBenchy']}.", ""]
    head = "| concurrency | " + " | ".join(f"{lb} ({u})" for _, lb, u, _ in FIGURES) + \
        " | errors |"
    lines += [head, "|" + "---|" * (len(FIGURES) + 2)]
    for level, f in run["figures"].items():
        cells = []
        for key, _, _, _ in FIGURES:
            cell = f"{f[key]:.1f}"
            if baseline and (was := baseline["figures"].get(level)):
                cell += f" ({was[key]:.1f})"
            cells.append(cell)
        lines.append(f"| {level} | " + " | ".join(cells) + f" | {int(f['errors'])} |")
    lines.append("")
    if baseline is None:
        lines.append("Baseline: this run (the stack's first good run).")
    else:
        lines.append(f"In parentheses: the baseline, {baseline['when']}.")
        lines.append("")
        lines += ["**Regressions:**", *[f"- {r.text()}" for r in found]] if found else \
            ["No regression against the baseline."]
        lines += ["", "**Changed since the baseline:**",
                  *[f"- {c}" for c in changed]] if changed else \
            ["", "Nothing in the stack changed since the baseline."]
    if run.get("benchyTable"):
        lines += ["", "llama-benchy's own table (as published Spark results show it):", "",
                  run["benchyTable"].strip()]
    return "\n".join(lines) + "\n"


def chart(run: dict[str, Any], baseline: dict[str, Any] | None, path: Path) -> None:
    """Throughput and latency against concurrency, this run beside the baseline (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [("this run", run, "-", "o")]
    if baseline is not None:
        series.append((f"baseline {baseline['when']}", baseline, "--", "s"))
    for label, data, style, marker in series:
        levels = [int(k) for k in data["figures"]]
        figs = list(data["figures"].values())
        left.plot(levels, [f["outputTokensPerS"] for f in figs], style, marker=marker,
                  color="tab:blue", label=f"output tok/s, {label}")
        right.plot(levels, [f["ttftP50Ms"] for f in figs], style, marker=marker,
                   color="tab:orange", label=f"TTFT p50, {label}")
        right.plot(levels, [f["itlP50Ms"] for f in figs], style, marker=marker,
                   color="tab:green", label=f"ITL p50, {label}")
    left.set(title="Throughput", xlabel="concurrency", ylabel="output tokens/s")
    right.set(title="Latency", xlabel="concurrency", ylabel="ms")
    levels = sorted({int(k) for _, data, _, _ in series for k in data["figures"]})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"spark-vllm bench: {run['stack']} ({run['model']}), {run['profile']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
