"""The fabric check's verdict (components/fabric_verdict.py) and its settings (`fabricCheck`,
components/spec.py): every path from the nodes' reports to pass / warn / refuse / skip, and
every config error. Reports are shaped as scripts/fabric_check.py prints them (the CPU tier
runs the script for real: tests/cpu_tier/test_fabric_check.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from components.fabric_verdict import parse_report, verdict
from components.spec import FabricCheckSettings, SpecError, parse_spec

DEFAULT = FabricCheckSettings()
NODES = ("spark-a", "spark-b")


def rank(i: int, node: str, transport: str = "NET/IB", hca: str | None = "rocep1s0f1",
         mtu: int = 9000) -> dict[str, Any]:
    env = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1"}
    if hca:
        env["NCCL_IB_HCA"] = hca
    return {"rank": i, "node": node, "env": env, "mtu": {"enp1s0f1np1": mtu},
            "transport": transport, "hcas": [f"{hca}:1"] if hca and "IB" in transport else [],
            "gdr": False}


def pair(a: int, b: int, lat8: float = 30.0, lat64: float = 66.0, bw: float = 20.0,
         transport: str = "NET/IB", nodes: tuple[str, ...] = NODES) -> dict[str, Any]:
    return {"ranks": [a, b], "nodes": [nodes[a], nodes[b]], "latency8kUs": lat8,
            "latency64kUs": lat64, "busBandwidthGBs": bw, "bandwidthBytes": 64 * 2**20,
            "bandwidthSeconds": 0.0067, "transport": transport}


def reports(pairs: list[dict] | None = None, transport: str = "NET/IB",
            hca: str | None = "rocep1s0f1", nodes: tuple[str, ...] = NODES,
            backend: str = "nccl", mtu: int = 9000) -> list[dict[str, Any]]:
    ranks = [rank(i, n, transport, hca, mtu) for i, n in enumerate(nodes)]
    pairs = pairs if pairs is not None else [pair(0, 1, transport=transport)]
    base = {"check": "fabric", "status": "ok", "worldSize": len(nodes), "backend": backend,
            "ranks": ranks}
    out = [{**base, "rank": 0, "node": nodes[0], "pairs": pairs}]
    out += [{**base, "rank": i, "node": n, "pairs": [{k: v for k, v in p.items()
                                                      if k not in ("nodes", "transport")}
                                                     for p in pairs if i in p["ranks"]]}
            for i, n in enumerate(nodes) if i]
    return out


def good_baseline() -> dict[str, Any]:
    v = verdict(reports(), DEFAULT, None, recorded="2026-12-01T10:00:00Z")
    assert v.baseline is not None
    return v.baseline


# --- a good run -----------------------------------------------------------------------------

def test_a_healthy_pair_passes_and_its_first_run_becomes_the_baseline() -> None:
    v = verdict(reports(), DEFAULT, None, recorded="2026-12-01T10:00:00Z")
    assert v.outcome == "pass" and v.starts
    assert "baseline recorded" in v.message
    assert v.baseline == {"version": 1, "recorded": "2026-12-01T10:00:00Z", "backend": "nccl",
                          "bandwidthBytes": 64 * 2**20,
                          "pairs": {"spark-a-spark-b": {"latency8kUs": 30.0,
                                                        "latency64kUs": 66.0,
                                                        "busBandwidthGBs": 20.0,
                                                        "transport": "NET/IB"}}}
    assert v.pairs[0]["pair"] == "spark-a-spark-b" and "problems" not in v.pairs[0]
    json.dumps(v.baseline)  # it goes into the stack's outputs


def test_a_later_good_run_keeps_the_baseline_it_had() -> None:
    base = good_baseline()
    faster = reports([pair(0, 1, lat8=25, bw=23.0)])
    v = verdict(faster, DEFAULT, base, recorded="2026-12-02T10:00:00Z")
    assert v.outcome == "pass" and "within 25% of the baseline" in v.message
    assert v.baseline == base  # never moved by a later run, better or not


def test_a_socket_transport_without_ib_hca_passes_its_floors() -> None:
    v = verdict(reports(transport="NET/Socket", hca=None), DEFAULT)
    assert v.outcome == "pass", v.message


# --- below the floors: refused with the table -------------------------------------------------

@pytest.mark.parametrize("figures,problem", [
    ({"lat8": 180.0}, "8 KiB all-reduce 180 µs > 100 µs"),
    ({"lat64": 450.0}, "64 KiB all-reduce 450 µs > 200 µs"),
    # a ConnectX-7 that came up at ~13 Gb/s (dgx-spark-playbooks PR 108)
    ({"bw": 1.6}, "bus bandwidth 1.6 GB/s < 10 GB/s"),
])
def test_below_a_floor_is_refused_with_the_table(figures: dict, problem: str) -> None:
    v = verdict(reports([pair(0, 1, **figures)], mtu=1500), DEFAULT, None)
    assert v.outcome == "refuse" and not v.starts
    lines = v.message.splitlines()
    assert lines[0].startswith("fabric check: the fabric is below its floors")
    header = lines[1].split()
    assert header[:3] == ["pair", "8", "KiB"] and "transport" in header and "floor" in header
    row = lines[2]
    assert row.lstrip().startswith("spark-a-spark-b") and problem in row, v.message
    assert "NET/IB" in row and "8 KiB ≤ 100 µs, 64 KiB ≤ 200 µs, ≥ 10 GB/s" in row
    text = v.message
    assert "What to check for spark-a-spark-b:" in text
    # MTU (each end's, as measured on the node), the rail, the HCA name, the interface
    assert "spark-a: interface enp1s0f1np1 (enp1s0f1np1 MTU 1500); ibHca rocep1s0f1" in text
    for what in ("- MTU: 9000", "- the rail:", "- the HCA name: ibdev2netdev",
                 "- the interface: fabricInterface"):
        assert what in text, what
    assert v.baseline is None  # a refused run is never a baseline


def test_nccl_on_sockets_where_ib_hca_is_set_is_refused() -> None:
    v = verdict(reports(transport="NET/Socket"), DEFAULT, None)
    assert v.outcome == "refuse"
    assert ("NCCL on TCP sockets (NET/Socket) though spark-a, spark-b set ibHca"
            in v.message), v.message
    assert "NCCL fell back to TCP sockets" in v.message


def test_only_the_pairs_below_get_their_hints() -> None:
    nodes = ("n1", "n2", "n3")
    pairs = [pair(0, 1, nodes=nodes), pair(0, 2, nodes=nodes, bw=3.0),
             pair(1, 2, nodes=nodes)]
    v = verdict(reports(pairs, nodes=nodes), DEFAULT, None)
    assert v.outcome == "refuse"
    rows = [ln for ln in v.message.splitlines() if ln.startswith("  n")]
    assert [r.split()[0] for r in rows[:3]] == ["n1-n2", "n1-n3", "n2-n3"]
    assert rows[0].endswith("ok") and "bus bandwidth 3 GB/s < 10 GB/s" in rows[1]
    assert "What to check for n1-n3:" in v.message
    assert "What to check for n1-n2:" not in v.message


def test_the_floors_are_the_configs() -> None:
    lab = FabricCheckSettings(maxLatency8k=5000, maxLatency64k=8000, minBusBandwidth=0.05)
    assert verdict(reports([pair(0, 1, 1200, 1500, 0.6)]), lab).outcome == "pass"
    v = verdict(reports([pair(0, 1, 1200, 1500, 0.01)]), lab)
    assert v.outcome == "refuse" and "0.01 GB/s < 0.05 GB/s" in v.message
    assert "8 KiB ≤ 5000 µs, 64 KiB ≤ 8000 µs, ≥ 0.05 GB/s" in v.message


# --- against the baseline ---------------------------------------------------------------------

def test_worse_than_the_baseline_warns_naming_the_pair_and_both_figures() -> None:
    base = good_baseline()
    # one rail lost: 20 -> 12 GB/s, still above the 10 GB/s floor
    v = verdict(reports([pair(0, 1, bw=12.0)]), DEFAULT, base)
    assert v.outcome == "warn" and v.starts
    assert "worse than the cluster's baseline (recorded 2026-12-01T10:00:00Z) by more than 25%" \
        in v.message
    assert "spark-a-spark-b: bus bandwidth 12 GB/s, 40% below the baseline's 20 GB/s" \
        in v.message
    assert v.baseline == base


def test_worse_than_the_baseline_refuses_when_configured() -> None:
    base = good_baseline()
    cfg = FabricCheckSettings(onDegraded="refuse")
    v = verdict(reports([pair(0, 1, lat8=45.0, lat64=95.0)]), cfg, base)
    assert v.outcome == "refuse"
    assert "spark-a-spark-b: 8 KiB all-reduce 45 µs, 50% above the baseline's 30 µs" in v.message
    assert "64 KiB all-reduce 95 µs, 44% above the baseline's 66 µs" in v.message
    assert "(fabricCheck.onDegraded: refuse)" in v.message


def test_within_the_tolerance_is_not_degraded() -> None:
    base = good_baseline()
    v = verdict(reports([pair(0, 1, lat8=37.0, bw=15.5)]), DEFAULT, base)  # 23 %, 22.5 %
    assert v.outcome == "pass", v.message
    tight = FabricCheckSettings(baselineTolerance=0.1)
    assert verdict(reports([pair(0, 1, lat8=37.0, bw=15.5)]), tight, base).outcome == "warn"


def test_another_transport_than_the_baselines_is_degraded() -> None:
    base = good_baseline()
    v = verdict(reports(transport="NET/Socket", hca=None), DEFAULT, base)
    assert v.outcome == "warn"
    assert "transport NET/Socket, the baseline's NET/IB" in v.message


def test_a_baseline_of_another_backend_or_message_is_recorded_again() -> None:
    base = good_baseline()
    v = verdict(reports(backend="gloo", transport="gloo/tcp", hca=None), DEFAULT, base,
                recorded="now")
    assert v.outcome == "pass" and "recorded again" in v.message
    assert v.baseline and v.baseline["backend"] == "gloo" and v.baseline["recorded"] == "now"
    other = copy.deepcopy(base)
    other["bandwidthBytes"] = 2**20
    assert "recorded again" in verdict(reports(), DEFAULT, other).message


def test_a_new_pair_joins_the_baseline() -> None:
    base = good_baseline()
    nodes = ("spark-a", "spark-b", "spark-c")
    pairs = [pair(0, 1, nodes=nodes), pair(0, 2, nodes=nodes), pair(1, 2, nodes=nodes)]
    v = verdict(reports(pairs, nodes=nodes), DEFAULT, base)
    assert v.outcome == "pass" and v.baseline
    assert set(v.baseline["pairs"]) == {"spark-a-spark-b", "spark-a-spark-c", "spark-b-spark-c"}
    assert v.baseline["recorded"] == base["recorded"]


# --- could not run, or failed -----------------------------------------------------------------

def unavailable() -> list[dict[str, Any]]:
    why = "torch is not importable with /usr/bin/python3: No module named 'torch'"
    return [{"check": "fabric", "status": "unavailable", "rank": i, "node": n, "reason": why}
            for i, n in enumerate(NODES)]


@pytest.mark.parametrize("mode,outcome,said", [
    ("refuse", "refuse", "Nothing started: the check runs in the serving image (torch"),
    ("warn", "warn", "started without it (fabricCheck.onUnavailable: warn)"),
    ("skip", "skip", "skipped (fabricCheck.onUnavailable: skip)"),
])
def test_where_it_cannot_run_the_config_decides_and_says_why(mode: str, outcome: str,
                                                             said: str) -> None:
    base = good_baseline()
    v = verdict(unavailable(), FabricCheckSettings(onUnavailable=mode), base)
    assert v.outcome == outcome and said in v.message
    assert "spark-a: torch is not importable with /usr/bin/python3" in v.message
    assert v.baseline == base  # kept as it was


def test_unavailable_on_one_node_outweighs_the_others_waiting_for_it() -> None:
    rs = [unavailable()[1], {"check": "fabric", "status": "error", "rank": 0, "node": "spark-a",
                             "phase": "init", "timedOut": True, "error": "no result"}]
    v = verdict(rs, DEFAULT)
    assert v.outcome == "refuse" and "could not run (spark-b: torch" in v.message


@pytest.mark.parametrize("phase,error,hint", [
    ("interface", "checking the fabric interface: RuntimeError: GLOO_SOCKET_IFNAME=eth9: no "
                  "interface 'eth9' on this node (it has eth0, lo)", "- the interface:"),
    ("init", "no result within the check's deadline of 90 s: it was forming the group",
     "- the rendezvous:"),
    ("bandwidth", "no result within the check's deadline of 90 s", "- the fabric:"),
])
def test_a_failed_run_refuses_naming_the_node_and_the_phase(phase: str, error: str,
                                                            hint: str) -> None:
    rs = reports()
    rs[1] = {"check": "fabric", "status": "error", "rank": 1, "node": "spark-b",
             "phase": phase, "error": error, "timedOut": phase != "interface",
             "log": ["gloo: connect refused"]}
    v = verdict(rs, DEFAULT)
    assert v.outcome == "refuse"
    assert f"spark-b (rank 1): {phase}" in v.message and error in v.message
    assert "| gloo: connect refused" in v.message and hint in v.message


def test_no_report_or_no_rank_0_is_refused() -> None:
    assert verdict([], DEFAULT).outcome == "refuse"
    rs = reports()[1:]
    v = verdict(rs, DEFAULT)
    assert v.outcome == "refuse" and "rank 0" in v.message


def test_parse_report_takes_the_last_json_line_and_names_the_node_otherwise() -> None:
    line = json.dumps({"check": "fabric", "status": "ok", "rank": 1})
    assert parse_report("spark-b", f"noise\n{line}\n")["status"] == "ok"
    bad = parse_report("spark-b", "docker: Error response from daemon: no such image\n", 125)
    assert bad["status"] == "error" and bad["node"] == "spark-b"
    assert "no report from the fabric check (exit 125): docker: Error" in bad["error"]
    assert parse_report("spark-b", "")["error"].endswith("(nothing)")
    docker = parse_report("spark-b", "", 0, "x\ndocker: Error response from daemon: pull "
                          "access denied\n")
    assert docker["log"] == ["x", "docker: Error response from daemon: pull access denied"]
    assert "| docker: Error response" in verdict([docker], DEFAULT).message


# --- the settings ----------------------------------------------------------------------------

RAW = {"nodes": [{"name": "a", "host": "10.0.0.1"}, {"name": "b", "host": "10.0.0.2"}],
       "image": "img", "model": "org/m", "tensorParallelSize": 2,
       "insecureAcceptAnyHostKey": True}


def spec_with(fabric: Any) -> Any:
    return parse_spec({**RAW, "fabricCheck": fabric}, "s", frozenset({"sshPrivateKey"}))


def problems_of(fabric: Any) -> list[str]:
    with pytest.raises(SpecError) as err:
        spec_with(fabric)
    return err.value.problems


def test_the_defaults_are_a_spark_pairs() -> None:
    fc = parse_spec(RAW, "s", frozenset({"sshPrivateKey"})).fabric_check
    assert fc == DEFAULT
    assert (fc.max_latency_8k, fc.max_latency_64k, fc.min_bus_bandwidth) == (100, 200, 10)
    assert (fc.bandwidth_message, fc.baseline_tolerance, fc.timeout) == (64, 0.25, 90)
    assert (fc.on_degraded, fc.on_unavailable) == ("warn", "refuse")


def test_the_settings_are_read_in_camel_case() -> None:
    fc = spec_with({"maxLatency8k": 5000, "maxLatency64k": 9000.5, "minBusBandwidth": 0,
                    "bandwidthMessage": 4, "baselineTolerance": 0.5, "onDegraded": "refuse",
                    "onUnavailable": "skip", "timeout": 30}).fabric_check
    assert fc.max_latency_64k == 9000.5 and fc.min_bus_bandwidth == 0
    assert fc.on_unavailable == "skip" and fc.bandwidth_message == 4


@pytest.mark.parametrize("fabric,problem", [
    ({"maxLatency8k": 0}, "fabricCheck.maxLatency8k: Input should be greater than 0"),
    ({"maxLatency64k": -5}, "fabricCheck.maxLatency64k: Input should be greater than 0"),
    ({"maxLatency8k": True}, "fabricCheck.maxLatency8k: Input should be a valid number"),
    ({"minBusBandwidth": "fast"}, "fabricCheck.minBusBandwidth: Input should be a valid number"),
    ({"minBusBandwidth": -1}, "fabricCheck.minBusBandwidth: Input should be greater than or "
                              "equal to 0"),
    ({"bandwidthMessage": 16384}, "fabricCheck.bandwidthMessage: Input should be less than or "
                                  "equal to 256"),
    ({"bandwidthMessage": 0}, "fabricCheck.bandwidthMessage: Input should be greater than or "
                              "equal to 1"),
    ({"bandwidthMessage": 1.5}, "fabricCheck.bandwidthMessage: Input should be a valid integer"),
    ({"baselineTolerance": 1}, "fabricCheck.baselineTolerance: Input should be less than 1"),
    ({"baselineTolerance": 0}, "fabricCheck.baselineTolerance: Input should be greater than 0"),
    ({"onDegraded": "ignore"}, "fabricCheck.onDegraded: Input should be 'warn' or 'refuse'"),
    ({"onUnavailable": "pass"}, "fabricCheck.onUnavailable: Input should be 'refuse', 'warn' "
                                "or 'skip'"),
    ({"timeout": 5}, "fabricCheck.timeout: Input should be greater than or equal to 10"),
    ({"timeout": 601}, "fabricCheck.timeout: Input should be less than or equal to 600"),
    ({"minBusBandwith": 5}, "fabricCheck.minBusBandwith: unknown key (a typo?)"),
    ({"maxLatency8k": 100, "maxLatency64k": 50},
     "fabricCheck.maxLatency64k: 50 µs is below maxLatency8k (100 µs); a 64 KiB all-reduce "
     "takes at least as long as an 8 KiB one"),
    ("on", "fabricCheck: expected a mapping of its keys (docs/configuration.md)"),
])
def test_each_bad_setting_is_named(fabric: Any, problem: str) -> None:
    assert problems_of(fabric) == [problem]


def test_every_problem_at_once() -> None:
    got = problems_of({"maxLatency8k": 0, "onDegraded": "x", "typo": 1})
    assert [p.split(":")[0] for p in got] == ["fabricCheck.maxLatency8k",
                                              "fabricCheck.onDegraded", "fabricCheck.typo"]


def test_the_setting_arrives_from_pulumi_as_json_text() -> None:
    from components.spec import decode_config
    raw, _ = decode_config({"spark-vllm:fabricCheck": json.dumps({"minBusBandwidth": 0.5})})
    assert raw == {"fabricCheck": {"minBusBandwidth": 0.5}}
