"""The image copy (imageStaging: copy) against a plain `docker save | ssh docker load` pipe and
raw TCP between the same two lab nodes, side by side in one run (interleaved, the order
rotating per run); the layer-sharing case's bytes; a no-op `up`'s time with imageStaging copy
against pull.

- spark-vllm ssh / tcp: node-2 without any image of the simulator (and its layers), then a cold
  `pulumi up` with imageStaging copy and that copyTransport. Timed: the copy's own account (its
  JSON line: docker save on the head streamed into node-2's docker load, the id check).
- plain pipe: on node-1, `docker save IMAGE | ssh root@<node-2 fabric> docker load`, the same
  key and cipher defaults, node-2 bare first. Timed on node-1 around the pipe.
- raw TCP: the image's save (a file on node-1, in the page cache) over one socket to node-2,
  discarded there (the link), or piped into node-2's `docker load` (the link and node-2's
  Docker: where the disk allows). Timed on node-2, from the connection to the last byte (into
  docker load: to the load's end).
Every contender moves the same image; bytes are the save's size.
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
from typing import Any

from bench.common import Lab, say, ssh, ssh_with_lab_key
from bench.contenders.spark_vllm import SparkVllm
from bench.staging import copy_record
from lab import config, keys

IMAGE = config.INNER_IMAGE
DERIVED = f"{IMAGE}-bench-extra"  # IMAGE and one more layer (8 MB): a new nightly
COPY = "image-copy-node-2"
SAVED = "/tmp/bench-image.tar"  # node-1: the image's save, for the raw TCP references
RAW_PORT = 29612
# node-2's end: one connection, discarded or piped into docker load; prints the bytes
RAW_RECV = r"""
import socket, subprocess, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], PORT)); srv.listen(1); print("ready", flush=True)
c = srv.accept()[0]
t0 = time.monotonic()
load = subprocess.Popen(["docker", "load", "-q"], stdin=subprocess.PIPE) if sys.argv[2] == "load" else None
buf = bytearray(4 << 20); mv = memoryview(buf); n = 0
while k := c.recv_into(buf):
    n += k
    if load:
        load.stdin.write(mv[:k])
if load:
    load.stdin.close()
    if load.wait():
        sys.exit("docker load failed")
print(n, f"{time.monotonic() - t0:.3f}", flush=True)
""".replace("PORT", str(RAW_PORT))
RAW_SEND = r"""
import socket, sys, time
with open(sys.argv[2], "rb") as f:
    while f.read(8 << 20):
        pass
t0 = time.monotonic()
with socket.create_connection((sys.argv[1], PORT)) as c, open(sys.argv[2], "rb") as f:
    c.sendfile(f)
print(f"{time.monotonic() - t0:.3f}")
""".replace("PORT", str(RAW_PORT))
CONTENDERS = ("spark-vllm ssh", "spark-vllm tcp", "docker save | ssh docker load",
              "raw TCP (discarded)", "raw TCP into docker load")


def _bare_node2(lab: Lab) -> None:
    ssh(lab.nodes[1], "ids=$(docker image ls -q --filter reference='spark-vllm-sim*' | sort -u); "
        "[ -z \"$ids\" ] || docker image rm -f $ids >/dev/null; docker image prune -f >/dev/null",
        timeout=120)


def _spark_vllm(c: SparkVllm, lab: Lab, transport: str) -> tuple[float | None, int, str]:
    c.down()
    _bare_node2(lab)
    c.set_config("copyTransport", transport)
    out = c.up()
    copy = copy_record(c, COPY) if out.ok else None
    if copy is None:
        return None, 0, out.note if not out.ok else "no copy in the state"
    return float(copy["seconds"]), int(copy["sent"]), ""


def _plain(lab: Lab) -> tuple[float | None, int, str]:
    _bare_node2(lab)
    dst = lab.nodes[1]
    script = "\n".join([
        "t0=$(date +%s.%N)",
        f"docker save {IMAGE} | $RSH root@{dst.fabric_ip} docker load -q >/dev/null",
        "t1=$(date +%s.%N)",
        'echo "$t0 $t1" | awk \'{printf "%.3f\\n", $2 - $1}\'',
    ])
    res = ssh_with_lab_key(lab.head, script, timeout=900)
    if not res.ok:
        return None, 0, res.tail()
    return float(res.out.strip().splitlines()[-1]), 0, ""


def _raw(lab: Lab, into_load: bool) -> tuple[float | None, int, str]:
    src, dst = lab.nodes
    if into_load:
        _bare_node2(lab)
    recv = subprocess.Popen(keys.ssh_argv(dst.mgmt_ip, f"python3 -c {shlex.quote(RAW_RECV)} "
                                                       f"{dst.fabric_ip} "
                                                       f"{'load' if into_load else 'discard'}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert recv.stdout is not None
    if recv.stdout.readline().strip() != "ready":
        recv.kill()
        return None, 0, "the raw receiver did not start"
    res = ssh(src, f"python3 -c {shlex.quote(RAW_SEND)} {dst.fabric_ip} {SAVED}", timeout=600)
    out, err = recv.communicate(timeout=600)
    if not res.ok or recv.returncode:
        return None, 0, res.tail() if not res.ok else err[-300:]
    # timed on node-2, from the connection to the last byte read (and, into docker load, to
    # the load's end: the sender is done long before)
    got, seconds = out.strip().splitlines()[-1].split()
    return float(seconds), int(got), ""


def copy_runs(c: SparkVllm, lab: Lab, runs: int) -> list[dict[str, Any]]:
    """Each contender moves the image to node-2; interleaved, the order rotating per run."""
    c.set_config("imageStaging", "copy")
    saved = ssh(lab.head, f"docker save {IMAGE} > {SAVED} && stat -c %s {SAVED}", timeout=300)
    if not saved.ok:
        raise RuntimeError(f"image bench: docker save: {saved.tail()}")
    size = int(saved.out.strip().splitlines()[-1])
    records = []
    try:
        for r in range(1, runs + 1):
            order = CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[:r % len(CONTENDERS)]
            for who in order:
                if who.startswith("spark-vllm"):
                    seconds, sent, note = _spark_vllm(c, lab, who.split()[1])
                elif who.startswith("raw"):
                    seconds, sent, note = _raw(lab, who.endswith("docker load"))
                else:
                    seconds, sent, note = _plain(lab)
                rate = size / seconds / 1e6 if seconds else None
                say(f"  2 nodes  run {r}  {who:30} image copy  "
                    + (f"{seconds:6.2f} s  {rate:7.1f} MB/s" if seconds else
                       f"FAILED: {note[-160:]}"))
                records.append({"nodes": 2, "contender": who, "scenario": "image-copy",
                                "run": r, "seconds": seconds, "bytes": size, "sent": sent,
                                "ok": seconds is not None, "note": note[-600:]})
    finally:
        ssh(lab.head, f"rm -f {SAVED}")
        c.set_config("copyTransport", "ssh")
    records.append(_layer_sharing(c, lab))
    records += _noop_runs(c, runs)
    c.set_config("imageStaging", "pull")
    return records


def _layer_sharing(c: SparkVllm, lab: Lab) -> dict[str, Any]:
    """A new image sharing all but one (8 MB) layer with the one node-2 holds: what moves."""
    c.up()  # node-2 holds IMAGE
    ssh(lab.head, f"docker rm -f extra >/dev/null 2>&1; docker run --name extra --entrypoint sh "
        f"{IMAGE} -c 'head -c 8000000 /dev/urandom > /extra' && docker commit extra {DERIVED} "
        ">/dev/null && docker rm extra >/dev/null", timeout=120)
    whole = int(ssh(lab.head, f"docker image inspect --format '{{{{.Size}}}}' {DERIVED}")
                .out.strip() or 0)
    try:
        c.set_config("image", DERIVED)
        out = c.up()
        copy = copy_record(c, COPY) if out.ok else None
    finally:
        c.set_config("image", IMAGE)
        c.up()
        for node in lab.nodes:
            ssh(node, f"docker image rm {DERIVED} >/dev/null 2>&1 || true")
    sent = int(copy["sent"]) if copy else None
    say(f"  2 nodes  layer-sharing image copy: {sent} bytes of {whole}")
    return {"nodes": 2, "contender": "spark-vllm ssh", "scenario": "image-layers", "run": 1,
            "seconds": float(copy["seconds"]) if copy else None, "bytes": whole, "sent": sent,
            "layers": copy.get("layers") if copy else None, "ok": copy is not None,
            "note": "" if copy else out.note[-600:]}


def _noop_runs(c: SparkVllm, runs: int) -> list[dict[str, Any]]:
    """A no-op `pulumi up` with imageStaging copy against pull, interleaved; each mode is
    converged (untimed) before its timed no-op."""
    records = []
    for r in range(1, runs + 1):
        for mode in (("copy", "pull") if r % 2 else ("pull", "copy")):
            c.set_config("imageStaging", mode)
            c.up()
            out = c.reapply()
            seconds = out.profile.get("total_s") if out.ok else None
            say(f"  2 nodes  run {r}  no-op up, imageStaging {mode:5}  "
                + (f"{seconds:6.2f} s" if seconds else f"FAILED: {out.note[-160:]}"))
            records.append({"nodes": 2, "contender": f"imageStaging {mode}",
                            "scenario": "image-noop", "run": r, "seconds": seconds,
                            "ok": seconds is not None, "note": out.note[-600:]})
    return records


def _median(records: list[dict[str, Any]], who: str, scenario: str) -> float | None:
    v = [r["seconds"] for r in records if r["contender"] == who and r["scenario"] == scenario
         and r["ok"]]
    return statistics.median(v) if v else None


def table(records: list[dict[str, Any]]) -> list[str]:
    copies = [r for r in records if r["scenario"] == "image-copy"]
    if not copies:
        return []
    size = copies[0]["bytes"]
    med = {who: _median(records, who, "image-copy") for who in CONTENDERS}
    out = ["## Image copy against the fabric", "",
           f"The lab image's save ({size / 1e6:.0f} MB) from node-1 to a node-2 without it, runs "
           "interleaved. spark-vllm: the copy's own seconds (docker save on the head streamed "
           "into node-2's docker load, the id check). plain: `docker save | ssh docker load`, "
           "timed on node-1. raw TCP: the save from node-1's page cache over one socket, "
           "discarded on node-2 or piped into its docker load, timed on node-2 to the last byte "
           "(to the load's end).", "",
           "| contender | median s | MB/s | runs |", "|---|---|---|---|"]
    for who in CONTENDERS:
        n = len([r for r in copies if r["contender"] == who and r["ok"]])
        s = med[who]
        out.append(f"| {who} | {s:.2f} | {size / s / 1e6:.0f} | {n} |" if s else
                   f"| {who} | failed | | 0 |")
    ours, plain = med["spark-vllm ssh"], med["docker save | ssh docker load"]
    raw, raw_load = med["raw TCP (discarded)"], med["raw TCP into docker load"]
    tcp = med["spark-vllm tcp"]
    if ours and plain:
        out += ["", f"- spark-vllm over SSH against the plain pipe: {plain / ours:.2f}× its "
                "throughput (target ≥ 1)"]
    if tcp and raw_load and raw:
        out.append(f"- spark-vllm over raw TCP against raw TCP into docker load: "
                   f"{raw_load / tcp:.2f}× (target ≥ 0.8 where the disk allows); against the "
                   f"bare link: {raw / tcp:.2f}×")
    layers = next((r for r in records if r["scenario"] == "image-layers"), None)
    if layers and layers["ok"]:
        out.append(f"- a new image sharing all but one 8 MB layer: {layers['sent'] / 1e6:.1f} MB "
                   f"moved of {layers['bytes'] / 1e6:.0f} MB "
                   f"({100 * layers['sent'] / layers['bytes']:.1f} %), {layers['layers']} layers")
    noop = {m: _median(records, f"imageStaging {m}", "image-noop") for m in ("copy", "pull")}
    if noop["copy"] and noop["pull"]:
        out.append(f"- a no-op `pulumi up`: {noop['copy']:.2f} s with imageStaging copy, "
                   f"{noop['pull']:.2f} s with pull (median)")
    return [*out, ""]
