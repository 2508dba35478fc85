"""The bench's picture: one panel per lab size, every scenario the result holds as a row of
horizontal bars, one per contender (its median, whiskers from min to max; a contender with no
figure within the scenario's cap hatched up to the cap), then the scale of `pulumi preview`."""

from __future__ import annotations

import colorsys
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import scenarios_of, title
from bench.stats import FAIL_WORDS, Stat, contenders_of, is_complete, label, select, stat, words

# One colour per known contender, the same in every picture; others get SPARE's in turn.
COLORS = {"spark-vllm": "#1f77b4", "spark-vllm-native": "#9467bd", "launcher": "#ff7f0e",
          "bare": "#2ca02c", "sparkrun": "#d62728"}
SPARE = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
BAR_IN = 0.2  # one bar's height, inches
HEAD_IN = 0.95  # the headline and the legend
GAP = 0.8  # between two scenarios' bars, in bars
WRAP = 28  # scenario labels wrap at this many characters


def colors(names: Sequence[str]) -> dict[str, str]:
    """A distinct colour per contender: the known ones' own, the others' from SPARE, then
    hues spread around the circle."""
    out = {c: COLORS[c] for c in names if c in COLORS}
    spare = [x for x in SPARE if x not in out.values()]
    unknown = [c for c in dict.fromkeys(names) if c not in COLORS]
    for i, c in enumerate(unknown):
        if i < len(spare):
            out[c] = spare[i]
        else:
            r, g, b = colorsys.hsv_to_rgb((i * 0.618) % 1.0, 0.55, 0.75)
            out[c] = f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"
    return out


def wrap(text: str, width: int = WRAP) -> str:
    """Lines of at most `width` characters, broken after a space or an underscore (a
    scenario's key stands in for its title where it has none); a longer word stays whole."""
    lines = [""]
    for chunk in re.findall(r"[^ _]+[ _]*|[ _]+", text):
        if lines[-1] and len(lines[-1] + chunk.rstrip()) > width:
            lines.append("")
        lines[-1] += chunk
    return "\n".join(line.rstrip() for line in lines)


def _cap(st: Stat, scenario: str, cfg: dict[str, Any]) -> float | None:
    if st.cap is not None:
        return st.cap
    return cfg.get("join_cap_s") if scenario == "join_failure" else None


def _rows(runs: list[dict[str, Any]], n: int, names: list[str]
          ) -> list[tuple[str, list[tuple[str, Stat]]]]:
    rows = []
    for s in scenarios_of(runs):
        bars = [(c, st) for c in names if (st := stat(select(runs, n, c, s))) is not None]
        if bars:
            rows.append((s, bars))
    return rows


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    runs, preview, cfg = result["runs"], result.get("preview") or [], result["config"]
    names = contenders_of(result)
    color = colors(names)
    sizes = sorted({r["nodes"] for r in runs})
    rows = {n: _rows(runs, n, names) for n in sizes}
    heights = [BAR_IN * (sum(len(b) for _, b in rows[n]) + GAP * len(rows[n])) + 0.7
               for n in sizes]
    if preview:
        heights.append(2.6)
    if not heights:
        heights = [1.2]
    fig = plt.figure(figsize=(11, HEAD_IN + sum(heights)), layout="constrained")
    head, *axes = fig.subfigures(len(heights) + 1, 1, height_ratios=[HEAD_IN, *heights])
    # one x scale for every lab size, with room right of the longest bar for its figure
    ends = [max(st.hi, _cap(st, s, cfg) or 0.0) for n in sizes for s, bars in rows[n]
            for _, st in bars]
    xmax = max(ends, default=1.0) * 1.3 or 1.0
    drawn: list[str] = []
    missing = False
    for sub, n in zip(axes, sizes, strict=False):
        ax = sub.subplots()
        y, ticks, tick_labels = 0.0, [], []
        for k, (s, bars) in enumerate(rows[n]):
            if k:  # a line between two scenarios
                ax.axhline(y - (1 + GAP) / 2, color="#dddddd", lw=0.6)
            ticks.append(y + (len(bars) - 1) / 2)
            tick_labels.append(wrap(title(s)))
            for c, st in bars:
                missing |= _bar(ax, y, st, s, _cap(st, s, cfg), color[c], xmax)
                if c not in drawn:
                    drawn.append(c)
                y += 1
            y += GAP
        ax.set_ylim(y - GAP - 0.5 + GAP / 2, -0.5 - GAP / 2)
        ax.set_yticks(ticks, tick_labels, fontsize=8)
        ax.tick_params(axis="y", length=0)
        ax.set_xlim(0, xmax)
        ax.set_xlabel("seconds: median, whiskers min–max", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"{n} nodes", fontsize=10, loc="left", fontweight="bold")
    if preview:
        _preview(axes[-1].subplots(), preview)
    if not sizes and not preview:
        ax = axes[0].subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, "no lifecycle scenario and no preview in this run: see its .md",
                ha="center", va="center", fontsize=10)
    handles = [Patch(color=color[c], label=label(c)) for c in drawn]
    if missing:
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///",
                             label="no figure within the cap (not reported / not repaired)"))
    head.text(0.5, 0.97, _headline(result), ha="center", va="top", fontsize=10)
    if handles:
        head.legend(handles=handles, loc="lower center", ncols=min(3, len(handles)),
                    fontsize=8, frameon=False)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bar(ax: Any, y: float, st: Stat, scenario: str, cap: float | None, color: str,
         xmax: float) -> bool:
    """One contender's bar in a scenario; True where it is a hatched "no figure" bar."""
    pad = xmax * 0.008
    miss, fail = words(scenario)
    total = st.n + st.over_cap + st.failed
    if st.n:
        ax.barh(y, st.median, height=0.8, color=color,
                xerr=[[st.median - st.lo], [st.hi - st.median]], capsize=2,
                error_kw={"lw": 0.8, "ecolor": "#333333"})
        text = f"{st.median:.1f}"
        if st.over_cap:
            text += f"  ({st.over_cap} of {total} {miss})"
        if st.failed:
            text += f"  ({st.failed} of {total} {fail})"
        ax.text(st.hi + pad, y, text, va="center", fontsize=7)
        return False
    bounded = st.over_cap or (st.failed and scenario in FAIL_WORDS)
    if bounded and cap:
        ax.barh(y, cap, height=0.8, facecolor=color, alpha=0.35, hatch="///",
                edgecolor=color, lw=0)
        word = miss if st.over_cap else fail
        ax.text(cap + pad, y, f"> {cap:.0f} s: {word} ({st.over_cap + st.failed} of {total})",
                va="center", fontsize=7)
        return True
    ax.plot([pad * 2], [y], marker="x", color=color, ms=6, mew=2)
    word = miss if st.over_cap else fail
    ax.text(pad * 5, y, f"{word} ({st.over_cap + st.failed} of {total})", va="center",
            fontsize=7)
    return False


def _headline(result: dict[str, Any]) -> str:
    mach, cfg = result.get("machine", {}), result["config"]
    text = (f"spark-vllm bench, run {mach.get('date', '?')} at {mach.get('commit', '?')}: "
            f"{cfg.get('runs', '?')} run(s) per scenario")
    if not is_complete(result):
        why = "; ".join(result.get("incomplete") or []) or f"--only {cfg.get('only')}"
        text += f"\npartial run ({why})"
    return text


def _preview(ax: Any, preview: list[dict[str, Any]]) -> None:
    ns = sorted({p["nodes"] for p in preview if p["ok"]})
    if not ns:
        ax.axis("off")
        ax.text(0.5, 0.5, "pulumi preview: every run failed", ha="center", va="center")
        return
    sec = [statistics.median(p["seconds"] for p in preview if p["nodes"] == n and p["ok"])
           for n in ns]
    mem = [statistics.median(p["peak_rss_mib"] for p in preview if p["nodes"] == n and p["ok"])
           for n in ns]
    (a,) = ax.plot(ns, sec, "o-", color="#1f77b4", label="seconds")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.tick_params(labelsize=8)
    ax.set_xlabel("nodes in the stack", fontsize=8)
    ax.set_ylabel("seconds (median)", fontsize=8)
    ax.set_ylim(0, max(sec) * 1.15)
    ax2 = ax.twinx()
    (b,) = ax2.plot(ns, mem, "s--", color="#d62728", label="peak memory, MiB")
    ax2.set_ylabel("peak memory of the process tree, MiB", fontsize=8)
    ax2.set_ylim(0, max(mem) * 1.15)
    ax2.tick_params(labelsize=8)
    ax.set_title("scale of the program: pulumi preview", fontsize=10, loc="left",
                 fontweight="bold")
    ax.legend(handles=[a, b], loc="lower right", fontsize=8)
