"""latest.md (tables, targets met/missed, where spark-vllm's time goes) and latest.png."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import fabric, image_copy, staging
from bench.scenarios import SCENARIOS
from bench.stats import CONTENDERS, LABELS, restart_summary, select, stat, targets
from spark_vllm.components.spec import DEFAULT_RAY_TIMEOUT_S

TITLES = {"cold_up": "cold up → serving", "noop": "no-op re-apply", "env_change":
          "env change → serving", "vllm_change": "vLLM-arg change → serving",
          "worker_reboot": "worker node rebooted → serving",
          "wedge_repair": "rank frozen (wedged) → serving", "teardown": "teardown",
          "join_failure": "worker cannot join → reported"}


def markdown(result: dict[str, Any]) -> str:
    runs, preview, cfg, mach = result["runs"], result["preview"], result["config"], result["machine"]
    cap = cfg["join_cap_s"]
    rt = cfg["ray_timeout_s"]
    rt_note = (" (the default)" if rt == DEFAULT_RAY_TIMEOUT_S
               else f" (default {DEFAULT_RAY_TIMEOUT_S})")
    lines = [
        "# spark-vllm benchmark results",
        "",
        f"Run {mach['date']} at commit `{mach['commit']}`: {cfg['runs']} run(s) per scenario, "
        f"contenders interleaved within each run. Seconds: median (min–max).",
        "",
        f"Machine: {mach['nproc']} CPUs, {mach['mem_gib']} GiB, kernel {mach['kernel']}, "
        f"docker {mach['docker']}, Ray {mach['ray']}, {mach['pulumi']} ({mach['engine']}), "
        f"Python {mach['python']}.",
        "",
        "Setup: the lab (`python -m lab up --nodes N --stack bench`), image `spark-vllm-sim:lab` "
        f"(vllm-sim loads in 3 s), TP = N. spark-vllm runs with `rayTimeout: {rt}`{rt_note}; "
        f"the join-failure wait is capped at {cap:.0f} s for the launcher and the bare path. "
        "See bench/README.md for what each contender runs.",
        "",
    ]
    for n in sorted({r["nodes"] for r in runs}):
        lines += [f"## {n} nodes", "", "| scenario | " + " | ".join(LABELS[c] for c in CONTENDERS)
                  + " |", "|---|" + "---|" * len(CONTENDERS)]
        for s in SCENARIOS:
            cells = []
            for c in CONTENDERS:
                st = stat(select(runs, n, c, s))
                cells.append("–" if st is None else st.cell(cap))
            if any(x != "–" for x in cells):
                lines.append(f"| {TITLES[s]} | " + " | ".join(cells) + " |")
        lines += ["", "What each step restarted (median over runs; vLLM: runs where it restarted):",
                  "", "| scenario | " + " | ".join(LABELS[c] for c in CONTENDERS) + " |",
                  "|---|" + "---|" * len(CONTENDERS)]
        for s in ("noop", "env_change", "vllm_change", "worker_reboot", "wedge_repair"):
            cells = [restart_summary(select(runs, n, c, s)) for c in CONTENDERS]
            if any(x != "–" for x in cells):
                lines.append(f"| {TITLES[s]} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Targets (benchmark figures, not tests)", "", "| target | measured | |",
              "|---|---|---|"]
    for t in targets(runs, preview, cap):
        mark = "–" if t.met is None else ("met" if t.met else "**missed**")
        lines.append(f"| {t.name} | {t.measured} | {mark} |")
    lines += ["", *staging.table(result.get("staging", [])),
              *fabric.table(result.get("staging", [])),
              *staging.copy_table(result.get("staging", [])),
              *image_copy.table(result.get("staging", [])), *preview_table(preview),
              *profile_section(runs), *cold_up_section(runs)]
    failures = [r for r in [*runs, *result.get("staging", [])] if not r["ok"]]
    if failures:
        lines += ["## Failed runs", ""]
        for r in failures:
            note = r["note"].strip().splitlines()[-1] if r["note"].strip() else ""
            lines.append(f"- {r['nodes']} nodes, run {r['run']}, {r['contender']}, "
                         f"{r['scenario']}: {note[:200]}")
        lines.append("")
    return "\n".join(lines) + "\n"


def preview_table(preview: list[dict[str, Any]]) -> list[str]:
    if not preview:
        return []
    out = ["## Scale of the program: `pulumi preview`", "",
           "No lab: temporary stacks with fake addresses (preview runs no remote command). "
           "Peak memory: largest RSS sum over the CLI's whole process tree.", "",
           "| nodes | resources | seconds | peak memory (MiB) |", "|---|---|---|---|"]
    for n in sorted({p["nodes"] for p in preview}):
        ps = [p for p in preview if p["nodes"] == n and p["ok"]]
        if not ps:
            out.append(f"| {n} | – | failed | – |")
            continue
        sec = [p["seconds"] for p in ps]
        mem = [p["peak_rss_mib"] for p in ps]
        out.append(f"| {n} | {ps[0].get('resources', '?')} | {statistics.median(sec):.2f} "
                   f"({min(sec):.2f}–{max(sec):.2f}) | {statistics.median(mem):.0f} "
                   f"({min(mem):.0f}–{max(mem):.0f}) |")
    return [*out, ""]


def profile_section(runs: list[dict[str, Any]]) -> list[str]:
    """Medians of the phases of spark-vllm's `pulumi` runs, and its slowest remote commands."""
    out = ["## Where spark-vllm's time goes (medians, from the engine's event stream)", "",
           "program start = CLI start → the program registers its first resource (backend, "
           "language host, Python program import); before first remote = until the first "
           "remote command starts (plugin load, diff); remote busy = time with ≥ 1 remote "
           "command running (SSH + the work and waits on the node); after = last remote command "
           "→ exit (outputs, state write).", "",
           "| nodes | scenario | total | program start | before first remote | remote busy "
           "| after | remote commands | slowest commands |", "|---|---|---|---|---|---|---|---|---|"]
    for n in sorted({r["nodes"] for r in runs}):
        for s in SCENARIOS:
            profs = [r["profile"] for r in select(runs, n, "spark-vllm", s)
                     if r.get("profile") and r["profile"].get("total_s") is not None]
            if not profs:
                continue
            med = {k: _med([p.get(k) for p in profs]) for k in
                   ("total_s", "program_start_s", "first_remote_s", "remote_busy_s",
                    "after_last_remote_s", "remote_commands")}
            steps: dict[str, list[float]] = defaultdict(list)
            for p in profs:
                for name, st in p.get("steps", {}).items():
                    steps[name].append(st["s"])
            top = sorted(((statistics.median(v), k) for k, v in steps.items()), reverse=True)[:3]
            out.append(f"| {n} | {TITLES[s]} | {_f(med['total_s'])} | {_f(med['program_start_s'])}"
                       f" | {_f(med['first_remote_s'])} | {_f(med['remote_busy_s'])} | "
                       f"{_f(med['after_last_remote_s'])} | {_f(med['remote_commands'], 0)} | "
                       + ", ".join(f"{k} {v:.1f}" for v, k in top) + " |")
    return [*out, ""]


# The cold up's critical path, one part after the other, for spark-vllm (backend ray: the
# engine's step names) and the bare path (its own steps). Each part starts where the previous
# one ends, so the parts sum to the run's seconds.
COLD_UP_PARTS = ("engine start", "checks", "Ray head + workers", "gate", "vLLM to serving",
                 "after")


def cold_up_parts(run: dict[str, Any]) -> dict[str, float] | None:
    """One cold up's seconds per part of its critical path (COLD_UP_PARTS; a part the
    contender has not is absent), or None where its steps were not recorded."""
    steps = (run.get("profile") or {}).get("steps") or {}
    total = run.get("seconds")
    if not run.get("ok") or total is None:
        return None
    if run["contender"] == "spark-vllm":
        head, gate, vllm = (steps.get(f"create {k}") for k in ("ray-head", "ray-gate",
                                                                "vllm-serve"))
        first = run["profile"].get("first_remote_s")
        if head is None or gate is None or vllm is None or first is None:
            return None
        served = vllm["start"] + vllm["s"]
        return {"engine start": first, "checks": head["start"] - first,
                "Ray head + workers": gate["start"] - head["start"],
                "gate": vllm["start"] - gate["start"], "vLLM to serving": vllm["s"],
                "after": total - served}
    if run["contender"] == "bare":
        if "ray_head_s" not in steps or "ray_workers_s" not in steps:
            return None
        ray = steps["ray_head_s"] + steps["ray_workers_s"]
        return {"Ray head + workers": ray, "vLLM to serving": total - ray}
    return None


def cold_up_section(runs: list[dict[str, Any]]) -> list[str]:
    """The cold up's critical path, part by part, spark-vllm beside the bare path: where the
    ratio between the two comes from."""
    out: list[str] = []
    for n in sorted({r["nodes"] for r in runs}):
        med: dict[str, dict[str, float | None]] = {}
        for c in ("spark-vllm", "bare"):
            split = [(r["seconds"], p) for r in select(runs, n, c, "cold_up")
                     if (p := cold_up_parts(r))]
            if split:
                med[c] = {k: _med([p.get(k) for _, p in split]) for k in COLD_UP_PARTS}
                med[c]["total"] = _med([seconds for seconds, _ in split])
        if len(med) < 2:
            continue
        if not out:
            out = ["## The cold up, part by part (medians)", "",
                   "Along the critical path, each part starting where the one before ends. "
                   "spark-vllm: engine start = CLI start → first remote command; checks = "
                   "until the Ray head's command starts (preflights, image, fabric, memory); "
                   "Ray = the head's and the workers' commands; gate = the node-table check "
                   "until vLLM's command starts; vLLM to serving = vLLM's command (it returns "
                   "serving, after its smoke request); after = the CLI's exit and the "
                   "harness's /health. The bare path: its head's, then its workers' SSH "
                   "commands, then `docker run` of vLLM and the harness's /health wait.", ""]
        out += [f"| {n} nodes | spark-vllm | bare path | difference |", "|---|---|---|---|"]
        for k in (*COLD_UP_PARTS, "total"):
            ours, bare = med["spark-vllm"].get(k), med["bare"].get(k)
            diff = (ours or 0.0) - (bare or 0.0)
            out.append(f"| {k} | {_f(ours)} | {_f(bare)} | {diff:+.1f} |")
        out.append("")
    return out


def _med(xs: list[Any]) -> float | None:
    vals = [x for x in xs if isinstance(x, int | float)]
    return statistics.median(vals) if vals else None


def _f(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, preview, cap = result["runs"], result["preview"], result["config"]["join_cap_s"]
    sizes = sorted({r["nodes"] for r in runs})
    panels = len(sizes) + (1 if preview else 0)
    fig, axes = plt.subplots(1, max(1, panels), figsize=(6.5 * max(1, panels), 4.8), squeeze=False)
    colors = {"spark-vllm": "#1f77b4", "launcher": "#ff7f0e", "bare": "#2ca02c"}
    width = 0.8 / len(CONTENDERS)
    for ax, n in zip(axes[0], sizes, strict=False):
        for i, c in enumerate(CONTENDERS):
            xs, ys, lo, hi, hatch = [], [], [], [], []
            for j, s in enumerate(SCENARIOS):
                st = stat(select(runs, n, c, s))
                if st is None:
                    continue
                if st.n == 0 and st.over_cap:
                    y, a, b, h = cap, 0.0, 0.0, True
                elif st.n:
                    y, a, b, h = st.median, st.median - st.lo, st.hi - st.median, False
                else:
                    continue
                xs.append(j + (i - 1) * width)
                ys.append(y)
                lo.append(a)
                hi.append(b)
                hatch.append(h)
            bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colors[c],
                          label=LABELS[c])
            for bar, h in zip(bars, hatch, strict=True):
                if h:
                    bar.set_hatch("//")
                    bar.set_alpha(0.5)
        ax.set_xticks(range(len(SCENARIOS)))
        ax.set_xticklabels([TITLES[s].replace(" → ", "\n→ ") for s in SCENARIOS], fontsize=7)
        ax.set_ylabel("seconds (median, min–max)")
        ax.set_title(f"{n} nodes (hatched: not reported within {cap:.0f} s)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    if preview:
        ax = axes[0][-1]
        ns = sorted({p["nodes"] for p in preview})
        sec = [statistics.median(p["seconds"] for p in preview if p["nodes"] == n and p["ok"])
               for n in ns]
        mem = [statistics.median(p["peak_rss_mib"] for p in preview if p["nodes"] == n and p["ok"])
               for n in ns]
        ax.plot(ns, sec, "o-", color="#1f77b4", label="seconds")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("nodes in the stack")
        ax.set_ylabel("pulumi preview, seconds (median)")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot(ns, mem, "s--", color="#d62728", label="peak MiB")
        ax2.set_ylabel("peak memory of the process tree, MiB")
        ax2.set_ylim(bottom=0)
        ax.set_title("scale of the program: pulumi preview", fontsize=9)
        ax.legend(loc="upper left", fontsize=7)
        ax2.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
