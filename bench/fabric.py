"""The fabric check's cost on `pulumi up` (components/fabric_check.py), on the 2-node lab.

Per run, interleaved: an `up` whose only change is one the check measures (`fabricCheck.timeout`
90 ↔ 91 s: the check and its gate run again, nothing else changes), then a no-op `up`. Timed
from the engine's --json events (profile.py): the check's step plus its gate's step, both on
the critical path of any `up` that runs them (every container and copy waits for the gate);
and on the no-op, what the check's resources cost (nothing runs: 0).

On the lab the image has no torch, so the check ends at "could not run" (onUnavailable: warn):
the figure is its fixed cost (SSH to every node at once, a `docker run --rm` of the serving
image, the verdict, the gate's SSH), not a measurement's. A real one adds the script's own
time: torch's import, the rendezvous, 20 latency iterations per size and 5 of the bounded
message (tests/cpu_tier/test_fabric_check.py runs it with real torch and gloo).
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import say
from bench.contenders.spark_vllm import SparkVllm

CHECK, GATE = "fabric-check", "fabric-gate"


def _timeout(c: SparkVllm, seconds: int) -> None:
    c.set_config("fabricCheck.timeout", str(seconds), path=True)


def _fabric_steps(steps: dict[str, Any]) -> dict[str, float]:
    return {k: float(v["s"]) for k, v in steps.items() if k.split()[-1] in (CHECK, GATE)}


def run_all(c: SparkVllm, runs: int) -> list[dict[str, Any]]:
    _timeout(c, 90)
    if not c.up().ok:
        raise RuntimeError("fabric bench: the stack does not come up")
    records = []
    for r in range(1, runs + 1):
        _timeout(c, 91 if r % 2 else 90)
        for kind in ("rerun", "noop"):
            out = c.reapply()
            steps = _fabric_steps(out.profile.get("steps") or {}) if out.ok else {}
            seconds = round(sum(steps.values()), 2) if out.ok else None
            total = out.profile.get("total_s")
            say(f"  2 nodes  run {r}  fabric {kind:5}  "
                + (f"check+gate {seconds:5.2f} s of {total:5.2f} s  {sorted(steps)}"
                   if out.ok else f"FAILED: {out.note[-160:]}"))
            records.append({"nodes": 2, "contender": "spark-vllm", "scenario": f"fabric-{kind}",
                            "run": r, "seconds": seconds, "total_s": total, "steps": steps,
                            "ok": out.ok and (kind == "rerun") == bool(steps),
                            "note": out.note[-600:]})
    _timeout(c, 90)
    return records


def table(records: list[dict[str, Any]]) -> list[str]:
    got = {k: [r for r in records if r["scenario"] == f"fabric-{k}" and r["ok"]]
           for k in ("rerun", "noop")}
    if not got["rerun"]:
        return []

    def med(rows: list[dict[str, Any]], key: str) -> str:
        return f"{statistics.median(r[key] for r in rows):.2f}" if rows else "–"

    return ["## The fabric check's cost on `up`", "",
            "2-node lab, runs interleaved: an `up` whose only change is `fabricCheck.timeout` "
            "(the check and its gate run again, nothing else) and a no-op `up`. The lab's image "
            "has no torch: the check ends at \"could not run\" (its fixed cost: SSH to each "
            "node, `docker run --rm`, the verdict, the gate); a real run adds the script's.", "",
            "| up | runs ok | check + gate, median s | whole `up`, median s |",
            "|---|---|---|---|",
            f"| the check runs again | {len(got['rerun'])} | {med(got['rerun'], 'seconds')} | "
            f"{med(got['rerun'], 'total_s')} |",
            f"| no-op | {len(got['noop'])} | {med(got['noop'], 'seconds')} | "
            f"{med(got['noop'], 'total_s')} |", ""]
