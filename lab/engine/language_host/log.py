"""glog-style logging to stderr, only when the CLI flows its log flags to plugins
(`pulumi --logflow --logtostderr -v=N`): anything else this process writes on stderr is shown to
the user by the CLI, so by default it stays silent."""

from __future__ import annotations

import os
import sys
import time

_level = 0
_to_stderr = False


def configure(verbosity: int, to_stderr: bool) -> None:
    global _level, _to_stderr
    _level, _to_stderr = verbosity, to_stderr


def v(level: int, msg: str) -> None:
    if _to_stderr and _level >= level:
        t = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e6):06d}"
        print(f"I{stamp} {os.getpid()} pulumi-language-python(stand-in)] {msg}",
              file=sys.stderr, flush=True)
