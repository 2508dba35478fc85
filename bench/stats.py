"""Medians, ranges and the targets of issue 5, computed from the raw records."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Every contender the bench knows, in the order the tables and the chart show them; a result's
# other contenders (one added since) follow, in the order the result names them.
CONTENDERS = ("spark-vllm", "spark-vllm-native", "launcher", "bare", "sparkrun")
LABELS = {"spark-vllm": "spark-vllm (pulumi up)",
          "spark-vllm-native": "spark-vllm, backend native (pulumi up)",
          "launcher": "Ray launcher (ray up)", "bare": "bare path",
          "sparkrun": "sparkrun 0.4.2"}
# A run without a figure: ok with no seconds is the tool saying nothing within the cap (the
# join failure's "not reported"); ok false is a failure, which for a repair scenario means
# not repaired within its cap.
MISS_WORDS = {"join_failure": "not reported"}
FAIL_WORDS = {"rank_killed": "not repaired"}
VLLM_WAIT_S = 1800  # vLLM's own placement-group wait: what a join failure costs without a gate


@dataclass(frozen=True)
class Stat:
    median: float
    lo: float
    hi: float
    n: int  # successful runs
    failed: int
    over_cap: int = 0  # join failure: runs that reported nothing within the cap
    cap: float | None = None  # the records' own cap (cap_s), where they name one

    def cell(self, cap: float | None = None, scenario: str | None = None) -> str:
        cap = self.cap if cap is None else cap
        miss, fail = words(scenario)
        if self.n == 0:
            if self.over_cap:
                if cap is None:
                    return f"{miss} ({self.over_cap} runs)"
                return f"> {cap:.0f} ({miss}, {self.over_cap} runs)"
            if self.failed and cap is not None and scenario in FAIL_WORDS:
                return f"> {cap:.0f} ({fail}, {self.failed} runs)"
            return f"{fail} ({self.failed})" if self.failed else "–"
        text = f"{self.median:.1f} ({self.lo:.1f}–{self.hi:.1f})"
        if self.over_cap:
            text += f", > {cap:.0f} in {self.over_cap}" if cap is not None else \
                f", {miss} in {self.over_cap}"
        if self.failed:
            text += f", {self.failed} {fail}"
        return text

    def short(self, cap: float | None = None, scenario: str | None = None) -> str:
        """The median alone, or what stood in for it (the README's table)."""
        cap = self.cap if cap is None else cap
        miss, fail = words(scenario)
        total = self.n + self.over_cap + self.failed
        if self.n:
            return f"{self.median:.1f}" + "".join(
                f", {k} of {total} {w}" for k, w in ((self.over_cap, miss), (self.failed, fail))
                if k)
        if self.over_cap:
            return f"> {cap:.0f} ({miss})" if cap is not None else miss
        if self.failed and cap is not None and scenario in FAIL_WORDS:
            return f"> {cap:.0f} ({fail})"
        return fail if self.failed else "–"


def words(scenario: str | None) -> tuple[str, str]:
    """What a run with no figure is called in this scenario: (ok but no seconds, not ok)."""
    return (MISS_WORDS.get(scenario or "", "not reported"),
            FAIL_WORDS.get(scenario or "", "failed"))


def label(contender: str) -> str:
    return LABELS.get(contender, contender)


def contenders_of(result: dict[str, Any]) -> list[str]:
    """The contenders a result names (its config) or holds runs of: the known ones in
    CONTENDERS' order, then the others in the order they appear."""
    return ordered([*(result.get("config", {}).get("contenders") or []),
                    *(r["contender"] for r in result.get("runs", []))])


def ordered(names: Iterable[str]) -> list[str]:
    """Each name once: the known contenders in CONTENDERS' order, then the others as they
    come."""
    uniq = list(dict.fromkeys(names))
    return [c for c in CONTENDERS if c in uniq] + [c for c in uniq if c not in CONTENDERS]


def is_complete(result: dict[str, Any]) -> bool:
    """A full run: its own "complete" where it says (written since the bench records it);
    before that, any run without --only."""
    if "complete" in result:
        return bool(result["complete"])
    return result.get("config", {}).get("only") is None


MIN_FULL_RUNS = 3  # medians of fewer runs never replace a full run's outputs


def completeness(only: str | None, contenders: Iterable[str], defaults: Iterable[str],
                 interrupted: bool, runs: int = MIN_FULL_RUNS) -> tuple[bool, list[str]]:
    """Whether a run is full (no --only, every default contender, at least 3 runs, not
    interrupted), and why not."""
    why = []
    if runs < MIN_FULL_RUNS:
        why.append(f"{runs} run(s), fewer than {MIN_FULL_RUNS}")
    if only is not None:
        why.append(f"--only {only}")
    if left := [c for c in defaults if c not in set(contenders)]:
        why.append("without " + ", ".join(left))
    if interrupted:
        why.append("interrupted")
    return not why, why


def select(runs: list[dict[str, Any]], nodes: int, contender: str, scenario: str
           ) -> list[dict[str, Any]]:
    return [r for r in runs if r["nodes"] == nodes and r["contender"] == contender
            and r["scenario"] == scenario]


def stat(records: list[dict[str, Any]]) -> Stat | None:
    if not records:
        return None
    ok = [r["seconds"] for r in records if r["ok"] and r["seconds"] is not None]
    over = sum(1 for r in records if r["ok"] and r["seconds"] is None)
    failed = sum(1 for r in records if not r["ok"])
    caps = [r["cap_s"] for r in records if isinstance(r.get("cap_s"), int | float)]
    cap = max(caps) if caps else None
    if not ok:
        return Stat(0, 0, 0, 0, failed, over, cap)
    return Stat(statistics.median(ok), min(ok), max(ok), len(ok), failed, over, cap)


def median_of(runs: list[dict[str, Any]], nodes: int, contender: str, scenario: str
              ) -> float | None:
    s = stat(select(runs, nodes, contender, scenario))
    return s.median if s and s.n else None


def restart_summary(records: list[dict[str, Any]]) -> str:
    rs = [r["restarts"] for r in records if r.get("restarts") and r["ok"]]
    if not rs:
        return "–"
    c = statistics.median(r["containers_started"] for r in rs)
    ray = statistics.median(r["ray_restarted_nodes"] for r in rs)
    vllm = sum(1 for r in rs if r["vllm_restarted"])
    return f"containers {c:g} · Ray on {ray:g} node(s) · vLLM {vllm}/{len(rs)}"


@dataclass(frozen=True)
class Target:
    name: str
    measured: str
    met: bool | None  # None: not measured in this run


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def targets(runs: list[dict[str, Any]], preview: list[dict[str, Any]], join_cap: float
            ) -> list[Target]:
    out: list[Target] = []
    sizes = sorted({r["nodes"] for r in runs})
    for n in sizes:
        m = lambda c, s, n=n: median_of(runs, n, c, s)  # noqa: E731
        sv, bare, ray = m("spark-vllm", "cold_up"), m("bare", "cold_up"), m("launcher", "cold_up")
        r_bare, r_ray = _ratio(sv, bare), _ratio(sv, ray)
        if r_bare is not None:
            # issue 31's bound: the checks (preflight, image, staging, memory, fabric, Ray's
            # gate) and the engine may cost a fifth of the floor, no more
            out.append(Target(f"{n} nodes: cold up ≤ 1.2 × bare path",
                              f"{sv:.1f} s vs {bare:.1f} s = {r_bare:.2f} ×", r_bare <= 1.2))
        if r_ray is not None:
            out.append(Target(f"{n} nodes: cold up faster than the launcher",
                              f"{sv:.1f} s vs {ray:.1f} s = {r_ray:.2f} ×", r_ray < 1.0))
        noop = select(runs, n, "spark-vllm", "noop")
        if noop:
            rs = [r["restarts"] or {} for r in noop if r["ok"]]
            started = max((x.get("containers_started", 0) + x.get("ray_restarted_nodes", 0)
                           for x in rs), default=0)
            med = m("spark-vllm", "noop")
            launcher_ray = [r["restarts"]["ray_restarted_nodes"]
                            for r in select(runs, n, "launcher", "noop") if r.get("restarts")]
            extra = (f"; launcher restarted Ray on {statistics.median(launcher_ray):g} node(s)"
                     if launcher_ray else "")
            ok = med is not None and med <= 10 and started == 0 and len(rs) == len(noop)
            out.append(Target(f"{n} nodes: no-op re-apply restarts nothing, ≤ 10 s",
                              f"{_fmt(med)} s, {started} restarted (max over runs){extra}", ok))
        env = m("spark-vllm", "env_change")
        b_down, b_up = m("bare", "teardown"), m("bare", "cold_up")
        if env is not None and b_down is not None and b_up is not None:
            r = env / (b_down + b_up)
            out.append(Target(f"{n} nodes: env change → serving ≤ 1.5 × (bare teardown + up)",
                              f"{env:.1f} s vs {b_down + b_up:.1f} s = {r:.2f} ×", r <= 1.5))
        vl = [r for r in select(runs, n, "spark-vllm", "vllm_change") if r["ok"]]
        if vl:
            ray_started = max(r["restarts"]["ray_containers_started"]
                              + r["restarts"]["ray_restarted_nodes"] for r in vl)
            out.append(Target(f"{n} nodes: vLLM-arg-only change restarts no Ray container",
                              f"{ray_started} Ray restarts (max over {len(vl)} runs), "
                              f"{_fmt(m('spark-vllm', 'vllm_change'))} s", ray_started == 0))
        rb = [r for r in select(runs, n, "spark-vllm", "worker_reboot") if r["ok"]]
        if rb and sv is not None:
            med = m("spark-vllm", "worker_reboot")
            head = sum(any(x.endswith("-ray-head") for x in r["restarts"]["started"])
                       for r in rb)
            ratio = med / sv
            out.append(Target(f"{n} nodes: worker node rebooted → serving ≤ 1.2 × cold up, "
                              "the head kept",
                              f"{med:.1f} s vs {sv:.1f} s = {ratio:.2f} ×; head restarted in "
                              f"{head} of {len(rb)} runs", ratio <= 1.2 and head == 0))
        wd = [r for r in select(runs, n, "spark-vllm", "wedge_repair") if r["ok"]]
        if wd:
            med = m("spark-vllm", "wedge_repair")
            ray = max(r["restarts"]["ray_containers_started"] + r["restarts"]["ray_restarted_nodes"]
                      for r in wd)
            reboot = m("spark-vllm", "worker_reboot")
            out.append(Target(f"{n} nodes: a wedged vLLM (rank frozen) → serving, Ray kept",
                              f"{_fmt(med)} s (the 60 s wedge window included; worker reboot "
                              f"{_fmt(reboot)} s); {ray} Ray restarts (max over {len(wd)} runs)",
                              ray == 0))
        down, ray_down = m("spark-vllm", "teardown"), m("launcher", "teardown")
        if down is not None and ray_down is not None:
            out.append(Target(f"{n} nodes: teardown no slower than `ray down`",
                              f"{down:.1f} s vs {ray_down:.1f} s", down <= ray_down))
        join = stat(select(runs, n, "spark-vllm", "join_failure"))
        if join is not None:
            bound = VLLM_WAIT_S / 50
            ok = join.n > 0 and join.over_cap == 0 and join.failed == 0 and join.hi <= bound
            others = []
            for c in ordered(r["contender"] for r in runs if r["contender"] != "spark-vllm"):
                s = stat(select(runs, n, c, "join_failure"))
                if s is not None:
                    others.append(f"{c} {s.cell(join_cap)}")
            out.append(Target(f"{n} nodes: join failure reported ≥ 50× sooner than {VLLM_WAIT_S} s"
                              f" (≤ {bound:.0f} s)",
                              f"{join.cell(join_cap)} s" + (f"; {', '.join(others)}" if others else ""),
                              ok))
    if 2 in sizes and 4 in sizes:
        a, b = median_of(runs, 4, "spark-vllm", "cold_up"), median_of(runs, 2, "spark-vllm", "cold_up")
        growth = _ratio(a, b)
        # The lab's nodes share the host's CPUs: the bare path's growth is the lab's own.
        floor = _ratio(median_of(runs, 4, "bare", "cold_up"), median_of(runs, 2, "bare", "cold_up"))
        context = "" if floor is None else f" (bare path: {floor:.2f} ×)"
        if growth is not None:
            out.append(Target("4-node cold up ≤ 1.2 × 2-node cold up",
                              f"{a:.1f} s vs {b:.1f} s = {growth:.2f} ×{context}", growth <= 1.2))
    from bench import peers_report  # it reads this module's helpers

    out += peers_report.targets(runs)
    p = {n: statistics.median(x["seconds"] for x in preview if x["nodes"] == n and x["ok"])
         for n in {x["nodes"] for x in preview if x["ok"]}}
    if 2 in p and 32 in p:
        scale = p[32] / p[2]
        out.append(Target("preview of 32 nodes ≤ 3 × preview of 2",
                          f"{p[32]:.2f} s vs {p[2]:.2f} s = {scale:.2f} ×", scale <= 3))
    return out


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"
