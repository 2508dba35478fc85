"""The fabric check's NCCL path as it ran on a GPU (tests/fixtures/fabric-nccl/: one H200,
torch 2.11.0+cu130, NCCL 2.28.9, recorded 2026-12-02 by lab/gpu/fabric_nccl.py): the script's
reading of NCCL's real INFO lines (components/scripts/fabric_check.py nccl_transport,
same_gpu), and the verdict (components/fabric_verdict.py) on the reports the script printed
there. The GPU machine is not CI's: what it did comes back as these files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from components.fabric_verdict import EXIT_FAILED, EXIT_OK, parse_report, verdict
from components.spec import FabricCheckSettings

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "tests/fixtures/fabric-nccl/2026-12-02-h200-torch2.11.0-nccl2.28.9"
RECORD = json.loads((RUN / "run.json").read_text())
SCENARIOS = {s["name"]: s for s in RECORD["scenarios"]}
DEFAULT = FabricCheckSettings()
# floors that a shared GPU's time slicing clears (ms, not µs): the verdict's pass path
LOOSE = FabricCheckSettings(maxLatency8k=20000, maxLatency64k=20000, minBusBandwidth=1)


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fabric_check_script", REPO / "components/scripts/fabric_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fc = load()


def reports(name: str) -> list[dict[str, Any]]:
    """Every rank's report as the program would read it (parse_report of its stdout)."""
    out = []
    for r in SCENARIOS[name]["ranks"]:
        rep = parse_report(r["node"], r["stdout"], r["exit"])
        assert rep["node"] == r["node"] and rep["check"] == "fabric", rep
        out.append(rep)
    return out


def parsed(tmp_path: Path, name: str, node: str) -> dict[str, Any]:
    """nccl_transport over one rank's recorded NCCL lines, as the script reads them (its
    temporary directory's nccl.PID.log)."""
    d = tmp_path / f"{name}-{node}"
    d.mkdir()
    (d / "nccl.4242.log").write_text((RUN / f"{name}.{node}.nccl.log").read_text())
    world = len(SCENARIOS[name]["ranks"])
    return fc.nccl_transport(str(d), world)


def test_the_record_says_where_it_ran() -> None:
    m = RECORD["machine"]
    assert m["versions"] == {"torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9",
                             "gpus": 1}
    assert m["gpu"].startswith("NVIDIA H200, 580.159.04")
    assert RECORD["recorded"].startswith("2026-12-02")
    # every rank ended by itself, within the script's own deadline (60 s)
    for s in RECORD["scenarios"]:
        for r in s["ranks"]:
            assert not r["killedByRunner"] and r["seconds"] < 60, (s["name"], r)
            assert len(r["stdout"].strip().splitlines()) == 1  # exactly one JSON line


def test_each_rank_ran_as_the_program_renders_it() -> None:
    plan = {s["name"]: s for s in json.loads((RUN / "plan.json").read_text())}
    for name, s in SCENARIOS.items():
        for r, p in zip(s["ranks"], plan[name]["nodes"], strict=True):
            assert r["args"] == p["args"] and r["env"] == p["env"]
            entry = p["docker"].index("--entrypoint")
            assert p["docker"][entry + 4:] == r["args"]  # `python3 IMAGE - ARGS`
            assert r["env"]["NCCL_SOCKET_IFNAME"] == "lo"
            assert "NCCL_HOSTID" not in r["env"]  # the runner's, never the program's


# --- NCCL's own lines, read by the script -------------------------------------------------

@pytest.mark.parametrize("name,nodes", [("two-hosts-one-gpu", 2), ("three-hosts-one-gpu", 3)])
def test_ranks_nccl_took_for_separate_hosts_read_as_net_socket_on_lo(
        tmp_path: Path, name: str, nodes: int) -> None:
    for r in SCENARIOS[name]["ranks"]:
        got = parsed(tmp_path, name, r["node"])
        assert got == {"transport": "NET/Socket", "gdr": False, "hcas": [],
                       "socketInterfaces": ["lo"], "ncclNetwork": "Socket",
                       "ncclNodes": nodes, "ncclVersion": "2.28.9+cuda13.0"}, r["node"]
        log = (RUN / f"{name}.{r['node']}.nccl.log").read_text()
        assert "via NET/Socket/0" in log and "NET/IB : No device found." in log
        # no IB device: `NET/IB : Using [RO]; …` names no HCA, and none is read from it
        assert "NET/IB : Using [RO]" in log


def test_the_self_test_reads_as_no_transport_whatever_network_nccl_loaded(
        tmp_path: Path) -> None:
    got = parsed(tmp_path, "self-test", "n0")
    assert got["transport"] == "none"  # not NET/Socket: NCCL connected no peer
    assert got["ncclNetwork"] == "Socket" and got["ncclNodes"] == 1
    assert got["ncclVersion"] == "2.28.9+cuda13.0" and got["socketInterfaces"] == ["lo"]
    log = (RUN / "self-test.n0.nccl.log").read_text()
    assert "Using network Socket" in log and " via " not in log


def test_the_parse_of_today_agrees_with_what_each_rank_reported_there(tmp_path: Path) -> None:
    for name in ("self-test", "two-hosts-one-gpu", "three-hosts-one-gpu"):
        for r in SCENARIOS[name]["ranks"]:
            me = next(x for x in json.loads(r["stdout"])["ranks"] if x["node"] == r["node"])
            got = parsed(tmp_path, name, r["node"])
            for key in ("transport", "gdr", "hcas", "socketInterfaces", "ncclVersion",
                        "ncclNetwork"):
                assert me[key] == got[key], (name, r["node"], key)


def test_nccls_refusal_of_two_ranks_on_one_gpu_is_read_from_its_lines() -> None:
    for r in SCENARIOS["one-gpu-two-ranks"]["ranks"]:
        log = (RUN / f"one-gpu-two-ranks.{r['node']}.nccl.log").read_text()
        line = fc.same_gpu(log)
        assert line is not None and line.startswith("Duplicate GPU detected : rank ")
        assert line.endswith("both on CUDA device 60")
    assert fc.same_gpu("Multiple Ranks are using the same GPU/Partition. Set "
                       "NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.")  # 2.30
    assert fc.same_gpu("NCCL WARN NET/Socket : connect to 10.0.0.2<4242> failed") is None


# --- the reports the script printed there, and their verdicts --------------------------------

def test_two_ranks_on_one_gpu_are_a_clear_failure_not_a_hang() -> None:
    reps = reports("one-gpu-two-ranks")
    for rep, r in zip(reps, SCENARIOS["one-gpu-two-ranks"]["ranks"], strict=True):
        assert r["exit"] == EXIT_FAILED and r["seconds"] < 10
        assert rep["status"] == "error" and rep["phase"] == "init"
        assert rep["cause"] == "duplicate-gpu"
        assert "NCCL refused two ranks on one GPU (Duplicate GPU detected" in rep["error"]
        assert any("NCCL WARN Duplicate GPU detected" in ln for ln in rep["log"])
    v = verdict(reps, DEFAULT)
    assert v.outcome == "refuse" and not v.starts
    assert "nothing started" in v.message
    assert "n0 (rank 0): init: " in v.message and "n1 (rank 1): init: " in v.message
    assert "every node's rank needs a GPU of its own" in v.message
    # what to check: the GPU, not the rendezvous (the group never formed for that reason)
    assert "- the rendezvous: every node must reach" not in v.message
    assert v.baseline is None


def test_the_self_test_reports_nccls_figures_and_never_passes_as_a_fabric() -> None:
    (rep,) = reports("self-test")
    assert SCENARIOS["self-test"]["ranks"][0]["exit"] == EXIT_OK
    assert rep["status"] == "ok" and rep["selfTest"] is True and rep["worldSize"] == 1
    (p,) = rep["pairs"]
    assert p["ranks"] == [0] and p["nodes"] == ["n0"] and p["transport"] == "none"
    assert p["busBandwidthGBs"] == 0.0  # nccl-tests' 2(n-1)/n of one rank
    assert 0 < p["latency8kUs"] < 1000 and 0 < p["latency64kUs"] < 1000  # 32.7, 29.8 µs
    assert "sharedGpu" not in p
    (me,) = rep["ranks"]
    assert me["gpu"]["name"] == "NVIDIA H200" and me["ncclVersion"] == "2.28.9+cuda13.0"
    v = verdict([rep], LOOSE)  # no fabric: below any bandwidth floor
    assert v.outcome == "refuse" and "bus bandwidth 0 GB/s < 1 GB/s" in v.message
    assert v.baseline is None


def test_a_real_net_socket_pair_on_a_shared_gpu_is_below_the_spark_floors() -> None:
    reps = reports("two-hosts-one-gpu")
    rank0 = reps[0]
    (p,) = rank0["pairs"]
    assert p["transport"] == "NET/Socket" and p["sharedGpu"] is True
    assert p["latency8kUs"] > 1000 and p["busBandwidthGBs"] < 10  # 4816.3 µs, 1.81 GB/s
    assert p["busBandwidthGBs"] == p["algBandwidthGBs"]  # a pair: 2(2-1)/2 = 1
    assert [r["ncclNodes"] for r in rank0["ranks"]] == [2, 2]  # NCCL counted two hosts
    v = verdict(reps, DEFAULT)
    assert v.outcome == "refuse"
    assert f"8 KiB all-reduce {p['latency8kUs']:g} µs > 100 µs" in v.message
    assert f"bus bandwidth {p['busBandwidthGBs']:g} GB/s < 10 GB/s" in v.message
    assert "n0-n1" in v.message and "NET/Socket" in v.message
    assert "interface lo (lo MTU 65536)" in v.message


def test_ibhca_where_nccl_finds_no_ib_device_is_its_silent_socket_fallback_named(
        tmp_path: Path) -> None:
    """The field's failure (NCCL on TCP sockets though the stack names HCAs), as NCCL really
    did it: the nodes' ibHca (a Spark's two HCAs) rendered into NCCL_IB_HCA, no such device
    on the machine, NCCL falls back to its sockets and says so only at INFO level."""
    sc = SCENARIOS["two-hosts-ibhca"]
    for r in sc["ranks"]:
        assert r["env"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and r["exit"] == EXIT_OK
        log = (RUN / f"two-hosts-ibhca.{r['node']}.nccl.log").read_text()
        assert "NCCL_IB_HCA set to rocep1s0f1,roceP2p1s0f1" in log
        assert "NET/IB : No device found." in log and "via NET/Socket/0" in log
        got = parsed(tmp_path, "two-hosts-ibhca", r["node"])
        assert (got["transport"], got["hcas"], got["gdr"]) == ("NET/Socket", [], False)
    reps = reports("two-hosts-ibhca")
    v = verdict(reps, LOOSE)  # every figure within the floors: the transport alone refuses
    assert v.outcome == "refuse" and not v.starts
    assert "NCCL on TCP sockets (NET/Socket) though n0, n1 set ibHca" in v.message
    assert "NCCL fell back to TCP sockets" in v.message
    assert "ibHca rocep1s0f1,roceP2p1s0f1; HCAs NCCL used: none; transport NET/Socket" in (
        v.message)
    row = v.message.splitlines()[2]  # the pair's row: its one problem is the transport
    assert row.startswith("  n0-n1") and row.endswith("NET/Socket) though n0, n1 set ibHca")
    assert " µs > " not in v.message and " GB/s < " not in v.message


def test_the_recorded_runs_pass_loose_floors_and_become_a_baseline() -> None:
    v = verdict(reports("two-hosts-one-gpu"), LOOSE, None, recorded="2026-12-02T17:03:00Z")
    assert v.outcome == "pass" and v.baseline is not None
    assert v.baseline["backend"] == "nccl" and v.baseline["bandwidthBytes"] == 64 * 2**20
    assert v.baseline["pairs"]["n0-n1"]["transport"] == "NET/Socket"
    three = verdict(reports("three-hosts-one-gpu"), LOOSE)
    assert three.outcome == "pass"
    assert [p["pair"] for p in three.pairs] == ["n0-n1", "n0-n2", "n1-n2"]
    assert all(p["sharedGpu"] and p["transport"] == "NET/Socket" for p in three.pairs)
    # three processes share the GPU: each pair slower than the pair alone
    two = v.pairs[0]["latency8kUs"]
    assert all(p["latency8kUs"] > two for p in three.pairs)
