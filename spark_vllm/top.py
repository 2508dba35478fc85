"""`spark-vllm top`: a live view of the stack, refreshed every --interval seconds (textual).

    spark-vllm top [--stack S] [--interval 5] [--once]

Per node: reachable or not, each spark-vllm container's state, GPU memory (used/total; on GB10
the unified memory, from /proc/meminfo), Ray's view. vLLM: serving / busy / wedged / dead (the
verdicts of `spark-vllm status`), running and waiting requests, KV-cache usage, prompt and
generation tokens/s (rates of vLLM's /metrics counters, read with the stack's API key), the
fabric check's last verdict and the last repairs of `status --watch`. Keys: l shows the next
container's last log lines, r refreshes now, q quits. It never changes anything. --once prints
one screen as text and exits (for a script, or a terminal without a TUI).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import errors, top_data
from .components import ssh
from .status import select_stack
from .status_report import config_secret, node_target

LOG_LINES = 15


def container_log(snap: top_data.Snapshot, index: int) -> tuple[str, str]:
    """(title, text) of the index-th container's last log lines, read over SSH."""
    report = snap.report
    if report is None or not report.containers:
        return "logs", "no container to show"
    c = report.containers[index % len(report.containers)]
    node = next(n for n in report.nodes if n["name"] == c.node)
    title = f"{c.node} {c.role}: last {LOG_LINES} log lines (l: next container)"
    if c.node in report.unreachable:
        return title, f"{c.node} is unreachable: {report.unreachable[c.node]}"
    try:
        proc = ssh.run(node_target(node, report.key),
                       f"docker logs --tail {LOG_LINES} {shlex.quote(c.name)} 2>&1", timeout=20)
    except ssh.NodeUnreachableError as err:
        return title, f"cannot read the logs: {err}"
    return title, proc.stdout.rstrip() or "(no output)"


def make_app(stack: Any, api_key: str | None, interval: float) -> Any:
    """The textual app (run it with .run(); a test drives it with .run_test()). The nodes are
    read in daemon threads of its own, not textual's workers: a read that waits on a cut
    node's SSH (up to its dial timeouts) never holds `q` back."""
    from textual.app import App, ComposeResult
    from textual.containers import VerticalScroll
    from textual.widgets import Static

    class Top(App[int]):
        BINDINGS = [("q", "quit", "quit"), ("l", "logs", "logs"), ("r", "refresh", "refresh")]
        CSS = "#logs { border-top: solid gray; height: auto; max-height: 50%; }"

        def __init__(self) -> None:
            super().__init__()
            self.snap: top_data.Snapshot | None = None
            self.log_index = -1
            self.reading = threading.Event()  # a read of the nodes is under way

        def in_background(self, read: Callable[[], Any], then: Callable[[Any], None]) -> None:
            def run() -> None:
                result = read()
                with contextlib.suppress(RuntimeError):  # the app has quit meanwhile
                    self.call_from_thread(then, result)

            threading.Thread(target=run, daemon=True).start()

        def compose(self) -> ComposeResult:
            with VerticalScroll():
                yield Static(f"spark-vllm top: stack {stack.name}: reading the nodes…",
                             id="screen", markup=False)
            yield Static("", id="logs", markup=False)

        def on_mount(self) -> None:
            self.query_one("#logs", Static).display = False
            self.refresh_data()
            self.set_interval(interval, self.refresh_data)

        def refresh_data(self) -> None:
            if self.reading.is_set():  # the last read is still going: one at a time
                return
            self.reading.set()
            previous = self.snap

            def read() -> top_data.Snapshot:
                try:
                    return top_data.snapshot(stack, api_key, previous)
                except Exception as err:  # noqa: BLE001 - a line on the screen, then a retry
                    return top_data.Snapshot(stack.name, time.strftime("%T"),
                                             problem=f"{type(err).__name__}: {err}")

            self.in_background(read, self.show)

        def show(self, snap: top_data.Snapshot) -> None:
            self.reading.clear()
            self.snap = snap
            self.query_one("#screen", Static).update("\n".join(top_data.render(snap)))

        def action_refresh(self) -> None:
            self.refresh_data()

        def action_logs(self) -> None:
            if self.snap is None:
                return
            self.log_index += 1
            snap, index = self.snap, self.log_index
            self.in_background(lambda: "\n".join(container_log(snap, index)), self.show_logs)

        def show_logs(self, text: str) -> None:
            logs = self.query_one("#logs", Static)
            logs.display = True
            logs.update(text)

    return Top()


def main(argv: list[str] | None = None, prog: str = "spark-vllm top") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", help="stack name (default: the selected stack)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between reads (5)")
    ap.add_argument("--once", action="store_true", help="print one screen as text and exit")
    args = ap.parse_args(argv)
    if args.interval < 1:
        ap.error("--interval: at least 1 second")
    try:
        stack = select_stack(args.stack)
        api_key = config_secret(stack, "apiKey")
        if args.once:
            print("\n".join(top_data.render(top_data.snapshot(stack, api_key, None))))
            return 0
        try:
            import textual  # noqa: F401
        except ImportError:
            print("top: textual is not installed\n  what to do: pip install 'spark-vllm[top]' "
                  "into spark-vllm's venv (or use --once)", file=sys.stderr)
            return 2
        return int(make_app(stack, api_key, args.interval).run() or 0)
    except errors.CliError as err:
        print(err.text("top"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
