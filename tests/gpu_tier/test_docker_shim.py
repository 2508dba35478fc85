"""lab/gpu/docker_shim.py held to what Docker does when a container is removed: once `docker rm
--force NAME` returns, nothing of that container acts any more, and the name is free for the
next one. A CI run of the fidelity test found the shim's supervisor (the process that waits for
a container's first process and records its exit code) writing that exit code after `rm` had
returned: the directory `rm` was removing was left with only that file, the name stayed "in
use", and each of the cache part's four starts failed with 125. Needs root (`unshare`), as CI
has."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "lab" / "gpu" / "docker_shim.py"


def docker(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SHIM_STATE": str(tmp / "state"), "SHIM_VOLUMES": str(tmp / "vols")}
    return subprocess.run([sys.executable, str(SHIM), *argv], env=env, capture_output=True,
                          text=True, timeout=60)


def supervisors(name: str) -> list[int]:
    """The shim's supervisor processes of container `name`, found by their command line."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if p.name.isdigit() and b"_supervise" in argv and name.encode() in argv:
            out.append(int(p.name))
    return out


def test_a_removed_containers_supervisor_never_touches_the_next_one_of_its_name(
        tmp_path: Path) -> None:
    name = f"shim-test-{os.getpid()}"
    try:
        assert docker(tmp_path, "run", "--detach", "--name", name, "img", "sleep", "300"
                      ).returncode == 0
        old = supervisors(name)
        assert len(old) == 1, old
        # the supervisor held back, as a loaded machine holds it: it has not seen its
        # container's end when `rm` returns
        os.kill(old[0], signal.SIGSTOP)
        rm = docker(tmp_path, "rm", "--force", name)
        assert rm.returncode == 0, rm.stderr
        run = docker(tmp_path, "run", "--detach", "--name", name, "img", "sleep", "300")
        assert run.returncode == 0, run.stderr
        try:
            os.kill(old[0], signal.SIGCONT)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and old[0] in supervisors(name):
            time.sleep(0.05)
        state = docker(tmp_path, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                       name)
        assert state.stdout.split() == ["running", "0"], state.stdout + state.stderr
    finally:
        docker(tmp_path, "rm", "--force", name)
    # and nothing of either container is left: the name is free
    assert not (tmp_path / "state" / name).exists(), list((tmp_path / "state").iterdir())
    assert not supervisors(name)
