"""`spark-vllm status --watch`: check the stack every --interval and repair it with
`pulumi up --refresh` when it does not serve, within bounds a person sets: a window of repairs,
a backoff, and a still-running vLLM's memory seen coming back before another starts
(docs/operations.md, "Unattended repair"). What it checks is status.collect's report."""

from __future__ import annotations

import shlex
import time
from typing import Any

from . import top_data
from .components import node_memory, ssh
from .status_report import Report, api_role, collect, node_target


def _repair(stack: Any) -> bool:
    from pulumi import automation as auto

    print(f"[status] repairing: pulumi up --refresh --stack {stack.name}", flush=True)
    try:
        stack.up(refresh=True, on_output=lambda line: print(f"    {line}", flush=True))
    except auto.CommandError as err:
        print(f"[status] repair failed: {str(err).strip().splitlines()[-1:]}", flush=True)
        return False
    return True


MEMORY_WAIT_S = 30  # how long the memory of a stopped vLLM may take to come back
# --watch stopped for a person (too many repairs, or memory that did not come back): a systemd
# unit keeps it down with RestartPreventExitStatus=3 (docs/operations.md)
NEEDS_A_PERSON = 3


def stop_vllm(report: Report) -> None:
    """A wedged (or otherwise failing) vLLM that still runs holds its memory: stop it, so that
    the memory check sees what a new vLLM would get. The repair replaces it either way (its
    liveness reads "exited"). A container that no longer runs is left as it is."""
    if report.models:  # several models: each failing one's API server, on its own node
        for m in report.models:
            running = [c for c in report.containers if c.name == m.container
                       and c.state == "running"]
            if not m.ok and running:
                print(f"[status] stopping {m.container} on {m.node['name']} ({m.state}) "
                      "before the repair, so that its memory is seen coming back", flush=True)
                ssh.run(node_target(m.node, report.key),
                        f"docker stop -t 30 {shlex.quote(m.container)} >/dev/null",
                        timeout=60 + 2 * ssh.CONNECT_TIMEOUT_S)
        return
    head = report.nodes[0]
    name = head["containers"][api_role(head)]
    vllm = [c for c in report.containers if c.role == api_role(head)]
    if vllm and vllm[0].state == "running":
        print(f"[status] stopping {name} on {head['name']} ({report.vllm_state}) before the "
              "repair, so that its memory is seen coming back", flush=True)
        ssh.run(node_target(head, report.key), f"docker stop -t 30 {shlex.quote(name)} >/dev/null",
                timeout=60 + 2 * ssh.CONNECT_TIMEOUT_S)


def memory_problems(report: Report, wait_s: float = MEMORY_WAIT_S) -> list[str]:
    """Every node whose free GPU memory stays below what vLLM needs to start, after waiting
    up to `wait_s` for it to come back; [] when all have it (or cannot say: no nvidia-smi)."""
    # several models: each failing model's share, on its own nodes (the others keep theirs)
    needs = {n["name"]: report.gpu_memory_utilization for n in report.nodes}
    if report.models:
        needs = {}
        for m in report.models:
            if not m.ok:
                for name in m.nodes:
                    needs[name] = needs.get(name, 0.0) + m.utilization
    deadline = time.monotonic() + wait_s
    while True:
        short = []
        for node in report.nodes:
            util = needs.get(node["name"])
            if util is None:
                continue
            try:
                proc = ssh.run(node_target(node, report.key), node_memory.SCRIPT, timeout=30)
            except ssh.NodeUnreachableError as err:
                short.append(f"{node['name']}: memory unknown ({err})")
                continue
            gpus = node_memory.parse(proc.stdout)
            if gpus is not None and (why := node_memory.shortfall(node["name"], gpus, util)):
                short.append(why)
        if not short or time.monotonic() >= deadline:
            return short
        time.sleep(2.0)


def watch(stack: Any, interval: float, max_repairs: int, max_backoff: float,
          repair_window: float = 3600, memory_wait_s: float = MEMORY_WAIT_S) -> int:
    repairs: list[float] = []  # when each repair started (monotonic)
    failures = 0
    while True:
        report = collect(stack)
        stamp = time.strftime("%F %T")
        if report.serving:
            detail = " (busy: " + report.vllm + ")" if report.vllm_state == "busy" else ""
            print(f"[status] {stamp} serving{detail}", flush=True)
            failures, wait = 0, interval
        elif report.nodes_ok:
            # the nodes are fine; only this machine cannot reach the endpoint: not a repair
            print(f"[status] {stamp} the nodes serve, but {report.endpoint_check}; "
                  "not repairing (check the network between here and the head)", flush=True)
            wait = interval
        else:
            print(f"[status] {stamp} NOT SERVING: {'; '.join(report.problems())}", flush=True)
            now = time.monotonic()
            repairs = [t for t in repairs if now - t < repair_window]
            if len(repairs) >= max_repairs:
                print(f"[status] stopping: {len(repairs)} repairs in the last "
                      f"{repair_window / 60:.0f} min and still not serving. A node may need a "
                      "reboot: vLLM restarted again and again can leak unified memory until "
                      "only a reset frees it (eugr/spark-vllm-docker#257: ~35 automatic "
                      "restarts left a DGX Spark needing a physical reset). Check each node's "
                      "free memory (nvidia-smi, /proc/meminfo), reboot the one that lost it, "
                      f"then run `pulumi up --refresh --stack {stack.name}`.", flush=True)
                return NEEDS_A_PERSON
            # a node that does not answer: touch nothing (the repair fails naming it, and
            # counts); else stop a still-running vLLM and check that its memory came back
            short = []
            if not report.unreachable:
                stop_vllm(report)
                short = memory_problems(report, memory_wait_s)
            if short:
                print("[status] refusing to restart vLLM: the memory did not come back after "
                      f"the old vLLM stopped (waited {memory_wait_s:.0f} s):", flush=True)
                for line in short:
                    print(f"    {line}", flush=True)
                print("[status] a restart there would fail, or leak more; reboot that node, "
                      f"then run `pulumi up --refresh --stack {stack.name}`", flush=True)
                return NEEDS_A_PERSON
            repairs.append(time.monotonic())
            why = "; ".join(report.problems())[:200]
            if _repair(stack) and collect(stack).serving:
                print(f"[status] repaired: serving again ({len(repairs)} repair(s) in the "
                      f"last {repair_window / 60:.0f} min)", flush=True)
                top_data.record_repair(stack.name, why, "serving again")
                failures, wait = 0, interval
            else:
                top_data.record_repair(stack.name, why, "still not serving")
                failures += 1
                wait = min(interval * 2 ** failures, max_backoff)
                print(f"[status] next try in {wait:.0f} s ({len(repairs)}/{max_repairs} repairs "
                      f"in the window)", flush=True)
        time.sleep(wait)
