"""Model staging throughput against a plain `rsync` of the same directory between the same two
lab nodes, side by side in one run (interleaved, the order alternating per run).

- spark-vllm: node-2's copy is wiped, then `pulumi up --refresh` (its refresh sees the copy gone
  and re-runs only the copy command). Timed: the copy command's step as the engine reports it
  (its --json events, stamped on arrival): SSH session, manifest, free-space check, rsync over
  the fabric, the check of node-2's copy against the manifest.
- rsync: on node-1, `rsync -a` of the model's repo dir in the HF cache to node-2's fabric IP over
  SSH, the same key and cipher defaults, into a scratch dir wiped first, on the same filesystem
  as the staged copy (node-2's hfCache). Timed on node-1 around the rsync alone.
Both move the same bytes (the blobs; the snapshot's symlinks and refs are a few hundred bytes).
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
from typing import Any

from bench import profile
from bench.common import STACK, Lab, say, ssh, ssh_with_lab_key
from bench.contenders.spark_vllm import SparkVllm
from lab import keys
from lab.config import LAB_MODEL

HF = "/root/.cache/huggingface"
REPO_DIR = f"{HF}/hub/models--{LAB_MODEL.replace('/', '--')}"
COPY = "model-copy-node-2"
# on the same filesystem as the staged copy (the node's hfCache volume; its root fs is overlay)
PLAIN_DST = f"{HF}/bench-plain-rsync"


def _bytes(lab: Lab) -> int:
    res = ssh(lab.head, f"du -sbL {REPO_DIR}/blobs | cut -f1")
    return int(res.out.strip())


def _spark_vllm(c: SparkVllm, lab: Lab) -> tuple[float | None, str]:
    ssh(lab.nodes[1], f"rm -rf {HF}/hub {HF}/spark-vllm")
    res, lines = profile.run_stamped(
        ["pulumi", "up", "--yes", "--skip-preview", "--json", "--refresh", "--stack", STACK],
        timeout=900, env=c.env, log=c.log)
    steps = profile.summarize(lines, res.seconds)["steps"]
    step = next((s for k, s in steps.items() if k.endswith(f" {COPY}") and "create" in k), None)
    if not res.ok or step is None:
        return None, res.tail() if not res.ok else f"no copy step in {sorted(steps)}"
    return step["s"], ""


def _plain(lab: Lab) -> tuple[float | None, str]:
    dst = lab.nodes[1]
    ssh(dst, f"rm -rf {PLAIN_DST}")
    script = "\n".join([
        "t0=$(date +%s.%N)",
        f'rsync -a -e "$RSH" {REPO_DIR}/ root@{dst.fabric_ip}:{PLAIN_DST}/',
        "t1=$(date +%s.%N)",
        'echo "$t0 $t1" | awk \'{printf "%.3f\\n", $2 - $1}\'',
    ])
    res = ssh_with_lab_key(lab.head, script, timeout=900)
    ssh(dst, f"rm -rf {PLAIN_DST}")
    if not res.ok:
        return None, res.tail()
    return float(res.out.strip().splitlines()[-1]), ""


def _staging_mode(c: SparkVllm, mode: str) -> None:
    c.set_config("modelStaging", mode)


def noop_runs(c: SparkVllm, runs: int) -> list[dict[str, Any]]:
    """A no-op `pulumi up` with modelStaging download against none, interleaved: what the
    staging's resources (image check, stage, copy, their refresh-time companions) cost a
    re-apply that changes nothing. Each mode is converged (untimed) before its timed no-op."""
    records = []
    for r in range(1, runs + 1):
        for mode in (("download", "none") if r % 2 else ("none", "download")):
            _staging_mode(c, mode)
            if not c.up().ok:
                raise RuntimeError(f"staging bench: the stack does not converge with {mode}")
            out = c.reapply()
            seconds = out.profile.get("total_s") if out.ok else None
            say(f"  2 nodes  run {r}  modelStaging {mode:8} no-op  "
                + (f"{seconds:6.2f} s" if seconds else f"FAILED: {out.note[-160:]}"))
            records.append({"nodes": 2, "contender": f"noop-{mode}", "scenario": "staging-noop",
                            "run": r, "seconds": seconds, "ok": out.ok, "note": out.note[-600:]})
    _staging_mode(c, "download")
    return records


def run_all(c: SparkVllm, lab: Lab, runs: int) -> list[dict[str, Any]]:
    """`runs` of each, interleaved, then the no-op comparison."""
    _staging_mode(c, "download")
    if not c.up().ok:
        raise RuntimeError("staging bench: the stack does not come up")
    size = _bytes(lab)
    records = []
    for r in range(1, runs + 1):
        order = ("spark-vllm", "rsync") if r % 2 else ("rsync", "spark-vllm")
        for who in order:
            seconds, note = _spark_vllm(c, lab) if who == "spark-vllm" else _plain(lab)
            rate = size / seconds / 1e6 if seconds else None
            say(f"  2 nodes  run {r}  {who:10} staging      "
                + (f"{seconds:6.2f} s  {rate:6.1f} MB/s" if seconds else f"FAILED: {note[-160:]}"))
            records.append({"nodes": 2, "contender": who, "scenario": "staging", "run": r,
                            "seconds": seconds, "bytes": size, "ok": seconds is not None,
                            "note": note[-600:]})
    return records + noop_runs(c, runs)


def table(records: list[dict[str, Any]]) -> list[str]:
    """The report's staging section: medians and the ratio, from one run."""
    noop = {mode: [r["seconds"] for r in records if r["contender"] == f"noop-{mode}" and r["ok"]]
            for mode in ("download", "none")}
    records = [r for r in records if r["scenario"] == "staging"]
    if not records:
        return []
    rate = {who: [r["bytes"] / r["seconds"] / 1e6 for r in records
                  if r["contender"] == who and r["ok"]] for who in ("spark-vllm", "rsync")}
    med = {who: statistics.median(v) if v else None for who, v in rate.items()}
    size = records[0]["bytes"]
    out = ["## Model staging: copy throughput", "",
           f"{size / 1e9:.2f} GB (the lab's generated model) from node-1 to node-2 over the "
           "fabric network, node-2 wiped before each run; runs interleaved. spark-vllm: the copy "
           "command's step in `pulumi up --refresh` (SSH, manifest, free-space check, rsync, the "
           "check of the copy). rsync: `rsync -a` of the same directory, timed on node-1.", "",
           "| contender | runs ok | median MB/s | range MB/s |", "|---|---|---|---|"]
    for who, v in rate.items():
        rng = f"{min(v):.0f}–{max(v):.0f}" if v else "–"
        shown = f"{med[who]:.0f}" if med[who] is not None else "–"
        out.append(f"| {who} | {len(v)} | {shown} | {rng} |")
    if med["spark-vllm"] and med["rsync"]:
        out += ["", f"Staging / plain rsync: **{med['spark-vllm'] / med['rsync']:.2f} ×** "
                "(target ≥ 0.9 ×)."]
    if noop["download"] and noop["none"]:
        d, n = statistics.median(noop["download"]), statistics.median(noop["none"])
        out += ["", f"No-op `pulumi up` with staging on (`modelStaging: download`): {d:.2f} s "
                f"({min(noop['download']):.2f}–{max(noop['download']):.2f}), against {n:.2f} s "
                f"with `none`, same run, interleaved: **{d / n:.2f} ×** (nothing is read or "
                "hashed; the staging adds resources the engine diffs)."]
    return out + [""]


# --- the weight copy against the fabric: N streams, one stream, raw TCP ------------------

RAW_PORT = 29611
# node-2's end of the raw TCP reference: accept N connections, read and discard everything
RAW_RECV = r"""
import socket, sys, threading
n = int(sys.argv[2])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], PORT)); srv.listen(n); print("ready", flush=True)
total = [0]
out = sys.argv[3] if len(sys.argv) > 3 else ""
def drain(c, i):
    buf = bytearray(4 << 20)
    mv = memoryview(buf)
    f = open(f"{out}/s{i}", "wb") if out else None
    while k := c.recv_into(buf):
        total[0] += k
        if f:
            f.write(mv[:k])
    if f:
        f.close()
ts = [threading.Thread(target=drain, args=(srv.accept()[0], i)) for i in range(n)]
[t.start() for t in ts]; [t.join() for t in ts]
print(total[0], flush=True)
""".replace("PORT", str(RAW_PORT))
# node-1's end: the model's blobs, largest first onto the least-loaded of N connections,
# each sent with sendfile from the page cache (as the copy's tcp transport sends them)
RAW_SEND = r"""
import os, socket, sys, threading, time
host, n, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = sorted((os.path.join(d, f) for f in os.listdir(d)), key=os.path.getsize, reverse=True)
bins = [[] for _ in range(n)]; load = [0] * n
for f in files:
    i = load.index(min(load)); bins[i].append(f); load[i] += os.path.getsize(f)
def send(batch):
    with socket.create_connection((host, PORT)) as c:
        for f in batch:
            with open(f, "rb") as fh:
                c.sendfile(fh)
for f in files:  # warm: the copy reads from the page cache too (node-1 just hashed them)
    with open(f, "rb") as fh:
        while fh.read(8 << 20):
            pass
t0 = time.monotonic()
ts = [threading.Thread(target=send, args=(b,)) for b in bins if b]
[t.start() for t in ts]; [t.join() for t in ts]
print(f"{time.monotonic() - t0:.3f}")
""".replace("PORT", str(RAW_PORT))


def _raw_tcp(lab: Lab, streams: int, to_files: bool = False) -> tuple[float | None, str]:
    """Raw TCP between the same nodes: read and discarded, or written to files on node-2's
    hfCache filesystem (what any copy must do there)."""
    src, dst = lab.nodes
    scratch = f"{HF}/bench-raw-tcp"
    ssh(dst, f"rm -rf {scratch}" + (f" && mkdir -p {scratch}" if to_files else ""))
    recv = subprocess.Popen(keys.ssh_argv(dst.mgmt_ip, f"python3 -c {shlex.quote(RAW_RECV)} "
                                                       f"{dst.fabric_ip} {streams}"
                                                       + (f" {scratch}" if to_files else "")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert recv.stdout is not None
    if recv.stdout.readline().strip() != "ready":
        recv.kill()
        return None, "the raw receiver did not start"
    res = ssh(src, f"python3 -c {shlex.quote(RAW_SEND)} {dst.fabric_ip} {streams} "
                   f"{REPO_DIR}/blobs", timeout=600)
    out, err = recv.communicate(timeout=120)
    ssh(dst, f"rm -rf {scratch}")
    if not res.ok:
        return None, res.tail()
    return float(res.out.strip().splitlines()[-1]), ""


def _copy_config(c: SparkVllm, transport: str, streams: str) -> None:
    for key, value in (("copyTransport", transport), ("copyStreams", streams)):
        c.set_config(key, value)


def copy_record(c: SparkVllm, name: str = COPY) -> dict[str, Any] | None:
    """A copy command's own account, the JSON line it printed (in the state): its seconds and
    the bytes that crossed the link (the weight copy's and the image copy's alike)."""
    res = c._pulumi("stack", "export", "--stack", STACK)
    if not res.ok:
        return None
    for r in json.loads(res.out)["deployment"].get("resources", []):
        if r.get("urn", "").endswith(f"::{name}"):
            out = (r.get("outputs") or {}).get("stdout", "").strip()
            return json.loads(out.splitlines()[-1]) if out else None
    return None


COPY_CONTENDERS = {  # name -> (copyTransport, copyStreams), or a reference
    "spark-vllm tcp auto": ("tcp", "auto"),
    "spark-vllm ssh auto": ("ssh", "auto"),
    "spark-vllm ssh 1": ("ssh", "1"),
    "rsync 1 stream": None,
    "raw TCP 1": None,
    "raw TCP 2": None,
    "raw TCP 2 into files": None,
}


def copy_runs(c: SparkVllm, lab: Lab, runs: int) -> list[dict[str, Any]]:
    """The copy to node-2 (wiped first) over each transport, a plain rsync, and raw TCP moving
    the same blobs between the same nodes; interleaved, the order rotating per run."""
    _staging_mode(c, "download")
    if not c.up().ok:
        raise RuntimeError("copy bench: the stack does not come up")
    size = _bytes(lab)
    names = list(COPY_CONTENDERS)
    records = []
    for r in range(1, runs + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        for who in order:
            step = None
            if who.startswith("raw TCP"):
                seconds, note = _raw_tcp(lab, int(who.split()[2]), who.endswith("files"))
            elif who == "rsync 1 stream":
                seconds, note = _plain(lab)
            else:
                transport, streams = COPY_CONTENDERS[who]  # type: ignore[misc]
                _copy_config(c, transport, streams)
                step, note = _spark_vllm(c, lab)
                copy = copy_record(c) if step is not None else None
                seconds = float(copy["seconds"]) if copy else None
            rate = size / seconds / 1e6 if seconds else None
            say(f"  2 nodes  run {r}  {who:20} copy  "
                + (f"{seconds:6.2f} s  {rate:7.1f} MB/s" if seconds else f"FAILED: {note[-160:]}"))
            records.append({"nodes": 2, "contender": who, "scenario": "copy", "run": r,
                            "seconds": seconds, "step_s": step, "bytes": size,
                            "ok": seconds is not None, "note": note[-600:]})
    _copy_config(c, "ssh", "auto")
    return records


def copy_table(records: list[dict[str, Any]], cpus: int | None = None) -> list[str]:
    records = [r for r in records if r["scenario"] == "copy"]
    if not records:
        return []
    rate = {who: [r["bytes"] / r["seconds"] / 1e6 for r in records
                  if r["contender"] == who and r["ok"]] for who in COPY_CONTENDERS}
    med = {who: statistics.median(v) if v else None for who, v in rate.items()}
    steps = {who: [r["step_s"] for r in records if r["contender"] == who and r.get("step_s")]
             for who in COPY_CONTENDERS}
    size = records[0]["bytes"]
    out = ["## Model copy against the fabric", "",
           f"{size / 1e9:.2f} GB (the lab's model's blobs) from node-1 to node-2 over the lab "
           "fabric, node-2 wiped before each spark-vllm run, runs interleaved. spark-vllm: the "
           "copy's own seconds (the transfer and node-2's check against the manifest; the "
           "step's total in pulumi, with its SSH sessions, in the last column). rsync: one "
           "`rsync -a` over SSH. raw TCP: the same blobs sent with sendfile over N sockets to a "
           "reader on node-2 that discards them (no disk, no hashing, no encryption), or "
           "writes them to files on node-2's hfCache filesystem.", "",
           "| contender | runs ok | median MB/s | range MB/s | step s (median) |",
           "|---|---|---|---|---|"]
    for who, v in rate.items():
        rng = f"{min(v):.0f}–{max(v):.0f}" if v else "–"
        shown = f"{med[who]:.0f}" if med[who] is not None else "–"
        st = f"{statistics.median(steps[who]):.2f}" if steps[who] else "–"
        out.append(f"| {who} | {len(v)} | {shown} | {rng} | {st} |")
    raw = max((m for w, m in med.items() if w in ("raw TCP 1", "raw TCP 2") and m), default=None)
    files = med.get("raw TCP 2 into files")
    one = med.get("rsync 1 stream")
    tcp, ssh_n = med.get("spark-vllm tcp auto"), med.get("spark-vllm ssh auto")
    out.append("")
    if tcp and raw:
        out.append(f"spark-vllm tcp / raw TCP (the better of 1 and 2 sockets): "
                   f"**{tcp / raw:.2f} ×** (target ≥ 0.8 ×).")
    if tcp and files:
        out.append(f"spark-vllm tcp / raw TCP into files on node-2's disk: **{tcp / files:.2f} ×** "
                   "(what the node's disk leaves: every copy writes there).")
    if tcp and one:
        out.append(f"spark-vllm tcp / one rsync stream: **{tcp / one:.2f} ×** (target ≥ 2 × "
                   "where the cores allow).")
    if ssh_n and one:
        out.append(f"spark-vllm ssh (auto streams) / one rsync stream: **{ssh_n / one:.2f} ×**.")
    return out + [""]
