"""Where a `pulumi` command's time goes.

The CLI runs with `--json`: one engine event per line, written as it happens. Each line is
stamped on arrival (the events' own timestamps are whole seconds), which splits the wall time
into: before the program registers its first resource (CLI, backend, language host, program
import), before the first remote command (plugin load, diff), the remote commands themselves
(SSH + what runs on the node: container start, the waits), and after the last one (outputs,
state write, exit).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO, Result

REMOTE_TYPE = "command:remote:Command"
FABRIC_CHECK = "fabric-check"


def run_stamped(argv: Sequence[str], *, timeout: float, env: dict[str, str],
                stdin: str | None = None, log: Path | None = None,
                ) -> tuple[Result, list[tuple[float, str]]]:
    """Run argv, stamping every output line with seconds since start; kill at `timeout`."""
    t0 = time.monotonic()
    proc = subprocess.Popen(list(argv), cwd=REPO, env=env, text=True, bufsize=1,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    if stdin is not None and proc.stdin is not None:
        proc.stdin.write(stdin)
        proc.stdin.close()
    # The whole process group: pulumi's plugins must not outlive it and hold the pipe open.
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))
        rc = proc.wait()
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): let pulumi cancel and release the stack's lock, so the
        # cleanup that follows (pulumi destroy) can run; kill it if it does not stop.
        timer.cancel()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    timed_out = not timer.is_alive() and rc < 0
    timer.cancel()
    seconds = time.monotonic() - t0
    text = "\n".join(_readable(line) for _, line in lines)
    if timed_out:
        rc, text = 124, text + f"\n[bench] timed out after {timeout:.0f} s"
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"\n$ {shlex.join(argv)}  # rc={rc} {seconds:.2f}s\n{text}\n")
    return Result(rc, text, seconds), lines


def _event(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    return ev if isinstance(ev, dict) else None


def _readable(line: str) -> str:
    """A JSON event as the text a user would read (diagnostics only); other lines as they are."""
    ev = _event(line)
    if ev is None:
        return line
    diag = ev.get("diagnosticEvent")
    if diag and diag.get("severity") != "debug":
        return str(diag.get("prefix", "")) + str(diag.get("message", "")).rstrip("\n")
    summary = ev.get("summaryEvent")
    if summary:
        return f"summary: {summary.get('result')} {summary.get('resourceChanges')}"
    return ""


def summarize(lines: list[tuple[float, str]], total: float) -> dict[str, Any]:
    """Phases and per-command durations of one CLI run (see the module docstring)."""
    program_start = None
    starts: dict[str, tuple[float, str]] = {}
    steps: dict[str, dict[str, Any]] = {}
    summary_at = None
    changes: dict[str, int] = {}
    for t, line in lines:
        ev = _event(line)
        if ev is None:
            continue
        diag = ev.get("diagnosticEvent") or {}
        if program_start is None and "registering resource" in str(diag.get("message", "")):
            program_start = t
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            meta = (ev.get(kind) or {}).get("metadata")
            if not meta:
                continue
            name = meta["urn"].split("::")[-1]
            # the fabric check works from its dynamic resource (components/fabric_check.py);
            # the other dynamic resources (liveness companions) touch no node on an `up`
            if meta.get("type") != REMOTE_TYPE and name != FABRIC_CHECK:
                continue
            op = meta.get("op", "?")
            if kind == "resourcePreEvent":
                starts[f"{name}:{op}"] = (t, op)
            elif f"{name}:{op}" in starts:
                t_start, _ = starts.pop(f"{name}:{op}")
                if op != "same":
                    steps[f"{op} {name}"] = {"start": round(t_start, 2), "s": round(t - t_start, 2),
                                             "failed": kind == "resOpFailedEvent"}
        if "summaryEvent" in ev:
            summary_at = t
            changes = ev["summaryEvent"].get("resourceChanges") or {}
    intervals = sorted((s["start"], s["start"] + s["s"]) for s in steps.values())
    busy = _union(intervals)
    first = intervals[0][0] if intervals else None
    last = max((b for _, b in intervals), default=None)
    return {
        "total_s": round(total, 2),
        "program_start_s": _r(program_start),
        "first_remote_s": _r(first),
        "remote_busy_s": round(busy, 2),
        "after_last_remote_s": _r(total - last if last is not None else None),
        "summary_to_exit_s": _r(total - summary_at if summary_at is not None else None),
        "remote_commands": len(steps),
        "changes": changes,
        "steps": steps,
    }


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in intervals:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)
