"""Real Ray nodes and real `vllm serve` (vllm-sim) processes for the tests, loopback only.

Ray nodes run as `ray start --block` in their own session and are stopped by signalling that
process (it takes its raylet, GCS ... down with it), then by killing its process group: never
`ray stop`, which would end every Ray on the machine, other people's included.

Node addresses are 127.0.0.2, .3, ...: Ray 2.60 rewrites `--node-ip-address=127.0.0.1` (and
"localhost") to the default-route address (ray._private.services.resolve_ip_for_localhost), which
would take traffic off loopback; any other 127/8 address is kept as given.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import requests

BIN = Path(sys.executable).parent
NODE_START_TIMEOUT_S = 60.0
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"  # the `cluster` fixture (conftest.py)
SERVER_READY_TIMEOUT_S = 60.0
# The simulator plays vLLM 0.33.0 (V2 mode) unless told otherwise; tests of the legacy executor
# (the outage image's vLLM) pass this in the server's env.
LEGACY = {"VLLM_SIM_VLLM_VERSION": "0.17.1"}
V2 = {"VLLM_SIM_VLLM_VERSION": "0.33.0"}


def can_unshare_mount() -> bool:
    """True if this machine lets us give a process its own /tmp (user + mount namespace)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /mnt 2>/dev/null || "
         "mount --bind /tmp /tmp"], capture_output=True, timeout=30,
    )
    return probe.returncode == 0


# Run inside `unshare -Urm`: /tmp becomes the node's own directory (as a container's /tmp is its
# own), except the paths before `--`, each bound back in at the same path: Ray's temp dir (the
# lab shares /tmp/ray the same way) and, where the clone lives under /tmp, the interpreter, the
# venv and the code it imports (a container has its own image). /dev/shm stays shared (the
# lab's --ipc host).
_PRIVATE_TMP = (
    'set -e; priv="$1"; shift; '
    'while [ "$1" != -- ]; do '
    'mkdir -p "$priv/${1#/tmp/}"; mount --bind "$1" "$priv/${1#/tmp/}"; shift; done; '
    'shift; mount --rbind "$priv" /tmp; exec "$@"'
)


def _kept_under_tmp(*paths: str) -> list[str]:
    """The paths a node with a private /tmp must still see at the same place: `paths`, and the
    Python that runs `ray` and its workers (the venv, sys.path: site-packages, editable
    installs, this checkout), where they lie under /tmp. Outermost only, and never /tmp itself
    (that would share the very directory the node must not see)."""
    tmp = Path("/tmp")
    found: set[Path] = set()
    candidates = [*paths, sys.executable, str(BIN), sys.prefix, sys.exec_prefix, sys.base_prefix,
                  os.getcwd(), str(Path(__file__).parent), *sys.path]
    for raw in candidates:
        if not raw or not os.path.isabs(raw):
            continue
        path = Path(os.path.normpath(raw))
        for p in {path, path.resolve()}:
            if p.is_file():
                p = p.parent
            if p != tmp and p.is_relative_to(tmp) and p.is_dir():
                found.add(p)
    outermost = [p for p in found if not any(p != q and p.is_relative_to(q) for q in found)]
    return sorted(str(p) for p in outermost)


def exe(name: str) -> str:
    local = BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH")
    return found


def _has_ray_client() -> bool:
    # `ray start` refuses the client port flag without ray[client], and uses 10001 with it.
    from ray._private.utils import get_ray_client_dependency_error

    return get_ray_client_dependency_error() is None


_ISSUED_PORTS: set[int] = set()


def free_port() -> int:
    """A port free now and never handed out before in this run: the kernel may give the same
    just-released port to two binds in a row, and Ray refuses two components on one port."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ISSUED_PORTS:
            _ISSUED_PORTS.add(port)
            return port


_CACHE_ROOT = tempfile.mkdtemp(prefix="vsim-cache-")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_HOST_IP", "HOST_IP", "VLLM_API_KEY", "RAY_ADDRESS")
        and not k.startswith("VLLM_SIM_")
    }
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # a short "compile", into a cache of this test run's own (not the runner's ~/.cache/vllm)
    env["VLLM_SIM_COMPILE_S"] = "0.2"
    env["VLLM_CACHE_ROOT"] = _CACHE_ROOT
    env.update(extra)
    return env


def _stop_group(proc: subprocess.Popen, term_timeout_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=term_timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of this process's own group only
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)


@dataclass
class RayCluster:
    """A head at 127.0.0.2 and any workers, each `ray start --block` with its own env."""

    temp_dir: str
    port: int
    head_ip: str = "127.0.0.2"
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    def add_node(
        self,
        ip: str,
        vllm_host_ip: str | None,
        gpus: int = 1,
        env: dict[str, str] | None = None,
        private_tmp: Path | None = None,
    ) -> None:
        """`env`: extra variables the node's `ray start` (its container) has. `private_tmp`: the
        node gets its own /tmp, backed by this directory (needs can_unshare_mount())."""
        head = not self.procs
        args = [
            exe("ray"),
            "start",
            f"--node-ip-address={ip}",
            f"--num-gpus={gpus}",
            "--block",
            "--object-store-memory=100000000",
            f"--temp-dir={self.temp_dir}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]
        if head:
            args += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
            ]
            if _has_ray_client():
                # Else the head takes the fixed port 10001, which another cluster may hold.
                args.append(f"--ray-client-server-port={free_port()}")
        else:
            args.append(f"--address={self.address}")
        # What the node's container would have: the raylet's env is what its workers see.
        node_env = clean_env(**({"VLLM_HOST_IP": vllm_host_ip} if vllm_host_ip else {}))
        node_env.update(env or {})
        if private_tmp is not None:
            args = ["unshare", "-Urm", "sh", "-c", _PRIVATE_TMP, "sh", str(private_tmp),
                    *_kept_under_tmp(self.temp_dir), "--", *args]
        log = Path(self.temp_dir) / f"ray-start-{ip}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, env=node_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        self.logs.append(log)
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start for {ip} failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _stop_group(proc, term_timeout_s=20)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_cluster(
    head_vllm_host_ip: str | None = "127.0.0.2",
    gpus: int = 1,
    env: dict[str, str] | None = None,
    private_tmp: Path | None = None,
) -> RayCluster:
    # Short path: Ray's unix sockets live under it and must stay under 108 bytes.
    cluster = RayCluster(temp_dir=tempfile.mkdtemp(prefix="vsim-", dir="/tmp"), port=free_port())
    try:
        cluster.add_node(cluster.head_ip, head_vllm_host_ip, gpus, env, private_tmp)
    except Exception:
        cluster.stop()
        raise
    return cluster


@dataclass
class Serve:
    """One `vllm serve` process and its combined stdout/stderr."""

    proc: subprocess.Popen
    log: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"vllm serve still running:\n{self.output()[-4000:]}") from None

    def wait_ready(self, timeout_s: float = SERVER_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited {self.proc.returncode}:\n{self.output()}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"vllm serve not healthy in {timeout_s} s:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        _stop_group(self.proc, term_timeout_s=15)


def start_serve(
    cluster: RayCluster | None,
    model: str,
    flags: Iterable[str],
    env: dict[str, str],
    log_dir: Path,
) -> Serve:
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    full_env = clean_env(VLLM_SIM_LOAD_SECONDS="0.5", **env)
    if cluster is not None:
        full_env["RAY_ADDRESS"] = cluster.address
    args = [exe("vllm"), "serve", model, "--host", "127.0.0.1", "--port", str(port), *flags]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Serve(proc=proc, log=log, port=port)


RANK_LINE = re.compile(r"rank (\d+) -> node (\S+) .*pid=(\d+)\)")


def rank_lines(output: str) -> list[tuple[int, str, int]]:
    return [(int(r), ip, int(pid)) for r, ip, pid in RANK_LINE.findall(output)]


# --- rank processes, streams and metrics (test_sim_wedge.py) ----------------------------------

# A rank's OS process is a Ray actor; Ray titles it `ray::<actor class>` (its argv, so
# /proc/PID/cmdline), `ray::<class>.<method>` while a method runs: vllm-sim's RayWorkerProc
# (V2, the same class name as vLLM's own, vllm/v1/executor/ray_executor_v2.py) and RaySimWorker
# (legacy). lab/faults.py finds the ranks in a lab node's Ray container by the same pattern.
RANK_PROCESS = re.compile(r"^ray::(RayWorkerProc|RaySimWorker)\b")


def rank_processes() -> dict[int, str]:
    """pid -> title of every rank actor process this machine shows in /proc."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        title = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if RANK_PROCESS.match(title):
            found[int(entry.name)] = title
    return found


def read_metrics(url: str) -> dict[str, float]:
    """The `vllm:` series of /metrics, summed over their label sets."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    sums: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(vllm:[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m:
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
    return sums


class StreamProbe:
    """A streamed request read in a thread, each `data:` event kept with its arrival time
    (seconds after the request was sent), as the program's liveness canary reads it."""

    def __init__(self, url: str, path: str, body: dict, timeout_s: float = 120) -> None:
        self.events: list[tuple[float, str]] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self._req = urllib.request.Request(
            f"{url}{path}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        self._timeout_s = timeout_s
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with urllib.request.urlopen(self._req, timeout=self._timeout_s) as resp:
                self.status = resp.status
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if line.startswith("data: "):
                        self.events.append((time.monotonic() - self.t0, line[6:]))
        except BaseException as err:  # noqa: BLE001 - reported to the test
            self.error = err

    @property
    def first_at(self) -> float | None:
        return self.events[0][0] if self.events else None

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"the stream did not end in {timeout_s} s: {self.events}")
        if self.error is not None:
            raise AssertionError(f"the stream failed: {self.error!r}; events {self.events}")
