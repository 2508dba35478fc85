"""lab/dockerd.sh starts a daemon that outlives its caller: it must not keep the caller's
descriptors. A CI harness that waits for EOF on a pipe it passed on, or a `flock` wrapper whose
lock is an open descriptor, waited on the daemon's whole life (a CI run waited 10 min on it).

The daemon here is a stand-in on PATH (`dockerd` records its pid and becomes a `sleep` that
keeps the descriptors it was given; `docker info` answers once it has started; `pgrep` finds no
daemon), so the test runs the script's own start path whether or not a real engine runs on this
machine."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def stand_ins(bin_dir: Path, state: Path) -> None:
    bin_dir.mkdir()
    scripts = {
        # the daemon: its pid (the `sleep` it becomes keeps the descriptors it was given)
        "dockerd": f"#!/bin/sh\necho $$ > {state}/pid\nexec sleep 120\n",
        "docker": f"#!/bin/sh\n[ \"$1\" = info ] && [ -s {state}/pid ] && exit 0\n"
                  f"[ \"$1\" = version ] && echo 0.0-stand-in && exit 0\nexit 1\n",
        "pgrep": "#!/bin/sh\nexit 1\n",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


def read_to_eof(fd: int, seconds: float) -> bytes | None:
    """What the pipe's read end `fd` gives until EOF, or None if no EOF came in time."""
    os.set_blocking(fd, False)
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        if not chunk:
            return out
        out += chunk
    return None


def test_the_daemon_keeps_no_descriptor_of_its_caller(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stand_ins(tmp_path / "bin", state)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "SPARK_VLLM_DOCKERD_LOG": str(tmp_path / "dockerd.log"), "DOCKERD_WAIT": "20"}
    # the caller passes on a pipe's write end (as a harness that waits for its EOF does) and an
    # open file (as `flock` does its lock): the script must end, and the pipe read EOF, while
    # the daemon it started still runs
    r, w = os.pipe()
    lock = os.open(tmp_path / "lock", os.O_CREAT | os.O_WRONLY)
    pid = None
    try:
        proc = subprocess.Popen(["bash", str(REPO / "lab" / "dockerd.sh")], env=env,
                                stdout=w, stderr=w, pass_fds=(w, lock))
        os.close(w)
        out = read_to_eof(r, 30)
        if (state / "pid").exists():
            pid = int((state / "pid").read_text())
        assert out is not None, ("the pipe passed to dockerd.sh saw no EOF in 30 s: the daemon "
                                 "it started holds it")
        assert proc.wait(timeout=10) == 0, out.decode()
        assert b"dockerd: ready" in out, out.decode()
        assert pid is not None and Path(f"/proc/{pid}").exists(), "the daemon did not stay up"
        held = sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
        assert held == [0, 1, 2], f"the daemon holds its caller's descriptors: {held}"
    finally:
        os.close(r)
        os.close(lock)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
