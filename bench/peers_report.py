"""The report's side of the peers (issue 50): spark-vllm's targets against sparkrun, and what
each contender did where a fault or the seeds' incident left it, in its own words."""

from __future__ import annotations

from typing import Any

from bench.stats import Target, _fmt, _ratio, label, median_of, ordered, select

PEER = "sparkrun"
OURS = ("spark-vllm", "spark-vllm-native")
# what the faults and the incident left: the notes say more than a number
NOTED = ("worker_reboot", "rank_killed", "wedge_repair", "join_failure", "incident")


def title_of(scenario: str) -> str:
    from bench.report import title  # report imports this module

    return title(scenario)


def targets(runs: list[dict[str, Any]]) -> list[Target]:
    """Issue 50's: a config change → serving ≤ 0.6 × sparkrun's, a cold start ≤ 1.1 ×, a dead
    or wedged rank serving again where sparkrun does not."""
    out: list[Target] = []
    for n in sorted({r["nodes"] for r in runs}):
        if not select(runs, n, PEER, "cold_up"):
            continue
        for ours in OURS:
            if not select(runs, n, ours, "cold_up"):
                continue
            for s, bound in (("cold_up", 1.1), ("env_change", 0.6), ("vllm_change", 0.6)):
                a, b = median_of(runs, n, ours, s), median_of(runs, n, PEER, s)
                r = _ratio(a, b)
                if r is not None:
                    out.append(Target(f"{n} nodes, {ours}: {title_of(s)} ≤ {bound} × sparkrun's",
                                      f"{a:.1f} s vs {b:.1f} s = {r:.2f} ×", r <= bound))
            for s in ("rank_killed", "wedge_repair"):
                mine, theirs = select(runs, n, ours, s), select(runs, n, PEER, s)
                if not mine or not theirs:
                    continue
                ok_m = sum(1 for r in mine if r["ok"] and r["seconds"] is not None)
                ok_t = sum(1 for r in theirs if r["ok"] and r["seconds"] is not None)
                out.append(Target(f"{n} nodes, {ours}: {title_of(s)}, where sparkrun is not",
                                  f"repaired in {ok_m} of {len(mine)} runs "
                                  f"(median {_fmt(median_of(runs, n, ours, s))} s); sparkrun "
                                  f"{ok_t} of {len(theirs)}", ok_m == len(mine) and ok_t == 0))
    return out


def notes_section(runs: list[dict[str, Any]]) -> list[str]:
    """Per lab size, fault and contender: how many runs ended serving, and what the contender
    (or the bench, for one that did not) said, once per distinct message."""
    lines = ["## What each contender did after a fault, and in the seeds' incident", ""]
    any_line = False
    for n in sorted({r["nodes"] for r in runs}):
        for s in NOTED:
            for c in ordered(r["contender"] for r in runs if r["scenario"] == s):
                recs = select(runs, n, c, s)
                if not recs:
                    continue
                done = sum(1 for r in recs if r["ok"] and r["seconds"] is not None)
                said = list(dict.fromkeys(_last(r["note"]) for r in recs if r["note"].strip()))
                verb = "reported" if s in ("join_failure", "incident") else "serving again"
                lines.append(f"- {n} nodes, {title_of(s)}, {label(c)}: {verb} in {done} of "
                             f"{len(recs)} run(s)" + (": " + " / ".join(said[:2]) if said else ""))
                any_line = True
    return [*lines, ""] if any_line else []


def _last(note: str) -> str:
    text = " ".join(note.split())
    return text[-400:]
