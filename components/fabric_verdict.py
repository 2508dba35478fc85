"""The fabric check's verdict: the script's reports in, pass / warn / refuse / skip out. Pure.

Every node runs scripts/fabric_check.py once (one rank each, the env its ranks get); each prints
one JSON line. `verdict` reads them all with the stack's `fabricCheck` settings and the
baseline kept in the stack's outputs:

- a node where the check could not run (no torch in the image, no GPU for NCCL) decides by
  `onUnavailable`: refuse, warn, or skip (said, never a silent pass);
- a node whose run failed (an interface that is not there, no rendezvous with rank 0, the
  deadline passed) refuses, naming the node, the phase and what to check;
- a pair below a floor (`maxLatency8k`, `maxLatency64k`, `minBusBandwidth`), or on NCCL's
  socket transport while its nodes set `ibHca`, refuses with a per-pair table and what to
  check: MTU, the rail, the HCA name, the interface;
- otherwise the run is good. The first good run becomes the baseline (`baseline` of the
  verdict: store it in the stack's outputs and pass it back next time); a later run more than
  `baselineTolerance` worse than it in any figure, or on another transport, is degraded:
  `onDegraded` warns or refuses, naming the pair and both figures. A good run never moves the
  baseline (a slow drift would pass otherwise); a baseline taken with another backend or
  message size is replaced, and said.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .spec import FabricCheckSettings

BASELINE_VERSION = 1
Outcome = Literal["pass", "warn", "refuse", "skip"]
# the script's exit codes (scripts/fabric_check.py)
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4
FIGURES = (("latency8kUs", "8 KiB all-reduce", "µs", +1),
           ("latency64kUs", "64 KiB all-reduce", "µs", +1),
           ("busBandwidthGBs", "bus bandwidth", "GB/s", -1))  # +1: higher is worse


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    message: str  # the table or the warning; a line on a plain pass
    pairs: list[dict[str, Any]] = field(default_factory=list)  # each pair's figures
    baseline: dict[str, Any] | None = None  # what the stack's outputs hold from now on

    @property
    def starts(self) -> bool:
        """Whether the ranks may start."""
        return self.outcome != "refuse"


def parse_report(node: str, stdout: str, exit_code: int | None = None,
                 stderr: str = "") -> dict[str, Any]:
    """A node's report: the last JSON line of the script's stdout; anything else (a container
    that did not start, a shell error) is an error naming the node and what came out."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            out = json.loads(line)
        except ValueError:
            continue
        if isinstance(out, dict) and out.get("check") == "fabric":
            return {"node": node, **out}
    shown = stdout.strip()[-300:] or "(nothing)"
    return {"check": "fabric", "node": node, "status": "error", "phase": "start",
            "error": f"no report from the fabric check (exit {exit_code}): {shown}",
            "log": stderr.strip().splitlines()[-5:]}


def settings_line(cfg: FabricCheckSettings) -> str:
    return (f"8 KiB ≤ {cfg.max_latency_8k:g} µs, 64 KiB ≤ {cfg.max_latency_64k:g} µs, "
            f"≥ {cfg.min_bus_bandwidth:g} GB/s")


# --- what to check -----------------------------------------------------------------------

def _rank_of(report: Mapping[str, Any], node: str) -> Mapping[str, Any]:
    return next((r for r in report.get("ranks", []) if r.get("node") == node), {})


def _hints(pair: Mapping[str, Any], rank0: Mapping[str, Any], problems: list[str]) -> list[str]:
    out = []
    for node in pair["nodes"]:
        r = _rank_of(rank0, node)
        env = r.get("env", {})
        ifname = env.get("NCCL_SOCKET_IFNAME") or env.get("GLOO_SOCKET_IFNAME")
        mtus = r.get("mtu", {})
        mtu = ", ".join(f"{k} MTU {v}" for k, v in mtus.items()) or "MTU unknown"
        hca = env.get("NCCL_IB_HCA")
        used = ", ".join(r.get("hcas", [])) or "none"
        out.append(f"  {node}: interface {ifname or '(unset)'} ({mtu}); ibHca "
                   f"{hca or '(unset)'}; HCAs NCCL used: {used}; transport "
                   f"{r.get('transport', '?')}")
    socket = any("socket" in p for p in problems)
    out += [
        "  - MTU: 9000 on both ends of the link (and any switch port): jumbo frames on the "
        "fabric interface (github.com/NVIDIA/dgx-spark-playbooks PR 103, issue 25)",
        "  - the rail: a Spark's QSFP port is two PCIe x4 halves; both HCAs in ibHca "
        "(e.g. rocep1s0f1,roceP2p1s0f1) or NCCL runs at half the port (playbooks PR 103; "
        "tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark PR 35)",
        "  - the HCA name: ibdev2netdev maps each HCA to its interface; ibHca must name the "
        "HCAs of fabricInterface's port" + ("; NCCL fell back to TCP sockets: NCCL_IB_HCA "
                                            "names no usable HCA, or the image's NCCL lacks "
                                            "its IB plugin" if socket else ""),
        "  - the interface: fabricInterface must hold the node's fabricIp and be up; a "
        "ConnectX-7 can negotiate 200 Gb/s and still carry ~13 Gb/s (playbooks PR 108: "
        "measure each rail with ib_write_bw, reboot or re-seat to recover)",
    ]
    return out


# --- the verdict -------------------------------------------------------------------------

def _fmt(value: Any, unit: str) -> str:
    return f"{value:g} {unit}" if isinstance(value, (int, float)) else "-"


def _table(rows: Sequence[Mapping[str, Any]], floor: str) -> list[str]:
    head = ("pair", "8 KiB", "64 KiB", "bus bandwidth", "transport", "floor", "problem")
    cells = [head] + [(r["pair"], _fmt(r.get("latency8kUs"), "µs"),
                       _fmt(r.get("latency64kUs"), "µs"),
                       _fmt(r.get("busBandwidthGBs"), "GB/s"), r.get("transport", "?"), floor,
                       "; ".join(r.get("problems", [])) or "ok") for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    return ["  " + "  ".join(c[i].ljust(widths[i]) for i in range(len(head) - 1)) + "  " + c[-1]
            for c in cells]


def _pair_name(nodes: Sequence[str]) -> str:
    return "-".join(nodes)


def _floor_problems(p: Mapping[str, Any], rank0: Mapping[str, Any],
                    cfg: FabricCheckSettings) -> list[str]:
    out = []
    if p["latency8kUs"] > cfg.max_latency_8k:
        out.append(f"8 KiB all-reduce {p['latency8kUs']:g} µs > {cfg.max_latency_8k:g} µs")
    if p["latency64kUs"] > cfg.max_latency_64k:
        out.append(f"64 KiB all-reduce {p['latency64kUs']:g} µs > {cfg.max_latency_64k:g} µs")
    if p["busBandwidthGBs"] < cfg.min_bus_bandwidth:
        out.append(f"bus bandwidth {p['busBandwidthGBs']:g} GB/s < {cfg.min_bus_bandwidth:g} "
                   "GB/s")
    with_hca = [n for n in p["nodes"] if _rank_of(rank0, n).get("env", {}).get("NCCL_IB_HCA")]
    if "NET/Socket" in p.get("transport", "") and with_hca:
        out.append(f"NCCL on TCP sockets (NET/Socket) though {', '.join(with_hca)} set ibHca")
    return out


def _failed(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for r in reports:
        if r.get("status") != "error":
            continue
        phase = r.get("phase", "?")
        lines.append(f"  {r.get('node', '?')} (rank {r.get('rank', '?')}): {phase}"
                     f"{' (timed out)' if r.get('timedOut') else ''}: {r.get('error', '')}")
        for log in r.get("log", [])[-5:]:
            lines.append(f"      | {log}")
    # (NCCL's "two ranks on one GPU" is said by the script itself: it is no rendezvous problem)
    phases = {r.get("phase") for r in reports if r.get("status") == "error"
              and r.get("cause") != "duplicate-gpu"}
    if "interface" in phases:
        lines.append("  - the interface: fabricInterface of that node must name one of its "
                     "interfaces (ip -br link), the one that holds its fabricIp")
    if "init" in phases:
        lines.append("  - the rendezvous: every node must reach rank 0's identity IP and port "
                     "over the fabric (route, firewall, the interface that holds the IP), and "
                     "every node must run the check")
    if phases & {"latency", "bandwidth"}:
        lines.append("  - the fabric: the group formed but its collectives did not finish in "
                     "time: far below any floor (MTU, the rail, a degraded link)")
    return lines


def baseline_of(pairs: Sequence[Mapping[str, Any]], backend: str, message_bytes: int,
                recorded: str) -> dict[str, Any]:
    return {"version": BASELINE_VERSION, "recorded": recorded, "backend": backend,
            "bandwidthBytes": message_bytes,
            "pairs": {p["pair"]: {k: p[k] for k in ("latency8kUs", "latency64kUs",
                                                    "busBandwidthGBs", "transport")}
                      for p in pairs}}


def _degraded(p: Mapping[str, Any], base: Mapping[str, Any], tolerance: float) -> list[str]:
    out = []
    for key, what, unit, sign in FIGURES:
        now, then = p[key], base.get(key)
        if not isinstance(then, (int, float)) or then <= 0:
            continue
        change = (now - then) / then * sign  # > 0: worse
        if change > tolerance:
            word = "above" if sign > 0 else "below"
            out.append(f"{what} {now:g} {unit}, {abs(now - then) / then:.0%} {word} the "
                       f"baseline's {then:g} {unit}")
    if base.get("transport") and p.get("transport") != base["transport"]:
        out.append(f"transport {p.get('transport')}, the baseline's {base['transport']}")
    return out


def verdict(reports: Sequence[Mapping[str, Any]], cfg: FabricCheckSettings,
            baseline: Mapping[str, Any] | None = None, recorded: str = "") -> Verdict:
    """`reports`: every node's report (parse_report); `baseline`: the stack's, or None;
    `recorded`: when this run happened (kept in a new baseline)."""
    if not reports:
        return Verdict("refuse", "fabric check: no node reported")
    old = dict(baseline) if baseline else None
    unavailable = [r for r in reports if r.get("status") == "unavailable"]
    if unavailable:  # the others then wait for it and fail: the cause is this
        why = "; ".join(f"{r.get('node', '?')}: {r.get('reason', '?')}" for r in unavailable)
        text = f"fabric check could not run ({why})"
        if cfg.on_unavailable == "refuse":
            return Verdict("refuse", f"{text}. Nothing started: the check runs in the serving "
                           "image (torch, and CUDA for NCCL on GPU nodes); set "
                           "fabricCheck.onUnavailable to warn or skip to start without it.",
                           baseline=old)
        if cfg.on_unavailable == "warn":
            return Verdict("warn", f"{text}; started without it (fabricCheck.onUnavailable: "
                           "warn)", baseline=old)
        return Verdict("skip", f"{text}; skipped (fabricCheck.onUnavailable: skip)",
                       baseline=old)
    failed = _failed(reports)
    if failed:
        return Verdict("refuse", "\n".join([
            "fabric check failed: the nodes could not run a collective across the fabric; "
            "nothing started.", *failed]), baseline=old)
    rank0 = next((r for r in reports if r.get("rank") == 0 and "nodes" in
                  (r.get("pairs") or [{}])[0]), None)
    if rank0 is None:
        return Verdict("refuse", "fabric check: rank 0 (the first node) reported no pair's "
                       "figures", baseline=old)
    pairs = [{**p, "pair": _pair_name(p["nodes"])} for p in rank0["pairs"]]
    for p in pairs:
        p["problems"] = _floor_problems(p, rank0, cfg)
    floor = settings_line(cfg)
    below = [p for p in pairs if p["problems"]]
    shown = [{k: v for k, v in p.items() if k != "problems"} for p in pairs]
    if below:
        lines = ["fabric check: the fabric is below its floors (fabricCheck); nothing "
                 "started.", *_table(pairs, floor)]
        for p in below:
            lines.append(f"What to check for {p['pair']}:")
            lines += _hints(p, rank0, p["problems"])
        return Verdict("refuse", "\n".join(lines), shown, old)

    message_bytes = pairs[0]["bandwidthBytes"]
    backend = rank0.get("backend", "?")
    fresh = baseline_of(pairs, backend, message_bytes, recorded)
    if (not old or old.get("version") != BASELINE_VERSION or old.get("backend") != backend
            or old.get("bandwidthBytes") != message_bytes):
        why = "recorded" if not old else (
            f"recorded again (the old one was taken with {old.get('backend')} and "
            f"{old.get('bandwidthBytes')} bytes)")
        return Verdict("pass", f"fabric check passed ({floor}); the cluster's baseline "
                       f"{why}", shown, fresh)
    kept = {**old, "pairs": {**fresh["pairs"], **old.get("pairs", {})}}  # new pairs join
    worse = []
    for p in pairs:
        base = old.get("pairs", {}).get(p["pair"])
        if base:
            worse += [f"  {p['pair']}: {w}" for w in _degraded(p, base, cfg.baseline_tolerance)]
    if not worse:
        return Verdict("pass", f"fabric check passed ({floor}), within "
                       f"{cfg.baseline_tolerance:.0%} of the baseline", shown, kept)
    head = (f"fabric check: worse than the cluster's baseline (recorded {old.get('recorded')}) "
            f"by more than {cfg.baseline_tolerance:.0%} (fabricCheck.baselineTolerance):")
    if cfg.on_degraded == "refuse":
        return Verdict("refuse", "\n".join([head, *worse, "Nothing started "
                                            "(fabricCheck.onDegraded: refuse)."]), shown, kept)
    return Verdict("warn", "\n".join([head, *worse]), shown, kept)
