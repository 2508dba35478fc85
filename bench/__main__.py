"""`python -m bench` (`make bench`): spark-vllm against Ray's cluster launcher and the bare
critical path on the lab, then the scale of `pulumi preview`. See bench/README.md."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench import fabric, image_copy, incident, machine, outputs, preview_scale, scenarios, staging
from bench.common import STACK, Lab, dump_json, lab_up, say, snapshot
from bench.contenders import Contender
from bench.contenders.bare import Bare
from bench.contenders.launcher import Launcher
from bench.contenders.spark_vllm import SparkVllm, SparkVllmNative
from bench.contenders.sparkrun import Sparkrun
from bench.stats import completeness
from lab import cluster, config, envsh
from spark_vllm.components.spec import DEFAULT_RAY_TIMEOUT_S

RESULTS, README = outputs.RESULTS, outputs.README
CHOICES = ("spark-vllm", "launcher", "bare", "spark-vllm-native", "sparkrun")
# --only backends: cold up and env change, Ray against native, recorded side by side
BACKENDS = "backends"
# Container name prefixes of the contenders (spark-vllm's stack, the bare path, ray up, sparkrun).
OURS = (f"spark-vllm-{STACK}-", "spark-vllm-bare-", "spark-bench-ray", "sparkrun_")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--runs", type=int, default=5, help="runs per scenario (default %(default)s)")
    ap.add_argument("--nodes", default="2,4", help="lab sizes, in order (default %(default)s)")
    ap.add_argument("--only", choices=[*scenarios.SCENARIOS, "preview", "staging", "copy",
                                       "image", "fabric", BACKENDS, "estimators"],
                    help="one scenario (its prerequisite steps run untimed-in-the-report)")
    ap.add_argument("--contenders", default=",".join(CHOICES),
                    help="comma-separated subset of %(default)s")
    ap.add_argument("--quick", action="store_true", help="--runs 1 --nodes 2")
    ap.add_argument("--join-cap", type=float, default=60,
                    help="seconds to wait for the launcher/bare path to report a worker that "
                         "cannot join (default %(default)s)")
    ap.add_argument("--no-preview", action="store_true", help="skip the pulumi preview scale")
    ap.add_argument("--report", metavar="JSON",
                    help="only write a result's outputs again: latest.* and the README's table "
                         "for a full run, <its stamp>.md/png for a partial one")
    ap.add_argument("--readme", action="store_true",
                    help="only write bench/README.md's table again, from results/latest.json")
    return ap


def _contenders(names: list[str], lab: Lab) -> list[Contender]:
    stack_file = config.stack_file(STACK)
    made: dict[str, Contender] = {}
    for name in names:
        if name == "spark-vllm":
            made[name] = SparkVllm(lab, stack_file)
        elif name == "launcher":
            made[name] = Launcher(lab)
        elif name == "bare":
            made[name] = Bare(lab, stack_file)
        elif name == "spark-vllm-native":
            made[name] = SparkVllmNative(lab, stack_file)
        elif name == "sparkrun":
            made[name] = Sparkrun(lab)
    return [made[n] for n in names]


def _bench_lab(n: int, names: list[str], args: argparse.Namespace, runs: list[dict[str, Any]],
               save: Any, staged: list[dict[str, Any]]) -> None:
    lab = lab_up(n)
    foreign = sorted({f"{node}/{name}" for node, st in snapshot(lab).items()
                      for name in st.names.values() if not name.startswith(OURS)})
    if foreign:  # they would hold the API and Ray ports: measuring now would measure them
        raise SystemExit(f"bench: containers of someone else run on the lab: {foreign}")
    contenders = _contenders(names, lab)
    for c in contenders:
        c.prepare()
    if args.only in (None, scenarios.INCIDENT) and len(lab.nodes) == 2:
        incident.load_v1_image(lab)  # once per lab, untimed
    try:
        for r in range(1, args.runs + 1):
            say(f"{n} nodes, run {r}/{args.runs}")
            if args.only == BACKENDS:
                # interleaved, the first one alternating: each run's two lifecycles share the
                # lab's state as evenly as two can
                for c in (contenders if r % 2 else list(reversed(contenders))):
                    runs += scenarios.lifecycle(c, lab, r, "env_change",
                                                record={"cold_up", "env_change"})
                    save()
            elif args.only not in (scenarios.JOIN, scenarios.INCIDENT, "staging", "copy", "image", "fabric"):
                for c in contenders:
                    runs += scenarios.lifecycle(c, lab, r, args.only)
                    save()
            if args.only in (None, scenarios.JOIN) and len(lab.nodes) >= 2:
                for c in contenders:
                    runs.append(scenarios.join_failure(c, lab, r, args.join_cap))
                    save()
            if args.only in (None, scenarios.INCIDENT) and len(lab.nodes) == 2:
                for c in contenders:
                    if (rec := scenarios.incident_run(c, lab, r, args.join_cap)) is not None:
                        runs.append(rec)
                        save()
        sv = next((c for c in contenders if isinstance(c, SparkVllm)), None)
        if args.only in (None, "staging") and len(lab.nodes) == 2 and sv is not None:
            say(f"model staging against plain rsync, {args.runs} run(s) each")
            staged += staging.run_all(sv, lab, args.runs)
            save()
        if args.only in (None, "fabric") and len(lab.nodes) == 2 and sv is not None:
            say(f"the fabric check on up: {args.runs} run(s)")
            staged += fabric.run_all(sv, args.runs)
            save()
        if args.only in (None, "copy") and len(lab.nodes) == 2 and sv is not None:
            say(f"model copy: N streams, one stream, raw TCP, {args.runs} run(s) each")
            staged += staging.copy_runs(sv, lab, args.runs)
            save()
        if args.only in (None, "image") and len(lab.nodes) == 2 and sv is not None:
            say(f"image copy: SSH, raw TCP, the plain pipe, {args.runs} run(s) each")
            staged += image_copy.copy_runs(sv, lab, args.runs)
            save()
    finally:
        cluster.unblock_fabric(lab.nodes[0].name, lab.nodes[1].name)
        for c in contenders:
            c.clean()
        for c in contenders:
            if isinstance(c, SparkVllm):
                c.forget()


def write_outputs(result: dict[str, Any], stamp: str, write_json: bool = True) -> Path:
    """bench/outputs.py: latest.* and the README's table only for a full run."""
    md = outputs.write_outputs(result, stamp, results=RESULTS, readme=README,
                               write_json=write_json)
    say(outputs.written(result, md))
    return md


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.only == "estimators":  # no lab: bench/estimators.py
        from bench import estimators
        return estimators.main(RESULTS)
    # Stopped from outside (SIGTERM): clean up like Ctrl-C — contenders torn down, fabric
    # unblocked, the stack removed, what was measured written.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.report:
        source = Path(args.report)
        result = json.loads(source.read_text())
        write_outputs(result, outputs.stamp_of(result, source), write_json=False)
        return 0
    if args.readme:
        say(f"bench/README.md's table from {outputs.readme_from_latest(RESULTS, README)}")
        return 0
    if args.quick:
        args.runs, args.nodes = 1, "2"
    sizes = [int(x) for x in args.nodes.split(",") if x]
    names = [x for x in args.contenders.split(",") if x]
    if args.only == BACKENDS:
        names = ["spark-vllm", "spark-vllm-native"]
    if bad := [x for x in names if x not in CHOICES]:
        print(f"unknown contender(s): {bad}; choose from {CHOICES}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    defaults = [x for x in _parser().get_default("contenders").split(",") if x]
    result: dict[str, Any] = {
        "stamp": stamp,
        # until the run ends: a JSON saved on the way (or left by a crash) is no full run
        "complete": False, "incomplete": ["still running or stopped by an error"],
        "machine": machine.describe(envsh.sourced()),
        "config": {"runs": args.runs, "nodes": sizes, "contenders": names, "only": args.only,
                   "join_cap_s": args.join_cap, "ray_timeout_s": DEFAULT_RAY_TIMEOUT_S,
                   "stack": STACK},
        "runs": [],
        "preview": [],
        "staging": [],
    }

    def save() -> None:
        dump_json(RESULTS / f"{stamp}.json", result)

    say(f"bench: runs {args.runs}, nodes {sizes}, contenders {names}, only {args.only or 'all'}")
    interrupted = False
    try:
        if args.only != "preview":
            for n in sizes:
                _bench_lab(n, names, args, result["runs"], save, result["staging"])
        if not args.no_preview and args.only in (None, "preview") and "spark-vllm" in names:
            say("pulumi preview: 2, 8, 32 nodes")
            result["preview"] = preview_scale.run_all(args.runs)
    except KeyboardInterrupt:
        say("interrupted: writing what was measured")
        interrupted = True
    result["complete"], result["incomplete"] = completeness(args.only, names, defaults,
                                                            interrupted, args.runs)
    if args.only == BACKENDS:
        result["backends"] = scenarios.backends_summary(result["runs"])
        for line in result["backends"]["lines"]:
            say(line)
    md = write_outputs(result, stamp)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
