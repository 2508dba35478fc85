"""The scenarios, run for one contender on the lab; each returns raw records.

A lifecycle is: clean (untimed) → cold up → no-op re-apply → env change → vLLM-arg change →
worker node rebooted → teardown, every step timed to /health 200 (teardown: to its command's
exit), with what it restarted on the nodes. The reboot itself (`python -m lab reboot`, the
node's dockerd stopping its containers) is not timed: the step is the contender's repair, from
the node answering again to serving (spark-vllm: `pulumi up --refresh`, detection included).
Then, for a contender that can see one (spark-vllm), a wedge: a rank frozen (`python -m lab
wedge`), the repair timed to serving, the liveness window included. The join failure runs apart, with node-1 ⟷ node-2 blocked on the fabric
for its whole duration (always unblocked after, whatever happened).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench import ranks
from bench.common import (
    BenchError,
    Lab,
    restarts,
    running_containers,
    say,
    snapshot,
    wait_health,
)
from bench.contenders import Contender, Outcome
from lab import cluster

LIFECYCLE = ("cold_up", "noop", "env_change", "vllm_change", "worker_reboot", "rank_killed",
             "wedge_repair", "teardown")
# the repair steps: their fault, and serving = tokens by this deadline (spark-vllm's wedge
# repair is ~74 s with its default 60 s window; vLLM's own execute timeout is 300 s)
REPAIRS = ("worker_reboot", "rank_killed", "wedge_repair")
SIGNALS = {"rank_killed": "SIGKILL", "wedge_repair": "SIGSTOP"}
REPAIR_DEADLINE_S = 180.0
FAILED_REPAIR_GRACE_S = 15.0
JOIN = "join_failure"
INCIDENT = "incident"
SCENARIOS = (*LIFECYCLE, JOIN, INCIDENT)
ENV_CHANGE_TO = "INFO"  # NCCL_DEBUG: WARN (baseline) → INFO
VLLM_LEN_TO = 8192  # --max-model-len: unset (baseline) → 8192


def _record(c: Contender, lab: Lab, scenario: str, run: int, seconds: float | None,
            out: Outcome, changed: dict[str, Any] | None = None) -> dict[str, Any]:
    rec = {"nodes": len(lab.nodes), "contender": c.name, "scenario": scenario, "run": run,
           "seconds": None if seconds is None else round(seconds, 3), "ok": out.ok,
           "note": out.note[-600:], "profile": out.profile, "restarts": changed}
    shown = ("not repaired" if scenario in REPAIRS else "not reported") if seconds is None \
        else f"{seconds:6.2f} s"
    status = ""
    if not out.ok:
        last = out.note.strip().splitlines()[-1] if out.note.strip() else "?"
        status = f"  FAILED: {last[:160]}"
    extra = ""
    if changed:
        extra = (f"  (containers started {changed['containers_started']}, Ray restarted on "
                 f"{changed['ray_restarted_nodes']} node(s), vLLM restarted: "
                 f"{'yes' if changed['vllm_restarted'] else 'no'})")
    say(f"  {len(lab.nodes)} nodes  run {run}  {c.name:10} {scenario:12} {shown}{status}{extra}")
    return rec


def _to_serving(lab: Lab, step: Callable[[], Outcome]) -> tuple[float, Outcome]:
    """Run a step, then wait until the endpoint serves: seconds for both together."""
    t0 = time.monotonic()
    out = step()
    if out.ok:
        try:
            wait_health(lab.health_url)
        except BenchError as e:
            out = Outcome(False, f"{out.note}\n{e}".strip(), out.profile)
    return time.monotonic() - t0, out


@contextmanager
def _turn(c: Contender, lab: Lab) -> Iterator[None]:
    """One contender's turn on the lab: nothing of it running before, the baseline desired
    state, its own set-up (enter); after, whatever happened, what it left removed, no rank left
    frozen, its set-up taken away."""
    c.clean()
    c.reset()
    c.enter()
    try:
        yield
    finally:
        c.clean()
        ranks.thaw_all(lab)
        c.leave()


def lifecycle(c: Contender, lab: Lab, run: int, only: str | None = None,
              record: set[str] | None = None) -> list[dict[str, Any]]:
    """The lifecycle; with `only`, just the steps that scenario needs, recording that one (or
    the steps in `record`)."""
    records: list[dict[str, Any]] = []
    # the wedge is measured next to the dead-worker figure (the reboot runs before it anyway)
    kept = {only, "worker_reboot"} if only == "wedge_repair" else {only}
    kept |= record or set()
    keep = (lambda name: True) if only is None else (lambda name: name in kept)
    steps: list[tuple[str, Callable[[], Outcome]]] = [
        ("cold_up", c.up),
        ("noop", c.reapply),
        ("env_change", lambda: c.set_env(ENV_CHANGE_TO)),
        ("vllm_change", lambda: c.set_vllm_len(VLLM_LEN_TO)),
        ("worker_reboot", c.repair),
        ("rank_killed", c.repair),
        ("wedge_repair", c.repair),
    ]
    # untimed, before the step: what happens to the cluster
    fault: dict[str, Callable[[], Any]] = {
        "worker_reboot": lambda: cluster.reboot([lab.nodes[-1].name], quiet=True),
        **{name: (lambda sig=sig: ranks.signal_ranks(lab.nodes[-1], sig))
           for name, sig in SIGNALS.items()}}
    if only == "teardown":
        steps = steps[:1]
    elif only is not None:
        steps = steps[: [name for name, _ in steps].index(only) + 1]
    with _turn(c, lab):
        before = snapshot(lab)
        for scenario, step in steps:
            if scenario in fault:
                if len(lab.nodes) < 2:
                    continue
                fault[scenario]()
                before = snapshot(lab)  # the rebooted node's containers, stopped
            if scenario in REPAIRS:
                seconds, out = _to_tokens(lab, step)
            else:
                seconds, out = _to_serving(lab, step)
            after = snapshot(lab)
            changed = None if scenario == "cold_up" else restarts(before, after)
            if keep(scenario) or not out.ok:
                records.append(_record(c, lab, scenario, run, seconds, out, changed))
                if scenario in REPAIRS:
                    records[-1]["cap_s"] = REPAIR_DEADLINE_S
            if not out.ok and scenario in REPAIRS and _back_up(c, lab):
                before = snapshot(lab)
                continue
            if not out.ok:
                return records
            before = after
        if only in (None, "teardown"):
            t0 = time.monotonic()
            out = c.down()
            seconds = time.monotonic() - t0
            left = running_containers(lab)
            if left:
                out = Outcome(False, f"{out.note}\n{left} container(s) still running".strip(),
                              out.profile)
            records.append(_record(c, lab, "teardown", run, seconds, out))
    return records


def _to_tokens(lab: Lab, step: Callable[[], Outcome]) -> tuple[float | None, Outcome]:
    """The contender's repair, then until a completion returns tokens: seconds for both, or
    None when not within REPAIR_DEADLINE_S of the step's start (whatever the command said)."""
    t0 = time.monotonic()
    deadline = t0 + REPAIR_DEADLINE_S
    out = step()
    if not out.ok:
        # the tool said it did not repair, and nothing else acts on the lab: a last look
        # (a contender's background repair, were there one, would have this long)
        deadline = min(deadline, time.monotonic() + FAILED_REPAIR_GRACE_S)
    ok, why = ranks.wait_tokens(lab, deadline)
    seconds = time.monotonic() - t0
    status = "its command succeeded" if out.ok else f"its command failed: {out.note.strip()[-300:]}"
    if ok:
        return seconds, Outcome(True, "" if out.ok else status, out.profile)
    return None, Outcome(False, f"not serving {seconds:.0f} s after the fault "
                                f"({status}; last request: {why})", out.profile)


def _back_up(c: Contender, lab: Lab) -> bool:
    """After a repair that did not repair: clean, a cold up, untimed, so the lifecycle's next
    steps still run; False if even that does not serve."""
    ranks.thaw_all(lab)
    c.clean()
    seconds, out = _to_serving(lab, c.up)
    say(f"  {c.name}: cleaned and up again (untimed) in {seconds:.1f} s"
        + ("" if out.ok else f": FAILED {out.note.strip()[-200:]}"))
    return out.ok


def join_failure(c: Contender, lab: Lab, run: int, cap_s: float) -> dict[str, Any]:
    """Seconds until the contender reports that a worker cannot join (None: not within cap)."""
    a, b = lab.nodes[0].name, lab.nodes[1].name
    with _turn(c, lab):
        try:
            cluster.block_fabric(a, b)
            seconds, out = c.join_failure(cap_s)
        finally:
            cluster.unblock_fabric(a, b)
    rec = _record(c, lab, JOIN, run, seconds, out)
    rec["cap_s"] = cap_s
    return rec


def incident_run(c: Contender, lab: Lab, run: int, cap_s: float) -> dict[str, Any] | None:
    """The contender configured into the seeds' incident (bench/incident.py); None for one
    that is not run there."""
    with _turn(c, lab):
        got = c.incident(cap_s)
    if got is None:
        return None
    seconds, out = got
    rec = _record(c, lab, INCIDENT, run, seconds, out)
    rec["cap_s"] = cap_s
    say(f"    {out.note[:300]}")
    return rec


def backends_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of cold up and env change per backend, and native / Ray."""
    import statistics

    out: dict[str, Any] = {"lines": []}
    for scenario in ("cold_up", "env_change"):
        med = {}
        for who in ("spark-vllm", "spark-vllm-native"):
            xs = [r["seconds"] for r in runs if r["contender"] == who
                  and r["scenario"] == scenario and r["ok"] and r["seconds"] is not None]
            med[who] = statistics.median(xs) if xs else None
            out[f"{scenario}/{who}"] = {"median": med[who], "runs": xs}
        ray, native = med["spark-vllm"], med["spark-vllm-native"]
        ratio = native / ray if ray and native else None
        out[f"{scenario}/native_over_ray"] = ratio
        out["lines"].append(
            f"{scenario}: ray {ray if ray is None else f'{ray:.1f} s'}, native "
            f"{native if native is None else f'{native:.1f} s'}"
            + (f", native / ray {ratio:.2f} x" if ratio else ""))
    return out
