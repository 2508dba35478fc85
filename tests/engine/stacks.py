"""Stacks of inline programs on the engine under test (tests/engine/conftest.py), and what a run
did: the steps, the status lines as they came, the outputs, the error."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi.automation as auto
import pulumi_command as command

from tests.engine.conftest import Engine, Sshd


# --- stacks ----------------------------------------------------------------------------------------
@dataclass
class Run:
    ops: list[tuple[str, str]] = field(default_factory=list)  # (op, resource name), step start
    status: list[tuple[float, str, bool]] = field(default_factory=list)  # (t, msg, ephemeral)
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    done_at: dict[str, float] = field(default_factory=dict)

    def changed(self) -> list[tuple[str, str]]:
        return [(op, n) for op, n in self.ops if op != "same"]

    def lines(self) -> list[str]:
        return [m for _, m, _ in self.status]


class Stack:
    def __init__(self, engine: Engine, name: str, program: Callable[[], None],
                 env: dict[str, str] | None = None) -> None:
        self.engine = engine
        self.env = env or engine.env
        self.stack = auto.create_or_select_stack(name, "cmdprov", program=program,
                                                 opts=engine.workspace_opts(env))

    def _run(self, fn: Callable[..., Any]) -> Run:
        run = Run()
        t0 = time.monotonic()

        def on_event(ev: Any) -> None:
            now = time.monotonic() - t0
            if ev.resource_pre_event is not None:
                md = ev.resource_pre_event.metadata
                run.ops.append((md.op.value, md.urn.split("::")[-1]))
            if ev.res_outputs_event is not None:
                run.done_at[ev.res_outputs_event.metadata.urn.split("::")[-1]] = now
            d = ev.diagnostic_event
            if d is not None and d.severity in ("info", "warning", "error"):
                run.status.append((now, d.message.rstrip("\n"), bool(d.ephemeral)))

        try:
            res = fn(on_event=on_event)
            run.outputs = {k: v.value for k, v in getattr(res, "outputs", {}).items()}
        except auto.CommandError as e:
            run.error = str(e)
        run.seconds = time.monotonic() - t0
        return run

    def up(self) -> Run:
        return self._run(self.stack.up)

    def preview(self) -> Run:
        return self._run(self.stack.preview)

    def refresh(self) -> Run:
        return self._run(self.stack.refresh)

    def destroy(self) -> Run:
        return self._run(self.stack.destroy)

    def export(self) -> dict[str, Any]:
        """`pulumi stack export` as a user runs it (secrets stay encrypted; the Automation
        API's export_stack shows them)."""
        r = subprocess.run([str(Path(self.engine.pulumi_root, "bin", "pulumi")), "stack",
                            "export", "--stack", self.stack.name],
                           cwd=self.stack.workspace.work_dir, env=self.env,
                           capture_output=True, text=True, check=True)
        d: dict[str, Any] = json.loads(r.stdout)["deployment"]
        return d

    def resource(self, name: str) -> dict[str, Any]:
        for r in self.export().get("resources", []):
            if r["urn"].endswith("::" + name):
                return dict(r)
        raise KeyError(name)

    def remove(self) -> None:
        self.stack.workspace.remove_stack(self.stack.name, force=True)


def conn(s: Sshd, **kw: Any) -> Any:
    return command.remote.ConnectionArgs(host=kw.pop("host", "127.0.0.1"), port=s.port,
                                         user=s.user, private_key=pulumi.Output.secret(
                                             s.client_key), **kw)


def ops_log(engine: Engine, name: str) -> Path:
    p = engine.tmp / f"{name}.ops"
    p.write_text("")
    return p


