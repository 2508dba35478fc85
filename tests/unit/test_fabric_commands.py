"""The fabric check's node command (components/render/fabric_commands.py): what each node runs,
with which env and rank, and the command itself run against a fake `docker` (what reaches the
container's stdin, that the container is removed whatever happens, that it always exits 0 so
that every node's report reaches the verdict)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from components.fabric_verdict import parse_report
from components.render import fabric_commands as fabric
from tests.unit.harness import lab_nodes, spec_from

SCRIPT = (Path(__file__).resolve().parents[2] / "components/scripts/fabric_check.py").read_text()


def test_each_node_runs_one_rank_with_its_own_fabric_env() -> None:
    spec = spec_from(lab_nodes(2), fabricCheck={"bandwidthMessage": 16, "timeout": 45})
    head, other = spec.nodes
    a, b = fabric.docker_argv(spec, head), fabric.docker_argv(spec, other)
    assert a[:4] == ["docker", "run", "--rm", "-i"]
    assert a[a.index("--name") + 1] == "spark-vllm-test-fabric-check"
    i = b.index("--entrypoint")
    assert b[i:i + 4] == ["--entrypoint", "python3", "vllm/image:1", "-"]
    assert b[i + 4:] == ["--rank", "1", "--world-size", "2", "--master-addr", "192.168.231.11",
                         "--master-port", "29511", "--backend", "nccl", "--node", "node-2",
                         "--bandwidth-bytes", str(16 * 2**20), "--deadline", "45"]
    assert "--rank" in a and a[a.index("--rank") + 1] == "0"
    for argv, n in ((a, 1), (b, 2)):
        env = [argv[k + 1] for k, x in enumerate(argv) if x == "--env"]
        assert f"NCCL_SOCKET_IFNAME=enp{n}s0f1np1" in env
        assert f"GLOO_SOCKET_IFNAME=enp{n}s0f1np1" in env
        assert f"NCCL_IB_HCA=rocep{n}s0f1" in env
        assert f"VLLM_HOST_IP=192.168.231.1{n}" in env
        assert not any(e.startswith(("VLLM_API_KEY", "HF_TOKEN")) for e in env)
        assert "--gpus" in argv and "--network" in argv


def test_gloo_where_the_nodes_have_no_gpu() -> None:
    spec = spec_from(lab_nodes(2), dockerGpus="none", checkGpu=False)
    argv = fabric.docker_argv(spec, spec.nodes[0])
    assert argv[argv.index("--backend") + 1] == "gloo" and "--gpus" not in argv


def test_the_rendezvous_port_is_beside_master_port() -> None:
    assert fabric.port(spec_from(lab_nodes(2))) == 29511
    assert fabric.port(spec_from(lab_nodes(2), masterPort=65530)) == 65520


FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$LOG"
case "$1" in
  rm) exit 0 ;;
  run) cat > "$STDIN"; [ -n "$FAIL" ] && { echo "docker: no such image" >&2; exit 125; }
       echo '{"check": "fabric", "status": "ok", "rank": 0}'; exit "${RC:-0}" ;;
esac
"""


def run_node(tmp: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    spec = spec_from(lab_nodes(2))
    (tmp / "bin").mkdir(exist_ok=True)
    docker = tmp / "bin" / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    log = tmp / "docker.log"
    log.write_text("")
    proc = subprocess.run(["sh", "-c", fabric.node_script(spec, spec.nodes[0])],
                          input=fabric.script(), capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{tmp}/bin:/usr/bin:/bin", "LOG": str(log),
                               "STDIN": str(tmp / "stdin"), **env})
    return proc, log.read_text().splitlines()


def test_the_node_command_sends_the_script_and_removes_the_container(tmp_path: Path) -> None:
    proc, calls = run_node(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "stdin").read_text() == SCRIPT  # the check itself, on the container's stdin
    assert [c.split()[0] for c in calls] == ["rm", "run", "rm"]  # a leftover, the run, the trap
    assert calls[0] == calls[2] == "rm -f spark-vllm-test-fabric-check"
    assert json.loads(proc.stdout)["status"] == "ok"


def test_a_failed_check_still_exits_0_and_says_so(tmp_path: Path) -> None:
    proc, calls = run_node(tmp_path, RC="3")
    assert proc.returncode == 0
    assert "node-1: fabric check: the check ended with exit 3" in proc.stderr
    proc, calls = run_node(tmp_path, FAIL="1")
    assert proc.returncode == 0 and calls[-1].startswith("rm -f")
    report = parse_report("node-1", proc.stdout, 0, proc.stderr)
    assert report["status"] == "error" and "no report from the fabric check" in report["error"]
    assert "docker: no such image" in report["log"]
    assert "the check ended with exit 125" in proc.stderr


def test_it_is_needed_with_two_nodes_or_more() -> None:
    assert fabric.needed(spec_from(lab_nodes(2)))
    assert not fabric.needed(spec_from(lab_nodes(1)))


def test_it_runs_again_when_what_it_measures_changes_and_only_then() -> None:
    base = fabric.triggers(spec_from(lab_nodes(2)))
    assert base == fabric.triggers(spec_from(lab_nodes(2)))  # a no-op up: the same
    moved = lab_nodes(2)
    changes = {
        "identity": dict(moved[1], fabricIp="192.168.231.99"),
        "interface": dict(moved[1], fabricInterface="enp9s0f1np1"),
        "ibHca": dict(moved[1], ibHca="rocep9s0f1,roceP2p9s0f1"),
    }
    for what, node in changes.items():
        assert fabric.triggers(spec_from([moved[0], node])) != base, what
    for top in ({"image": "vllm/image:2"}, {"env": {"NCCL_IB_GID_INDEX": "3"}},
                {"fabricCheck": {"minBusBandwidth": 15}}, {"dockerGpus": "none"}):
        assert fabric.triggers(spec_from(lab_nodes(2), **top)) != base, top
    # what the check does not measure: the model, vLLM's flags, the API port
    for top in ({"model": "org/other"}, {"vllmArgs": ["--max-num-seqs", "8"]}, {"port": 8001}):
        assert fabric.triggers(spec_from(lab_nodes(2), **top)) == base, top
