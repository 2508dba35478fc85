"""The machine line of a result: what ran the bench, so numbers are compared like with like."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from typing import Any

from bench.common import REPO


def _out(argv: list[str], env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (proc.stdout.strip() or proc.stderr.strip() or "?").splitlines()[0]


def _mem_gib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def _plugins(engine_env: dict[str, str]) -> str:
    """The plugins the engine loads, as `pulumi plugin ls` names them (kind name version)."""
    try:
        proc = subprocess.run(["pulumi", "plugin", "ls", "--json"], cwd=REPO, env=engine_env,
                              capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return "?"
    return ", ".join(f"{p['kind']} {p['name']} {p.get('version', '')}".strip()
                     for p in json.loads(proc.stdout or "[]"))


def describe(engine_env: dict[str, str]) -> dict[str, Any]:
    import ray

    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": os.cpu_count(),
        "mem_gib": _mem_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "docker": _out(["docker", "version", "--format", "{{.Server.Version}}"]),
        "ray": ray.__version__,
        "pulumi": _out(["pulumi", "version"], engine_env),
        "commit": _out(["git", "rev-parse", "--short", "HEAD"]),
        "engine": _plugins(engine_env),
    }
