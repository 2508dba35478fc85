"""Subprocess helpers and step-by-step progress with elapsed seconds."""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

# Legacy builder, explicitly: the host's docker CLI may be newer than Debian's daemon and
# without the buildx plugin (BuildKit would then fail rather than fall back).
DOCKER_ENV = {**os.environ, "DOCKER_BUILDKIT": "0", "DOCKER_CLI_HINTS": "false"}


class LabError(RuntimeError):
    """A lab operation failed; the message says which command and why."""


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    capture: bool = True,
    input: str | bytes | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    stdin: IO[bytes] | int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv; on failure raise LabError with its stderr (never a shell string)."""
    text_input = input.decode() if isinstance(input, bytes) else input
    try:
        proc = subprocess.run(
            list(argv),
            input=text_input,
            stdin=stdin if text_input is None else None,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            text=True,
            timeout=timeout,
            env=env or DOCKER_ENV,
        )
    except subprocess.TimeoutExpired as e:
        raise LabError(f"timed out after {timeout}s: {shlex.join(argv)}") from e
    except FileNotFoundError as e:
        raise LabError(f"not found: {argv[0]} (run lab/system-deps.sh)") from e
    if check and proc.returncode != 0:
        err = (proc.stderr or "").strip() if capture else ""
        raise LabError(f"exit {proc.returncode}: {shlex.join(argv)}" + (f"\n{err}" if err else ""))
    return proc


def docker(*args: str, check: bool = True, timeout: float | None = 120) -> str:
    """`docker ARGS`, stdout stripped."""
    return run(["docker", *args], check=check, timeout=timeout).stdout.strip()


def docker_ok(*args: str) -> bool:
    return run(["docker", *args], check=False, timeout=60).returncode == 0


class Progress:
    """Prints `[ 12.3s] step … done (4.5s)` lines to stderr; quiet=True prints nothing."""

    def __init__(self, quiet: bool = False) -> None:
        self.t0 = time.monotonic()
        self.quiet = quiet
        self.timings: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.say(f"{name} …")
        t = time.monotonic()
        try:
            yield
        except BaseException:
            self.say(f"{name} FAILED after {time.monotonic() - t:.1f}s")
            raise
        dt = time.monotonic() - t
        self.timings[name] = round(dt, 2)
        self.say(f"{name} done ({dt:.1f}s)")


def run_logged(argv: Sequence[str], log: Path, *, timeout: float, what: str) -> None:
    """Run a long command with its output in a log file; on failure show the log's tail."""
    with log.open("w") as fh:
        try:
            rc = subprocess.run(list(argv), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=DOCKER_ENV, timeout=timeout).returncode
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{what}: timed out after {timeout}s (log: {log})") from e
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise LabError(f"{what} failed, exit {rc} (full log: {log}):\n{tail}")


@contextmanager
def exclusive(lock_file: Path, what: str, progress: Progress) -> Iterator[None]:
    """One `up`/`down` at a time on this machine (tests may start several)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.say(f"waiting for another lab {what} to finish ({lock_file})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
