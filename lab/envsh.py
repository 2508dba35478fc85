"""The environment `source lab/env.sh` gives a user: the engine (CLI, language host, command
provider) on PATH, the lab's file backend and passphrase. Tests and the bench run the engine in
exactly this environment, so what they measure is what `make demo` does."""

from __future__ import annotations

import subprocess

from lab.config import REPO_DIR


def sourced() -> dict[str, str]:
    """The whole environment after `source lab/env.sh` (raises with env.sh's own words)."""
    r = subprocess.run(["bash", "-c", "source lab/env.sh >/dev/null && env -0"], cwd=REPO_DIR,
                       capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"`source lab/env.sh` failed (exit {r.returncode}; is the Pulumi CLI "
                           f"built? make tools): {r.stderr.decode(errors='replace')[-2000:]}")
    return dict(kv.split("=", 1) for kv in r.stdout.decode().split("\0") if "=" in kv)
