"""`spark-vllm status`: is the stack serving, and if not, what is down where.

Reads what Pulumi knows (the stack's outputs: nodes, container ids, endpoint; its config: the
same SSH key and API key the program uses) and asks the nodes what is true now: each
container's state, Ray's own node table, and vLLM itself, with the same check as `pulumi
refresh` (scripts/vllm_liveness.py, in the vLLM container): /health, then a canary of one
streamed token and vLLM's token counter. vLLM is then *serving* (the canary's token came),
*busy* (no token yet, but vLLM generates: a long queue, left alone), *wedged* (no token and
the counter stood still: replaced by a repair), *not serving* (an error), or *dead* (its
container exited, with any code: a dead rank makes vLLM exit 0). Prints one line per
container and a verdict; exits 0 when serving, 1 when not, 2 when it cannot tell; `--watch`
exits 3 when it stopped for a person.

`--watch` repairs: every `--interval` s, when the verdict is not serving, it runs
`pulumi up --refresh` (only what died or wedged and what depends on it is replaced). Before
each repair it stops a wedged vLLM and reads every node's free GPU memory: a node whose memory
did not come back after the old vLLM stopped is refused, with its numbers (a restart there
fails, or leaks more). After `--max-repairs` repairs within `--repair-window` s it stops and
says the node may need a reboot: repeated vLLM restarts leaked unified memory on a DGX Spark
until it needed a physical reset (eugr/spark-vllm-docker#257, ~35 automatic restarts). Run it
under systemd (docs/operations.md).

`--fabric` runs the stack's fabric check now (components/fabric_check.py: the command it
deployed, on every node at once) and judges it against the baseline the stack holds, without
moving that baseline or touching what runs (the check has its own containers and port). Its
figures are taken beside the serving deployment, whose traffic shares the fabric.

Needs what `pulumi` needs: the CLI on PATH, the backend and passphrase in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import errors
from .components.secret_check import NAMESPACE
from .status_report import (
    ContainerView,
    Report,
    _ask_vllm,
    api_role,
    classify,
    collect,
    config_secret,
    image_mismatch,
    liveness_check,
)
from .status_watch import MEMORY_WAIT_S, watch

# what callers read here (cli.py, the tests): the report itself lives in status_report
__all__ = [
    "ContainerView",
    "Report",
    "_ask_vllm",
    "api_role",
    "classify",
    "collect",
    "config_secret",
    "fabric",
    "image_mismatch",
    "liveness_check",
    "main",
    "project_dir",
    "select_stack",
    "state_resources",
]


def project_dir() -> Path:
    """The Pulumi project the stack belongs to: `spark-vllm --cwd`/the one found upwards (the
    CLI sets SPARK_VLLM_PROJECT), else the current directory."""
    return Path(os.environ.get("SPARK_VLLM_PROJECT") or Path.cwd())


def select_stack(stack_name: str | None) -> Any:
    from pulumi import automation as auto

    work_dir = str(project_dir())
    try:
        ws = auto.LocalWorkspace(work_dir=work_dir)
        if stack_name is None:
            current = ws.stack()
            if current is None:
                raise errors.CliError("no stack selected",
                                      "pass --stack NAME (`pulumi stack ls` lists them)")
            stack_name = current.name
        return auto.select_stack(stack_name=stack_name, work_dir=work_dir)
    except auto.CommandError as err:
        raise errors.from_pulumi(err, f"selecting stack {stack_name or '(selected)'}") from None


def state_resources(stack: Any) -> list[dict[str, Any]]:
    """Every resource the stack's state holds (`pulumi stack export`)."""
    from pulumi import automation as auto

    try:
        return list(stack.export_stack().deployment.get("resources") or [])
    except auto.CommandError as err:
        raise errors.from_pulumi(err, f"reading the state of stack {stack.name}") from None


FABRIC_CHECK_NAME = "fabric-check"  # components/fabric_check.py: the check's dynamic resource


def fabric(stack: Any) -> tuple[int, dict[str, Any], str]:
    """`--fabric`: the stack's fabric check, run now on every node (its deployed command, the
    stack's key), judged against the baseline the stack holds; the baseline is not moved and
    nothing that runs is touched: the check's containers have their own name and port
    (masterPort+10), and end with it. Exit 0: passed; 1: refused or degraded; 2: no verdict
    (it could not run, or the stack has none)."""

    from .components import fabric_check

    key = config_secret(stack, "sshPrivateKey")
    if key is None:
        raise LookupError(f"stack {stack.name}: {NAMESPACE}:sshPrivateKey is not set")
    resources = state_resources(stack)
    found = next((r for r in resources if r.get("urn", "").endswith(f"::{FABRIC_CHECK_NAME}")
                  and r.get("type") == "pulumi-python:dynamic:Resource"), None)
    if found is None:
        raise LookupError(f"stack {stack.name} has no fabric check: one node (no fabric), or "
                          "deployed by a spark-vllm without it (`pulumi up` adds it)")
    props, outs = found.get("inputs") or {}, found.get("outputs") or {}
    baseline = outs.get("baseline") or None
    verdict, when = fabric_check.measure(fabric_check.targets(props, key),
                                         fabric_check.settings_of(props), baseline)
    code = {"pass": 0, "warn": 1, "refuse": 1}.get(verdict.outcome, 2)
    if verdict.outcome == "warn" and "could not run" in verdict.message:
        code = 2
    report = {"stack": stack.name, "checkedAt": when, "outcome": verdict.outcome,
              "message": verdict.message, "pairs": verdict.pairs,
              "baseline": baseline, "lastUp": {k: outs.get(k) for k in ("outcome", "checkedAt")}}
    lines = [f"stack {stack.name}: fabric check, {when}", verdict.message]
    for p in verdict.pairs if verdict.outcome in ("pass", "warn") else []:
        lines.append(f"  {p.get('pair')}: 8 KiB {p.get('latency8kUs')} µs, 64 KiB "
                     f"{p.get('latency64kUs')} µs, bus bandwidth {p.get('busBandwidthGBs')} GB/s, "
                     f"{p.get('transport')}")
    lines.append("(run beside the deployment: its traffic shares the fabric and can lower these "
                 "figures; the stack's baseline is kept as it is)")
    return code, report, "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m spark_vllm.status") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", help="stack name (default: the selected stack)")
    ap.add_argument("--json", action="store_true", help="machine-readable report")
    ap.add_argument("--watch", action="store_true", help="repair with `pulumi up --refresh`")
    ap.add_argument("--interval", type=float, default=60, help="seconds between checks (60)")
    ap.add_argument("--max-repairs", type=int, default=3,
                    help="repairs within --repair-window before it stops (3)")
    ap.add_argument("--repair-window", type=float, default=3600,
                    help="seconds over which repairs are counted (3600)")
    ap.add_argument("--memory-wait", type=float, default=MEMORY_WAIT_S,
                    help="seconds a stopped vLLM's memory may take to come back (30)")
    ap.add_argument("--max-backoff", type=float, default=900, help="longest wait, s (900)")
    ap.add_argument("--fabric", action="store_true",
                    help="run the fabric check now, against the stack's baseline (exit 0 "
                         "passed, 1 refused or degraded, 2 no verdict)")
    args = ap.parse_args(argv)
    try:
        stack = select_stack(args.stack)
        if args.fabric:
            code, found, text = fabric(stack)
            print(json.dumps(found, indent=2) if args.json else text)
            return code
        if args.watch:
            return watch(stack, args.interval, args.max_repairs, args.max_backoff,
                         args.repair_window, args.memory_wait)
        report = collect(stack)
    except LookupError as err:
        print(f"status: {err}", file=sys.stderr)
        return 2
    except errors.CliError as err:
        print(err.text("status"), file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    return 0 if report.serving else 1


if __name__ == "__main__":
    sys.exit(main())
