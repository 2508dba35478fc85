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


def test_rm_waits_for_the_supervisor_and_the_name_is_free_for_the_next(tmp_path: Path) -> None:
    name = f"shim-test-{os.getpid()}"
    try:
        assert docker(tmp_path, "run", "--detach", "--name", name, "img", "sleep", "300"
                      ).returncode == 0
        old = supervisors(name)
        assert len(old) == 1, old
        # the supervisor held back, as a loaded machine holds it: `rm` must not return before
        # it has ended (it kills what the container left and writes the exit code)
        os.kill(old[0], signal.SIGSTOP)
        env = {**os.environ, "SHIM_STATE": str(tmp_path / "state"),
               "SHIM_VOLUMES": str(tmp_path / "vols")}
        rm = subprocess.Popen([sys.executable, str(SHIM), "rm", "--force", name], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1)
        waited = rm.poll() is None
        os.kill(old[0], signal.SIGCONT)
        _, err = rm.communicate(timeout=60)
        assert waited, "rm returned while the container's supervisor had not ended"
        assert rm.returncode == 0, err
        assert old[0] not in supervisors(name)
        assert not (tmp_path / "state" / name).exists()  # the name is free
        run = docker(tmp_path, "run", "--detach", "--name", name, "img", "sleep", "300")
        assert run.returncode == 0, run.stderr
        time.sleep(0.5)
        state = docker(tmp_path, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                       name)
        assert state.stdout.split() == ["running", "0"], state.stdout + state.stderr
    finally:
        docker(tmp_path, "rm", "--force", name)
    assert not (tmp_path / "state" / name).exists(), list((tmp_path / "state").iterdir())
    assert not supervisors(name)


def mntns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def test_removing_an_exited_container_kills_nothing_that_took_its_namespace_number(
        tmp_path: Path) -> None:
    """A mount namespace's inode number is reused as soon as it is freed. The shim killed
    "every process in the container's namespace" by that number when it removed a container
    that had exited: in a CI run, a lab container's Ray head (SIGKILL, exit 137) that had been
    given the number next. A process in a new namespace takes the freed number here, and must
    outlive the removal."""
    name = f"shim-ns-{os.getpid()}"
    foreign: subprocess.Popen | None = None
    try:
        assert docker(tmp_path, "run", "--detach", "--name", name, "img", "sleep", "0.2"
                      ).returncode == 0
        deadline = time.monotonic() + 20
        while docker(tmp_path, "inspect", "--format", "{{.State.Status}}", name
                     ).stdout.strip() != "exited":
            assert time.monotonic() < deadline, "the container never exited"
            time.sleep(0.05)
        while supervisors(name):  # its supervisor has killed what was left, and ended
            assert time.monotonic() < deadline, "its supervisor never ended"
            time.sleep(0.05)
        was = (tmp_path / "state" / name / "mntns").read_text().strip()
        ours = mntns(os.getpid())
        for _ in range(20):  # the freed number, taken by a process of no container
            foreign = subprocess.Popen(["unshare", "--mount", "sleep", "60"])
            while mntns(foreign.pid) == ours:
                assert time.monotonic() < deadline, "unshare never entered its namespace"
                time.sleep(0.01)
            if mntns(foreign.pid) == was:
                break
            foreign.kill()
            foreign.wait()
            foreign = None
        if foreign is None:  # another process took the number first (a busy machine): the
            # removal must spare that one too; this test's own stands in for it
            foreign = subprocess.Popen(["unshare", "--mount", "sleep", "60"])
        rm = docker(tmp_path, "rm", "--force", name)
        assert rm.returncode == 0, rm.stderr
        time.sleep(0.3)
        assert foreign.poll() is None, "rm killed a process of no container"
    finally:
        if foreign is not None:
            foreign.kill()
            foreign.wait()
        docker(tmp_path, "rm", "--force", name)
