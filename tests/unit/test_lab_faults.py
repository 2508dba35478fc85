"""lab/faults.py and its CLI (`python -m lab wedge|gpu-memory`), without the lab.

The scripts run here as they run on a node: the fake nvidia-smi and its install/clear scripts
in a tmp dir with `sh`; the rank finder with python against this machine's /proc (listing
only, or signalling a process of the test's own with a title no one else has); the node's
wedge script with a fake `docker` on PATH that never runs the finder."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lab import cli, faults, run
from lab.config import NodeAddrs
from lab.run import LabError

QUERY = ["--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"]
NODE = NodeAddrs(index=2, name="node-2", container="spark-vllm-lab-node-2", mgmt_ip="10.0.0.2",
                 fabric_ip="10.1.0.2", spare_ip="10.1.0.102", docker_bip="172.31.2.1/24")


# --- the fake nvidia-smi ------------------------------------------------------------------------


def install_fake(tmp_path: Path, total: int | None = 81920, free: int | None = 40960) -> Path:
    values = tmp_path / "state" / "gpu-memory"
    values.parent.mkdir(parents=True, exist_ok=True)
    if total is not None:
        values.write_text(faults.values_text(total, free or 0))
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(faults.fake_nvidia_smi(str(values)))
    smi.chmod(0o755)
    return smi


def call(smi: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(smi), *args], capture_output=True, text=True, timeout=10)


def test_fake_answers_the_memory_query_from_its_values_file(tmp_path):
    smi = install_fake(tmp_path)
    done = call(smi, *QUERY)
    assert (done.returncode, done.stdout, done.stderr) == (0, "81920, 40960\n", "")
    # either order of the two flags, as nvidia-smi takes them
    assert call(smi, *reversed(QUERY)).stdout == "81920, 40960\n"
    # the numbers change with the file, without reinstalling
    (tmp_path / "state" / "gpu-memory").write_text(faults.values_text(131072, 1024))
    assert call(smi, *QUERY).stdout == "131072, 1024\n"


@pytest.mark.parametrize("args", [[], ["-L"], ["--query-gpu=name", "--format=csv"],
                                  [*QUERY, "-i", "0"]])
def test_fake_answers_anything_else_with_a_one_line_notice(tmp_path, args):
    done = call(install_fake(tmp_path), *args)
    assert done.returncode == 0
    assert done.stdout.startswith("lab: simulated nvidia-smi")
    assert done.stdout.count("\n") == 1
    # `nvidia-smi -L | grep -c '^GPU '` (the program's preflight) counts no GPU
    assert not any(line.startswith("GPU ") for line in done.stdout.splitlines())


def test_fake_without_values_fails_like_a_missing_driver(tmp_path):
    done = call(install_fake(tmp_path, total=None), *QUERY)
    assert done.returncode == 9
    assert done.stdout == ""
    assert "lab: simulated nvidia-smi: no memory values in" in done.stderr
    (tmp_path / "state" / "gpu-memory").write_text("total_mib=lots\nfree_mib=1\n")
    assert call(tmp_path / "bin" / "nvidia-smi", *QUERY).returncode == 9


def test_the_programs_memory_check_reads_the_fake(tmp_path):
    from spark_vllm.components import node_memory

    smi = install_fake(tmp_path, total=122880, free=20480)
    done = subprocess.run(["sh", "-c", node_memory.SCRIPT], capture_output=True, text=True,
                          timeout=10, env={**os.environ, "PATH": f"{smi.parent}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    (gpu,) = node_memory.parse(done.stdout)
    assert (gpu.source, gpu.total_mib, gpu.free_mib) == ("nvidia-smi", 122880, 20480)


# --- install and clear, as they run on the node host --------------------------------------------


def node_script(script: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script, "sh", *args], input=stdin, capture_output=True,
                          text=True, timeout=10)


def test_install_then_change_then_clear(tmp_path):
    smi, values = tmp_path / "usr-local-bin" / "nvidia-smi", tmp_path / "var" / "gpu-memory"
    fake = faults.fake_nvidia_smi(str(values))
    done = node_script(faults.install_script(), str(smi), str(values), "81920", "40960",
                       stdin=fake)
    assert done.returncode == 0, done.stderr
    assert "answer: 81920, 40960" in done.stdout
    assert stat.S_IMODE(smi.stat().st_mode) == 0o755
    assert values.read_text() == "total_mib=81920\nfree_mib=40960\n"
    again = node_script(faults.install_script(), str(smi), str(values), "81920", "512",
                        stdin=fake)
    assert "answer: 81920, 512" in again.stdout
    cleared = node_script(faults.clear_script(), str(smi), str(values))
    assert cleared.returncode == 0, cleared.stderr
    assert not smi.exists() and not values.exists()
    # clearing what is not there is fine
    assert node_script(faults.clear_script(), str(smi), str(values)).returncode == 0


def test_a_real_nvidia_smi_is_never_replaced_nor_removed(tmp_path):
    smi, values = tmp_path / "nvidia-smi", tmp_path / "gpu-memory"
    smi.write_text("#!/bin/sh\necho NVIDIA-SMI 580.159.04\n")
    done = node_script(faults.install_script(), str(smi), str(values), "1", "1",
                       stdin=faults.fake_nvidia_smi(str(values)))
    assert done.returncode == 3
    assert "not the lab's fake nvidia-smi: left alone" in done.stderr
    assert node_script(faults.clear_script(), str(smi), str(values)).returncode == 3
    assert smi.read_text() == "#!/bin/sh\necho NVIDIA-SMI 580.159.04\n"
    assert not values.exists()


def test_gpu_memory_commands_go_through_docker_exec_on_the_node():
    argv = faults.gpu_memory_argv(NODE, faults.install_script(), faults.NVIDIA_SMI,
                                  faults.GPU_MEMORY_FILE, "1024", "512")
    assert argv[:5] == ["docker", "exec", "-i", "spark-vllm-lab-node-2", "sh"]
    assert argv[-4:] == ["/usr/local/bin/nvidia-smi", "/var/lib/spark-vllm-lab/gpu-memory",
                         "1024", "512"]


# --- the rank finder -------------------------------------------------------------------------------


def titled(title: str) -> subprocess.Popen[bytes]:
    """A process whose argv (so /proc/PID/cmdline) starts with `title`, as Ray titles its actors."""
    proc = subprocess.Popen(["bash", "-c", f'exec -a "{title}" sleep 60'])
    deadline = time.monotonic() + 5
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(title.encode()):
        assert time.monotonic() < deadline, "the titled process did not start"
        time.sleep(0.02)
    return proc


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def settled_state(pid: int, want: tuple[str, ...], deadline_s: float = 5.0) -> str:
    """The process's state once it is one of `want`, or the last one read at the deadline.

    kill(2) returns once the signal is queued; the target changes state when the kernel next
    schedules it, so an immediate read of /proc can still say R after a SIGSTOP (CI saw it)."""
    end = time.monotonic() + deadline_s
    while (state := proc_state(pid)) not in want and time.monotonic() < end:
        time.sleep(0.02)
    return state


def run_finder(finder: str, sig: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", finder, sig, "ray-container"],
                          capture_output=True, text=True, timeout=30)


def test_the_finder_lists_rank_processes_by_title():
    procs = {t: titled(t) for t in ("ray::RayWorkerProc.run", "ray::RaySimWorker",
                                    "ray::IDLE", "ray::RayWorkerProcessor", "xray::RayWorkerProc")}
    try:
        done = run_finder(faults.FINDER, "0")  # signal 0: nothing is sent
        found = {r.pid: r for r in faults.parse_finder_output(done.stdout)}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert done.returncode == 0, done.stderr
    for title in ("ray::RayWorkerProc.run", "ray::RaySimWorker"):
        r = found[procs[title].pid]
        assert r.cmdline == f"{title} 60" and r.container == "ray-container"
        assert (r.signal, r.error) == ("0", None)
    for title in ("ray::IDLE", "ray::RayWorkerProcessor", "xray::RayWorkerProc"):
        assert procs[title].pid not in found


def test_the_finder_stops_and_continues_what_it_finds():
    title = f"ray::LabFaultsTest{uuid.uuid4().hex[:8]}"  # only this test's process has it
    finder = faults.FINDER.replace(repr(faults.RANK_PATTERN), repr(f"^{title}\\b"))
    assert finder != faults.FINDER
    proc = titled(title)
    try:
        done = run_finder(finder, "SIGSTOP")
        assert done.returncode == 0, done.stderr
        (r,) = faults.parse_finder_output(done.stdout)
        assert (r.pid, r.signal) == (proc.pid, "SIGSTOP")
        assert settled_state(proc.pid, ("T",)) == "T"
        assert run_finder(finder, "SIGCONT").returncode == 0
        assert settled_state(proc.pid, ("S", "R")) in ("S", "R")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
    assert run_finder(finder, "0").returncode == 4  # none left


def test_the_pattern_names_the_simulators_rank_classes():
    from vllm_sim import ray_executor as legacy
    from vllm_sim import ray_executor_v2 as v2
    assert set(faults.RANK_CLASSES) == {v2.RayWorkerProc.__name__, legacy.RaySimWorker.__name__}


# --- the node's wedge script, with a fake docker -----------------------------------------------------

FAKE_DOCKER = """#!/usr/bin/env python3
import os, subprocess, sys
args = sys.argv[1:]
running = os.environ.get("FAKE_RUNNING", "").split()
if args[0] == "inspect":
    if args[-1] in running:
        print("true")
        sys.exit(0)
    sys.exit(1)
assert args[0] == "exec", args
args = args[1:]
if args[0] == "-i":
    args = args[1:]
name, cmd = args[0], args[1:]
if name == os.environ["FAKE_NODE"]:  # the node host: run its shell here
    sys.exit(subprocess.call(cmd))
# a Ray container: never the real finder; what it would have printed
assert cmd[:2] == ["python3", "-c"] and cmd[-2:] == [os.environ["FAKE_SIG"], name], cmd
sys.stdout.write(os.environ.get("FAKE_FOUND_" + name.replace("-", "_"), ""))
sys.exit(int(os.environ.get("FAKE_RC_" + name.replace("-", "_"), "4")))
"""


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.replace("/usr/bin/env python3", sys.executable))
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_NODE": NODE.container}
    monkeypatch.setattr(run, "DOCKER_ENV", env)
    return env


def rank_line(pid: int, container: str, sig: str) -> str:
    return json.dumps({"pid": pid, "cmdline": "ray::RayWorkerProc.run", "container": container,
                       "signal": sig, "error": None}) + "\n"


def test_wedge_signals_the_ranks_of_the_nodes_ray_container(fake_docker):
    worker = "spark-vllm-lab-ray-worker"
    fake_docker.update(FAKE_RUNNING=worker, FAKE_SIG="SIGSTOP",
                       FAKE_FOUND_spark_vllm_lab_ray_worker=rank_line(2965, worker, "SIGSTOP"),
                       FAKE_RC_spark_vllm_lab_ray_worker="0")
    (r,) = faults.wedge(NODE, "lab")
    assert (r.pid, r.container, r.signal, r.cmdline) == (2965, worker, "SIGSTOP",
                                                         "ray::RayWorkerProc.run")
    fake_docker["FAKE_SIG"] = "SIGCONT"
    fake_docker["FAKE_FOUND_spark_vllm_lab_ray_worker"] = rank_line(2965, worker, "SIGCONT")
    (r,) = faults.wedge(NODE, "lab", thaw=True)
    assert r.signal == "SIGCONT"


def test_wedge_finds_the_head_container_of_another_stack(fake_docker):
    head = "spark-vllm-s2-ray-head"
    fake_docker.update(FAKE_RUNNING=head, FAKE_SIG="SIGSTOP",
                       FAKE_FOUND_spark_vllm_s2_ray_head=rank_line(7, head, "SIGSTOP"),
                       FAKE_RC_spark_vllm_s2_ray_head="0")
    assert [r.container for r in faults.wedge(NODE, "s2")] == [head]


def test_wedge_without_a_ray_container_says_so(fake_docker):
    fake_docker.update(FAKE_RUNNING="", FAKE_SIG="SIGSTOP")
    with pytest.raises(LabError, match="no running Ray container .spark-vllm-lab-ray-head or "
                                       "spark-vllm-lab-ray-worker. on this node"):
        faults.wedge(NODE, "lab")


def test_wedge_without_a_rank_process_says_so(fake_docker):
    fake_docker.update(FAKE_RUNNING="spark-vllm-lab-ray-head", FAKE_SIG="SIGSTOP")
    with pytest.raises(LabError) as err:
        faults.wedge(NODE, "lab")
    assert "no vLLM rank process in spark-vllm-lab-ray-head" in str(err.value)
    assert "ray::RayWorkerProc or ray::RaySimWorker" in str(err.value)
    assert "is vLLM serving with stack 'lab'?" in str(err.value)


def test_wedge_reports_a_failed_docker_exec(fake_docker):
    fake_docker.update(FAKE_RUNNING="spark-vllm-lab-ray-worker", FAKE_SIG="SIGSTOP",
                       FAKE_RC_spark_vllm_lab_ray_worker="126")
    with pytest.raises(LabError, match="docker exec in spark-vllm-lab-ray-worker failed .exit 126"):
        faults.wedge(NODE, "lab")


# --- the CLI ---------------------------------------------------------------------------------------


def test_wedge_arguments():
    a = cli._parser().parse_args(["wedge", "node-2"])
    assert (a.cmd, a.node, a.thaw, a.stack) == ("wedge", "node-2", False, "lab")
    a = cli._parser().parse_args(["wedge", "2", "--thaw", "--stack", "s2"])
    assert (a.node, a.thaw, a.stack) == ("2", True, "s2")
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["wedge"])


def test_gpu_memory_arguments():
    a = cli._parser().parse_args(["gpu-memory", "node-1", "--total-gib", "120", "--free-gib",
                                  "20.5"])
    assert (a.node, a.total_gib, a.free_gib, a.clear) == ("node-1", 120.0, 20.5, False)
    assert faults.to_mib(a.total_gib) == 122880 and faults.to_mib(a.free_gib) == 20992
    a = cli._parser().parse_args(["gpu-memory", "node-1", "--clear"])
    assert a.clear and a.total_gib is None


@pytest.mark.parametrize("argv,message", [
    (["--total-gib", "120"], "give --total-gib and --free-gib, or --clear"),
    ([], "give --total-gib and --free-gib, or --clear"),
    (["--clear", "--free-gib", "1"], "--clear takes no --total-gib/--free-gib"),
    (["--total-gib", "0", "--free-gib", "0"], "--total-gib must be > 0"),
    (["--total-gib", "10", "--free-gib", "11"], "--free-gib must be within 0..10"),
    (["--total-gib", "10", "--free-gib", "-1"], "--free-gib must be within 0..10"),
])
def test_gpu_memory_argument_errors_exit_2_before_touching_the_lab(argv, message, capsys,
                                                                   monkeypatch):
    monkeypatch.setattr(cli.cluster, "find_node", lambda ref: pytest.fail("reached the lab"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["gpu-memory", "node-1", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_prints_what_it_froze(monkeypatch, capsys):
    monkeypatch.setattr(cli.cluster, "find_node", lambda ref: NODE)
    ranks = [faults.RankProcess(2965, "ray::RayWorkerProc.run", "spark-vllm-lab-ray-worker",
                                "SIGSTOP")]
    monkeypatch.setattr(faults, "wedge", lambda node, stack, thaw=False: ranks)
    assert cli.main(["wedge", "2"]) == 0
    out = capsys.readouterr().out
    assert "node-2 spark-vllm-lab-ray-worker: SIGSTOP pid 2965: ray::RayWorkerProc.run" in out
    assert "thaw with `python -m lab wedge node-2 --thaw`" in out


def test_cli_fails_clearly_without_a_rank(monkeypatch, capsys):
    monkeypatch.setattr(cli.cluster, "find_node", lambda ref: NODE)

    def none(node, stack, thaw=False):  # type: ignore[no-untyped-def]
        raise LabError("node-2: no vLLM rank process in spark-vllm-lab-ray-worker")

    monkeypatch.setattr(faults, "wedge", none)
    assert cli.main(["wedge", "node-2"]) == 1
    assert "lab: error: node-2: no vLLM rank process" in capsys.readouterr().err


def test_cli_installs_the_fake_with_mib(monkeypatch, capsys):
    monkeypatch.setattr(cli.cluster, "find_node", lambda ref: NODE)
    seen = {}

    def fake_set(node, total, free):  # type: ignore[no-untyped-def]
        seen.update(node=node, total=total, free=free)
        return "answer: 122880, 20480\non PATH: /usr/local/bin/nvidia-smi"

    monkeypatch.setattr(faults, "set_gpu_memory", fake_set)
    assert cli.main(["gpu-memory", "node-2", "--total-gib", "120", "--free-gib", "20"]) == 0
    assert seen == {"node": NODE, "total": 122880, "free": 20480}
    out = capsys.readouterr().out
    assert "node-2: fake /usr/local/bin/nvidia-smi reports 122880 MiB total, 20480 MiB free" in out
