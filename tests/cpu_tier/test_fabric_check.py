"""The fabric check's own script (components/scripts/fabric_check.py) with real torch and gloo,
across the CPU tier's two network-namespace nodes (lab/cpu_tier/nodes.py) over their fabric
veth, each rank with the env the program gives that node's ranks (render/commands.py
node_env): its verdict (components/fabric_verdict.py) on a healthy fabric, on one throttled
with `tc`, with a wrong fabricInterface, and against the baseline of a healthy run.

Only the script runs here (no vLLM, no Ray): ~40 s on a 2-core machine. The floors are the
lab's (a veth between namespaces on a shared CPU is not a ConnectX-7: gloo measured ~1 ms at
8 KiB and 0.5-0.9 GB/s there); the message is 4 MiB, so a throttled run stays short. Needs
root (namespaces, tc), as CI has; holds nothing on the machine afterwards (asserted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from components.fabric_verdict import Verdict, parse_report, verdict  # noqa: E402
from components.render import commands  # noqa: E402
from components.render import fabric_commands as fabric  # noqa: E402
from components.spec import ClusterSpec, FabricCheckSettings, parse_spec  # noqa: E402
from lab.cpu_tier.nodes import Node, Nodes  # noqa: E402
from tests.cpu_tier.tier import cpu_venv  # noqa: E402

pytestmark = pytest.mark.slow  # real torch across two network namespaces

SCRIPT_FILE = REPO / "components" / "scripts" / "fabric_check.py"  # sent on stdin, as by the
# program: `python3 - ARGS`
MESSAGE = 4 * 2**20
DEADLINE_S = 40  # the script's own bound, per run (fabricCheck.timeout)
RUN_BOUND_S = DEADLINE_S + 20  # ours over it: the script must end by itself
# the lab's floors: a healthy veth passes with a margin of ~5x, the throttled one below
LAB = FabricCheckSettings(maxLatency8k=50000, maxLatency64k=100000, minBusBandwidth=0.1,
                          bandwidthMessage=4)
# 200 Mbit/s each way: a 4 MiB all-reduce of a pair moves 4 MiB each way, ~0.025 GB/s
THROTTLE = ["tbf", "rate", "200mbit", "burst", "64kb", "latency", "400ms"]


def spec_for(nodes: Nodes, port: int, deadline_s: int,
             interfaces: dict[str, str] | None = None) -> ClusterSpec:
    """The lab's two nodes as a stack (each node's identity its fabric address; no GPU: gloo),
    with the check's message and deadline for the lab."""
    raw = {"nodes": [{"name": n.name, "host": n.fabric_ip, "fabricIp": n.fabric_ip,
                      "fabricInterface": (interfaces or {}).get(n.name, n.fabric_if)}
                     for n in nodes.nodes],
           "image": "spark-vllm-cpu", "model": "spark-vllm/tiny-dense",
           "tensorParallelSize": 2, "insecureAcceptAnyHostKey": True, "dockerGpus": "none",
           "checkGpu": False, "backend": "native", "masterPort": port - fabric.PORT_OFFSET,
           "fabricCheck": {"bandwidthMessage": MESSAGE // 2**20, "timeout": deadline_s}}
    return parse_spec(raw, "fabric", frozenset({"sshPrivateKey"}))


def run_check(nodes: Nodes, venv: str, port: int,
              interfaces: dict[str, str] | None = None,
              deadline_s: int = DEADLINE_S) -> list[dict[str, Any]]:
    """The check on both nodes at once, as the program renders it for them
    (render/fabric_commands.py docker_argv): its env (`--env`, the node's ranks' env) and its
    `python3 - ARGS`, the script on stdin; the container aside (the venv is the image). Each
    node's one JSON line, parsed."""
    spec = spec_for(nodes, port, deadline_s, interfaces)
    procs = []
    try:
        for lab, node in zip(nodes.nodes, spec.nodes, strict=True):
            docker = fabric.docker_argv(spec, node)
            env = dict(kv.split("=", 1) for flag, kv in zip(docker, docker[1:], strict=False)
                       if flag == "--env")
            assert env == commands.node_env(spec, node)
            entry = docker.index("--entrypoint")
            assert docker[entry + 1:entry + 4] == ["python3", spec.image, "-"]
            argv = [f"{venv}/bin/python", "-", *docker[entry + 4:]]
            assert argv[2:] == fabric.script_args(spec, node)
            with SCRIPT_FILE.open() as stdin:
                procs.append((lab, subprocess.Popen(
                    nodes.argv(lab, argv), stdin=stdin, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True,
                    env={"PATH": os.environ["PATH"], **nodes.env(lab), **env})))
        out = []
        for lab, p in procs:
            try:
                stdout, stderr = p.communicate(timeout=RUN_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{lab.name}: the script ran past its own deadline ({deadline_s} s)")
            report = parse_report(lab.name, stdout, p.returncode)
            report["exit"] = p.returncode
            report["stderr"] = stderr[-2000:]
            out.append(report)
        return out
    finally:
        for _, p in procs:  # only after a failure here: each ended by itself otherwise
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def throttle(node: Node, on: bool) -> str:
    """`tc` on the node's end of the fabric veth; what `tc qdisc show` says after."""
    verb = ["add", "dev", node.fabric_if, "root", *THROTTLE] if on else \
        ["del", "dev", node.fabric_if, "root"]
    subprocess.run(["ip", "netns", "exec", node.netns, "tc", "qdisc", *verb], check=True,
                   capture_output=True, timeout=10)
    return subprocess.run(["ip", "netns", "exec", node.netns, "tc", "qdisc", "show", "dev",
                           node.fabric_if], capture_output=True, text=True, check=True,
                          timeout=10).stdout


def _scratch() -> set[str]:
    return {p for p in os.listdir("/tmp") if p.startswith("spark-vllm-fabric-")}


@pytest.fixture(scope="module")
def lab() -> Iterator[dict[str, Any]]:
    venv = cpu_venv()
    nodes = Nodes()
    scratch = _scratch()
    nodes.up()
    state: dict[str, Any] = {"nodes": nodes, "venv": venv,
                             "ports": iter(range(29650, 29700))}
    try:
        yield state
    finally:
        for n in nodes.nodes:  # a failed test may have left its throttle
            subprocess.run(["ip", "netns", "exec", n.netns, "tc", "qdisc", "del", "dev",
                            n.fabric_if, "root"], capture_output=True, timeout=10)
        # nothing the check started outlives it: on each node, its holder alone
        left = {n.name: sorted(set(nodes.pids(n)) - {n.holder}) for n in nodes.nodes}
        nodes.down()
    assert left == {"n0": [], "n1": []}, left
    assert Nodes().leftovers() == []
    assert _scratch() == scratch  # the script removed its temporary directory


def check(lab: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    return run_check(lab["nodes"], lab["venv"], next(lab["ports"]), **kw)


@pytest.fixture(scope="module")
def healthy(lab: dict[str, Any]) -> tuple[list[dict[str, Any]], Verdict]:
    reports = check(lab)
    return reports, verdict(reports, LAB, None, recorded="healthy run")


def test_healthy_fabric_passes_and_records_the_baseline(healthy: tuple[list, Verdict]) -> None:
    reports, v = healthy
    assert [r["exit"] for r in reports] == [0, 0], reports
    assert v.outcome == "pass", v.message
    assert v.baseline and set(v.baseline["pairs"]) == {"n0-n1"}
    base = v.baseline["pairs"]["n0-n1"]
    assert base["transport"] == "gloo/tcp" and base["busBandwidthGBs"] > LAB.min_bus_bandwidth
    assert v.baseline["bandwidthBytes"] == MESSAGE and v.baseline["backend"] == "gloo"
    # each rank ran with its own node's fabric env, and measured its own interface's MTU
    ranks = {r["node"]: r for r in reports[0]["ranks"]}
    for name, ifname, ip in (("n0", "spvf0", "10.99.0.10"), ("n1", "spvf1", "10.99.0.11")):
        assert ranks[name]["env"]["GLOO_SOCKET_IFNAME"] == ifname
        assert ranks[name]["env"]["VLLM_HOST_IP"] == ip
        assert ranks[name]["mtu"] == {ifname: 1500}
    print("healthy:", json.dumps(v.pairs), "seconds:", [r["seconds"] for r in reports])


def test_a_throttled_fabric_is_refused_with_the_table(lab: dict[str, Any]) -> None:
    nodes = lab["nodes"]
    for n in nodes.nodes:
        assert "tbf" in throttle(n, True)
    try:
        reports = check(lab)
    finally:
        for n in nodes.nodes:
            assert "tbf" not in throttle(n, False)
    assert [r["exit"] for r in reports] == [0, 0], reports
    v = verdict(reports, LAB, None)
    print("throttled:", v.message)
    assert v.outcome == "refuse" and not v.starts, v.message
    assert v.baseline is None
    rows = v.message.splitlines()
    assert rows[0].startswith("fabric check: the fabric is below its floors")
    assert "pair" in rows[1] and "bus bandwidth" in rows[1] and "floor" in rows[1]
    assert rows[2].lstrip().startswith("n0-n1") and "gloo/tcp" in rows[2]
    assert "GB/s < 0.1 GB/s" in rows[2], v.message
    assert v.pairs[0]["busBandwidthGBs"] < 0.05  # 200 Mbit/s: ~0.025 GB/s
    assert "n0: interface spvf0 (spvf0 MTU 1500)" in v.message
    assert "n1: interface spvf1 (spvf1 MTU 1500)" in v.message
    assert "- MTU: 9000" in v.message and "- the rail:" in v.message


def test_a_wrong_fabric_interface_is_named(lab: dict[str, Any]) -> None:
    reports = check(lab, interfaces={"n1": "spvf9"}, deadline_s=15)  # rank 0 waits: short
    n0, n1 = reports
    assert n1["exit"] == 1 and n1["phase"] == "interface", n1
    assert "GLOO_SOCKET_IFNAME=spvf9: no interface 'spvf9' on this node" in n1["error"]
    assert "spvf1" in n1["error"]  # what the node has instead
    assert n0["exit"] in (1, 3) and n0["phase"] == "init", n0  # rank 1 never came
    v = verdict(reports, LAB, None)
    assert v.outcome == "refuse"
    assert "n1 (rank 1): interface: checking the fabric interface: RuntimeError: " \
           "GLOO_SOCKET_IFNAME=spvf9: no interface 'spvf9'" in v.message
    assert "- the interface: fabricInterface of that node" in v.message


def test_a_degraded_run_is_warned_against_the_baseline(
        lab: dict[str, Any], healthy: tuple[list, Verdict]) -> None:
    _, first = healthy
    assert first.baseline is not None
    nodes = lab["nodes"]
    for n in nodes.nodes:
        throttle(n, True)
    try:
        reports = check(lab)
    finally:
        for n in nodes.nodes:
            throttle(n, False)
    # floors the throttled fabric still passes: only the baseline can tell
    lenient = LAB.model_copy(update={"min_bus_bandwidth": 0.005})
    v = verdict(reports, lenient, first.baseline)
    print("degraded:", v.message)
    assert v.outcome == "warn" and v.starts, v.message
    before = first.baseline["pairs"]["n0-n1"]["busBandwidthGBs"]
    now = v.pairs[0]["busBandwidthGBs"]
    assert f"n0-n1: bus bandwidth {now:g} GB/s" in v.message
    assert f"below the baseline's {before:g} GB/s" in v.message
    assert "(recorded healthy run)" in v.message
    assert v.baseline == first.baseline  # the degraded run did not become the baseline
    refuse = verdict(reports, lenient.model_copy(update={"on_degraded": "refuse"}),
                     first.baseline)
    assert refuse.outcome == "refuse" and "onDegraded: refuse" in refuse.message
