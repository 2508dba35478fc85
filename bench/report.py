"""A result's markdown (tables, targets met/missed, where spark-vllm's time goes) and the
README's table of medians; the picture is bench/chart.py's."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench import fabric, image_copy, peers_report, staging
from bench.scenarios import SCENARIOS
from bench.stats import FAIL_WORDS, contenders_of, label, restart_summary, select, stat, targets
from spark_vllm.components.spec import DEFAULT_RAY_TIMEOUT_S

TITLES = {"cold_up": "cold up → serving", "noop": "no-op re-apply", "env_change":
          "env change → serving", "vllm_change": "vLLM-arg change → serving",
          "worker_reboot": "worker node rebooted → serving",
          "wedge_repair": "rank frozen (wedged) → serving", "teardown": "teardown",
          "join_failure": "worker cannot join → reported",
          "rank_killed": "rank on node-2 killed → serving",
          "incident": "the seeds' incident (Ray, mgmt NIC pinned to the fabric) → outcome"}


def title(scenario: str) -> str:
    return TITLES.get(scenario, scenario)


def scenarios_of(runs: list[dict[str, Any]]) -> list[str]:
    """The scenarios the runs hold: the known ones in the bench's order (SCENARIOS, then
    TITLES'), then the others as they come."""
    known = list(dict.fromkeys([*SCENARIOS, *TITLES]))
    held = list(dict.fromkeys(r["scenario"] for r in runs))
    return [s for s in known if s in held] + [s for s in held if s not in known]


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
    names = contenders_of(result)
    head = ["| scenario | " + " | ".join(label(c) for c in names) + " |",
            "|---|" + "---|" * len(names)]
    for n in sorted({r["nodes"] for r in runs}):
        lines += [f"## {n} nodes", "", *head]
        for s in scenarios_of(runs):
            cells = []
            for c in names:
                st = stat(select(runs, n, c, s))
                cells.append("–" if st is None else st.cell(cap if s == "join_failure" else None,
                                                           s))
            if any(x != "–" for x in cells):
                lines.append(f"| {title(s)} | " + " | ".join(cells) + " |")
        lines += ["", "What each step restarted (median over runs; vLLM: runs where it restarted):",
                  "", *head]
        for s in scenarios_of(runs):
            cells = [restart_summary(select(runs, n, c, s)) for c in names]
            if any(x != "–" for x in cells):
                lines.append(f"| {title(s)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Targets (benchmark figures, not tests)", "", "| target | measured | |",
              "|---|---|---|"]
    for t in targets(runs, preview, cap):
        mark = "–" if t.met is None else ("met" if t.met else "**missed**")
        lines.append(f"| {t.name} | {t.measured} | {mark} |")
    lines += ["", *peers_report.notes_section(runs), *staging.table(result.get("staging", [])),
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
        for s in scenarios_of(runs):
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
            out.append(f"| {n} | {title(s)} | {_f(med['total_s'])} | {_f(med['program_start_s'])}"
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


def readme_table(result: dict[str, Any], source: str) -> list[str]:
    """The README's table: every contender's median per scenario and lab size, and spark-vllm
    over each other contender; `source` names the result file it comes from."""
    runs, cfg, mach = result["runs"], result["config"], result["machine"]
    names = contenders_of(result)
    others = [c for c in names if c != "spark-vllm"] if "spark-vllm" in names else []
    out = [f"Medians in seconds of `{source}`: run {mach.get('date', '?')} at commit "
           f"`{mach.get('commit', '?')}`, {cfg.get('runs', '?')} run(s) per scenario, "
           f"contenders {', '.join(names)}. The ranges, restarts and targets are in "
           "`results/latest.md`; the picture is `results/latest.png`.", ""]
    for n in sorted({r["nodes"] for r in runs}):
        out += [f"**{n} nodes**", "",
                "| scenario | " + " | ".join(label(c) for c in names)
                + "".join(f" | spark-vllm / {c}" for c in others) + " |",
                "|---|" + "---|" * (len(names) + len(others))]
        for s in scenarios_of(runs):
            st = {c: stat(select(runs, n, c, s)) for c in names}
            if all(x is None for x in st.values()):
                continue
            cap = cfg.get("join_cap_s") if s == "join_failure" else None
            cells = ["–" if st[c] is None else st[c].short(cap, s) for c in names]
            cells += [_ratio_cell(st.get("spark-vllm"), st[c], cap, s) for c in others]
            out.append(f"| {title(s)} | " + " | ".join(cells) + " |")
        out.append("")
    if not runs:
        out += ["(no lifecycle scenario in this run)", ""]
    return out


def _ratio_cell(ours: Any, theirs: Any, cap: float | None, scenario: str) -> str:
    """spark-vllm's median over another's; against one that had no figure within its cap (not
    reported, not repaired), an upper bound."""
    if ours is None or theirs is None or not ours.n:
        return "–"
    if theirs.n:
        return f"{ours.median / theirs.median:.2f} ×" if theirs.median else "–"
    bound = theirs.cap if cap is None else cap
    if bound and (theirs.over_cap or (theirs.failed and scenario in FAIL_WORDS)):
        return f"< {ours.median / bound:.2f} ×"
    return "–"
