"""Run one child process, streaming its output lines to a logger while collecting it.

Documented behaviour (pulumi_command 1.2.1, ``logging``): "If the command's stdout and stderr
should be logged. This doesn't affect the capturing of stdout and stderr as outputs ... Defaults
to logging both stdout and stderr." So both streams are captured as outputs whatever
``logging`` says, and, when it allows, each line goes to the engine while the command runs, as
an ephemeral info message (a resource's status line in ``pulumi up``). One reader thread per
stream.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

LineSink = Callable[[str], None]

# The engine kills a plugin with SIGKILL: util-linux's setpriv gives each child a parent-death
# signal, so no ssh keeps a remote command's session open behind a dead provider. (Not
# preexec_fn: forking with a callback is unsafe under gRPC's threads.)
_SETPRIV = shutil.which("setpriv")


def _with_pdeathsig(argv: Sequence[str]) -> list[str]:
    if _SETPRIV is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]


@dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str
    combined: str  # stdout and stderr interleaved as they arrived (for error messages)


class _Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.combined = bytearray()


def _pump(fd: int, buf: bytearray, col: _Collector, sink: LineSink | None) -> None:
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        with col.lock:
            col.combined += chunk
        if sink is not None:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                _emit(sink, line)
    if sink is not None and pending:
        _emit(sink, pending)
    os.close(fd)


def _emit(sink: LineSink, line: bytes) -> None:
    # bufio.ScanLines drops a trailing \r; the engine wants UTF-8
    text = line.removesuffix(b"\r").decode("utf-8", errors="replace")
    try:
        sink(text)
    except Exception:  # noqa: BLE001 - logging must never break the command
        pass


def run(argv: Sequence[str], *, env: Mapping[str, str], stdin: str | None,
        stdout_sink: LineSink | None, stderr_sink: LineSink | None, cwd: str | None = None,
        on_start: Callable[[subprocess.Popen[bytes]], None] | None = None) -> Completed:
    """Run argv to completion. ``stdin`` None or "" = no input (the real provider sets no stdin
    then: the command reads EOF)."""
    proc = subprocess.Popen(
        _with_pdeathsig(argv), env=dict(env), cwd=cwd,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
    if on_start is not None:
        on_start(proc)
    assert proc.stdout is not None and proc.stderr is not None
    col = _Collector()
    out, err = bytearray(), bytearray()
    # Own the fds: the readers close them; Popen must not read or close them too.
    out_fd, err_fd = os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno())
    proc.stdout.close()
    proc.stderr.close()
    threads = [
        threading.Thread(target=_pump, args=(out_fd, out, col, stdout_sink), daemon=True),
        threading.Thread(target=_pump, args=(err_fd, err, col, stderr_sink), daemon=True),
    ]
    if stdin:
        assert proc.stdin is not None
        data = stdin.encode()
        w = proc.stdin

        def feed() -> None:
            try:
                w.write(data)
            except (BrokenPipeError, OSError):
                pass  # the command did not read it all: like a Go io.Copy into a closed channel
            finally:
                try:
                    w.close()
                except OSError:
                    pass

        threads.append(threading.Thread(target=feed, daemon=True))
    for t in threads:
        t.start()
    rc = proc.wait()
    for t in threads:
        t.join()
    return Completed(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                     col.combined.decode("utf-8", "replace"))
