"""The fabric check's script (components/scripts/fabric_check.py) where no torch is needed: its
arguments, its reading of NCCL's INFO lines, and its answer where torch cannot be imported
(this .venv has none: the Docker lab's image neither). Its measurements run on the CPU tier,
with real torch (tests/cpu_tier/test_fabric_check.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "fabric_check.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fabric_check_script", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fc = load()
ARGS = ["--rank", "0", "--world-size", "2", "--master-addr", "10.99.0.10",
        "--master-port", "29611", "--backend", "gloo"]


def run(args: list[str], env: dict[str, str] | None = None,
        stdin: bool = True) -> tuple[int, dict]:
    """The script as the program sends it: `python3 - ARGS`, the program on stdin."""
    argv = [sys.executable, "-", *args] if stdin else [sys.executable, str(SCRIPT), *args]
    proc = subprocess.run(argv, input=SCRIPT.read_text() if stdin else None, env=env,
                          capture_output=True, text=True, timeout=30)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr  # exactly one JSON line
    return proc.returncode, json.loads(lines[0])


def test_without_torch_it_says_so_and_exits_4() -> None:
    code, out = run(ARGS)
    assert code == fc.EXIT_UNAVAILABLE == 4
    assert out["status"] == "unavailable" and out["check"] == "fabric"
    assert "torch is not importable" in out["reason"] and "No module named 'torch'" in out[
        "reason"], out
    assert out["rank"] == 0 and out["backend"] == "gloo"


def test_a_missing_interface_is_named_before_torch(tmp_path: Path) -> None:
    code, out = run(ARGS, env={"GLOO_SOCKET_IFNAME": "nosuch9", "PATH": "/usr/bin:/bin"})
    assert code == fc.EXIT_FAILED == 1
    assert out["status"] == "error" and out["phase"] == "interface", out
    assert "GLOO_SOCKET_IFNAME=nosuch9: no interface 'nosuch9' on this node" in out["error"]
    assert "lo" in out["error"]  # what the node has


@pytest.mark.parametrize("extra,message", [
    (["--bandwidth-bytes", str(16 * 2**30)], "--bandwidth-bytes 17179869184: a multiple of 4 "
                                             "from 4096 to 268435456 (256 MiB)"),
    (["--bandwidth-bytes", "268435460"], "from 4096 to 268435456"),
    (["--deadline", "0"], "--deadline 0.0: 1-3600 s"),
    (["--rank", "2"], "--rank 2 --world-size 2: at least two ranks"),
    (["--backend", "mpi"], "argument --backend: invalid choice: 'mpi'"),
])
def test_bad_arguments_are_one_json_line_and_exit_2(extra: list[str], message: str) -> None:
    code, out = run([*ARGS, *extra])
    assert code == fc.EXIT_USAGE == 2
    assert out["status"] == "error" and out["phase"] == "arguments"
    assert message in out["error"], out


def test_the_bandwidth_message_is_bounded() -> None:
    assert fc.DEFAULT_BANDWIDTH_BYTES == 64 * 2**20
    assert fc.MAX_BANDWIDTH_BYTES == 256 * 2**20
    assert fc.LATENCY_BYTES == (8192, 65536)


def test_it_runs_from_a_file_too() -> None:
    code, out = run(ARGS, stdin=False)
    assert code == 4 and out["status"] == "unavailable"


# NCCL's own lines, in the formats NCCL 2.19-2.29 prints them (e.g. NVIDIA/nccl-tests#185,
# NVIDIA/aicr#1413): the network it uses, the HCAs, and each channel's transport
IB_GDR = """\
spark-a:1:1 [0] NCCL INFO Bootstrap : Using enp1s0f1np1:192.168.200.12<0>
NCCL version 2.27.7+cuda13.0
spark-a:1:9 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.200.12<0>
spark-a:1:9 [0] NCCL INFO Using network IB
spark-a:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
spark-a:1:9 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/1/GDRDMA
"""
IB = """\
x:1:9 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.200.12<0>
x:1:9 [0] NCCL INFO Using network IB
x:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0
"""
SOCKET = """\
x:1:9 [0] NCCL INFO NET/IB : No device found.
x:1:9 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.200.12<0>
x:1:9 [0] NCCL INFO Using network Socket
x:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""
ONE_HOST = "x:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n"
NO_CHANNEL = "x:1:9 [0] NCCL INFO Using network Socket\n"


@pytest.mark.parametrize("log,transport,gdr,hcas,sockets", [
    (IB_GDR, "NET/IB", True, ["roceP2p1s0f1:1", "rocep1s0f1:1"], []),
    (IB, "NET/IB", False, ["rocep1s0f1:1"], []),
    (SOCKET, "NET/Socket", False, [], ["enp1s0f1np1"]),
    (ONE_HOST, "P2P", False, [], []),
    (NO_CHANNEL, "NET/Socket", False, [], []),
    ("", "unknown", False, [], []),
], ids=["ib-gdr", "ib", "socket", "one-host", "no-channel", "nothing"])
def test_the_transport_is_read_from_nccls_lines(tmp_path: Path, log: str, transport: str,
                                                 gdr: bool, hcas: list[str],
                                                 sockets: list[str]) -> None:
    (tmp_path / "nccl.123.log").write_text(log)
    got = fc.nccl_transport(str(tmp_path))
    assert (got["transport"], got["gdr"], got["hcas"], got["socketInterfaces"]) == (
        transport, gdr, hcas, sockets)
    if log == IB_GDR:
        assert got["ncclVersion"] == "2.27.7+cuda13.0"


def test_one_rank_is_only_nccls_self_test() -> None:
    one = ["--rank", "0", "--world-size", "1", "--master-addr", "127.0.0.1",
           "--master-port", "29611"]
    code, out = run([*one, "--backend", "gloo"])
    assert code == fc.EXIT_USAGE and out["phase"] == "arguments"
    assert "at least two ranks (one only with --backend nccl" in out["error"]
    code, out = run([*one, "--backend", "nccl"])  # past the arguments: no torch here
    assert code == fc.EXIT_UNAVAILABLE and out["status"] == "unavailable"
    assert fc.parse([*one, "--backend", "nccl"]).world_size == 1


def test_a_one_rank_communicator_has_no_transport(tmp_path: Path) -> None:
    """NCCL loads its network even for one rank (`Using network Socket`); the transport is
    what connected peers, and one rank connects none (NCCL 2.28.9's lines, as a GPU printed
    them: tests/unit/test_fabric_recorded.py)."""
    (tmp_path / "nccl.1.log").write_text(
        "vm:7:7 [0] NCCL INFO Using network Socket\n"
        "vm:7:7 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 cudaDev 0 "
        "nvmlDev 0 busId 60 commId 0x2 - Init START\n"
        "vm:7:7 [0] NCCL INFO comm 0x1 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 "
        "MNNVL 0\n"
        "vm:7:7 [0] NCCL INFO Channel 00/64 : 0\n")
    got = fc.nccl_transport(str(tmp_path))
    assert (got["transport"], got["ncclNetwork"], got["ncclNodes"]) == ("none", "Socket", 1)
    (tmp_path / "nccl.1.log").write_text("vm:7:7 [0] NCCL INFO Using network Socket\n")
    assert fc.nccl_transport(str(tmp_path), 1)["transport"] == "none"  # lines lacking nranks
    assert fc.nccl_transport(str(tmp_path), 2)["transport"] == "NET/Socket"
