"""spark-vllm's fabric check: a short torch.distributed run across the nodes, before any rank.

Run once per node, in the serving image with exactly the env the ranks get (stdlib and torch
only; the program sends it on stdin: `python3 - ARGS`):

  --rank R --world-size N --master-addr IP --master-port P --backend gloo|nccl
  [--node NAME] [--bandwidth-bytes B] [--deadline S] [--keep-logs DIR]

The nodes form one group over rank 0's identity IP (torch's TCP rendezvous, bounded). For each
pair of nodes it measures the all-reduce latency of 8 KiB and 64 KiB messages (what tensor
parallel decode issues; the median of several iterations after a warm-up) and the all-reduce
bus bandwidth at a bounded size (64 MiB by default, never more than 256 MiB: the 16 GB
nccl-tests message froze a DGX Spark, github.com/NVIDIA/dgx-spark-playbooks issue 102). Bus
bandwidth is nccl-tests' busbw: algbw × 2(n-1)/n for an all-reduce of n ranks, algbw = bytes /
time, GB = 10^9 bytes (github.com/NVIDIA/nccl-tests doc/PERFORMANCE.md). Each figure is the
slower of the pair's two ranks. It reads which transport NCCL chose from its own INFO lines
(`via NET/IB…`, `…/GDRDMA`, `via NET/Socket…`, `NET/IB : Using [0]HCA:1/RoCE`); gloo reports
`gloo/tcp`. Each rank reports its GPU (name, UUID); a pair whose two ranks ran on one GPU says
so (`sharedGpu`): its figures are the GPU's time slicing between two processes, not a fabric.

`--world-size 1` (NCCL only) is a self-test of this node's GPU and NCCL, never a fabric check:
one rank initialises NCCL, times the same all-reduces on its own ("ranks": [0]: NCCL's launch
and completion, no data crosses anything; bus bandwidth is 0 by nccl-tests' formula, 2(n-1)/n),
and reports NCCL's version, the network it loaded (`ncclNetwork`) and the transport `none`
(NCCL connected no peer). `ncclNodes` is how many hosts NCCL counted. Two ranks on one GPU are
refused by NCCL ("Duplicate GPU detected", NCCL 2.28): said as such (`"cause": "duplicate-gpu"`).
`--keep-logs DIR` copies torch's and NCCL's logs there before the temporary directory goes (a
recording aid; the program never passes it).

Prints exactly one JSON line on stdout (rank 0: every pair's figures; other ranks: their own
report) and exits:
  0 measured (`"status": "ok"`)
  1 a phase failed (`"status": "error"`, the phase and why: `interface`, `init` (the
    rendezvous), `latency`, `bandwidth`, `report`)
  2 bad arguments (`"status": "error"`, phase `arguments`)
  3 the deadline passed (`"status": "error"`, `"timedOut": true`, the phase it was in)
  4 it could not run here (`"status": "unavailable"` and why: no torch, no CUDA for nccl …)
The whole run is bounded by --deadline (seconds): the measuring runs in a child process that is
killed (with everything it started) when the deadline passes, whatever it is blocked in. What
torch and NCCL print goes to a temporary directory, removed at the end; its last lines come
with an error. (No `from __future__` import: the script is sent as is, on stdin.)
"""
import argparse
import contextlib
import datetime
import fcntl
import glob
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4
LATENCY_BYTES = (8192, 65536)
DEFAULT_BANDWIDTH_BYTES = 64 * 2**20
MAX_BANDWIDTH_BYTES = 256 * 2**20  # never the multi-GB messages that froze a Spark
DEFAULT_DEADLINE_S = 90
LATENCY_WARMUP, LATENCY_ITERS = 5, 20
BANDWIDTH_WARMUP, BANDWIDTH_ITERS = 1, 5
LOG_TAIL = 15
# the env the check reports back (the fabric settings the ranks get); never secrets
FABRIC_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "TP_SOCKET_IFNAME",
              "UCX_NET_DEVICES", "VLLM_HOST_IP", "NCCL_IB_DISABLE", "NCCL_NET")
PHASES = {
    "start": "starting",
    "interface": "checking the fabric interface",
    "import": "importing torch",
    "init": "forming the group (the rendezvous with rank 0)",
    "latency": "measuring all-reduce latency",
    "bandwidth": "measuring all-reduce bus bandwidth",
    "report": "gathering the ranks' reports",
}
SIOCGIFMTU = 0x8921


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one JSON line, never argparse's usage text alone
        raise UsageError(message)


def parse(argv):
    p = Parser(prog="fabric_check.py", add_help=False)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    p.add_argument("--node", default=socket.gethostname())
    p.add_argument("--bandwidth-bytes", type=int, default=DEFAULT_BANDWIDTH_BYTES)
    p.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S)
    p.add_argument("--keep-logs", default=None)
    a = p.parse_args(argv)
    least = 1 if a.backend == "nccl" else 2
    if a.world_size < least or not 0 <= a.rank < a.world_size:
        raise UsageError(f"--rank {a.rank} --world-size {a.world_size}: at least two ranks (one "
                         "only with --backend nccl: a self-test of the node's GPU), 0 <= rank < "
                         "world size")
    if not 4096 <= a.bandwidth_bytes <= MAX_BANDWIDTH_BYTES or a.bandwidth_bytes % 4:
        raise UsageError(f"--bandwidth-bytes {a.bandwidth_bytes}: a multiple of 4 from 4096 to "
                    f"{MAX_BANDWIDTH_BYTES} (256 MiB)")
    if not 1 <= a.deadline <= 3600:
        raise UsageError(f"--deadline {a.deadline}: 1-3600 s")
    if not 1 <= a.master_port <= 65535:
        raise UsageError(f"--master-port {a.master_port}: 1-65535")
    return a


# --- the child: measures, and tells the parent each phase on a pipe ---------------------------

def interfaces():
    return sorted(name for _, name in socket.if_nameindex())


def mtu(name):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16si20x", name.encode()[:15], 0)  # struct ifreq: name, ifr_mtu
        return struct.unpack("16si20x", fcntl.ioctl(s.fileno(), SIOCGIFMTU, req))[1]


def named_interfaces():
    """(env var, interface) for every exact name the socket-ifname settings give: NCCL's
    `^` (exclude) and `=` (exact) forms and prefixes are left to NCCL and gloo."""
    out = []
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        for name in filter(None, os.environ.get(key, "").split(",")):
            if not name.startswith("^"):
                out.append((key, name.lstrip("=")))
    return out


def check_interfaces():
    """Every interface the env names exists on this node (its network namespace); its MTU."""
    present, found = interfaces(), {}
    for key, name in named_interfaces():
        if name not in present:
            if key == "NCCL_SOCKET_IFNAME" and name not in [n for k, n in named_interfaces()
                                                            if k == "GLOO_SOCKET_IFNAME"]:
                continue  # NCCL also reads a prefix: leave it to NCCL
            raise RuntimeError(f"{key}={os.environ[key]}: no interface {name!r} on this node "
                               f"(it has {', '.join(present)})")
        found[name] = mtu(name)
    return found


def nccl_lines(tmp):
    """What NCCL wrote (NCCL_DEBUG_FILE, unbuffered), every process's file."""
    text = ""
    for path in sorted(glob.glob(os.path.join(tmp, "nccl.*.log"))):
        with open(path, errors="replace") as f:
            text += f.read()
    return text


def nccl_transport(tmp, world_size=None):
    """What NCCL chose, from its INFO lines. A communicator of one rank connects no peer: its
    transport is `none`, whatever network NCCL loaded (`ncclNetwork`)."""
    text = nccl_lines(tmp)
    via = re.findall(r"\bvia (\S+)", text)
    network = re.findall(r"Using network (\w+)", text)
    # `ncclCommInitRankConfig comm 0x… rank 0 nranks N … - Init START` and `comm 0x… rank 0
    # nRanks N nNodes H localRanks L …`: the hosts NCCL counted (github.com/NVIDIA/nccl
    # src/init.cc at v2.28.9-1)
    nranks = {int(n) for n in re.findall(r"\bnranks (\d+)\b", text)}
    nodes = [int(n) for n in re.findall(r"\bnNodes (\d+)\b", text)]
    hcas = []
    for m in re.finditer(r"NET/IB : Using ((?:\[\d+\]\S+ ?)+)", text):
        hcas += [h.split("/")[0] for h in re.findall(r"\[\d+\](\S+)", m.group(1))]
    sockets = []
    for m in re.finditer(r"NET/Socket : Using ((?:\[\d+\]\S+ ?)+)", text):
        sockets += re.findall(r"\[\d+\]([^:\s]+)", m.group(1))
    net = [v for v in via if v.startswith("NET/")]
    if any(v.startswith("NET/IB") for v in net):
        transport = "NET/IB"
    elif any(v.startswith("NET/Socket") for v in net):
        transport = "NET/Socket"
    elif net:
        transport = net[0].split("/")[0] + "/" + net[0].split("/")[1]
    elif via:
        transport = via[0].split("/")[0]  # P2P, SHM: ranks on one host
    elif nranks == {1} or (world_size == 1 and not nranks):
        transport = "none"  # one rank: no peer, no inter-node transport used
    else:
        transport = f"NET/{network[0]}" if network else "unknown"
    return {"transport": transport, "gdr": any("GDRDMA" in v for v in via),
            "hcas": sorted(set(hcas)), "socketInterfaces": sorted(set(sockets)),
            "ncclNetwork": network[0] if network else None,
            "ncclNodes": max(nodes) if nodes else None,
            "ncclVersion": (re.findall(r"NCCL version (\S+)", text) or [None])[0]}


# NCCL's refusals of two ranks on one GPU: 2.28 (init.cc), and 2.30's wording
SAME_GPU = re.compile(r"(Duplicate GPU detected[^\n]*|Multiple Ranks are using the same GPU[^\n]*)")


def same_gpu(text):
    """NCCL's own line when it refused two ranks on one GPU, else None."""
    m = SAME_GPU.search(text)
    return m.group(1).strip() if m else None


def gpu_of(torch):
    props = torch.cuda.get_device_properties(0)
    uuid = getattr(props, "uuid", None)
    return {"name": props.name, "uuid": str(uuid) if uuid is not None else None}


def child(args, send, tmp, deadline):
    send({"phase": "interface"})
    mtus = check_interfaces()
    send({"phase": "import"})
    os.environ["NCCL_DEBUG"] = "INFO"  # the transport is read from NCCL's own lines
    os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(tmp, "nccl.%p.log")
    try:
        import torch
        import torch.distributed as dist
    except Exception as err:  # noqa: BLE001 - any import failure means the same here
        return {"status": "unavailable",
                "reason": f"torch is not importable with {sys.executable}: {err}"}
    if not dist.is_available():
        return {"status": "unavailable", "reason": f"torch {torch.__version__} was built "
                "without torch.distributed"}
    if args.backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        return {"status": "unavailable", "reason": f"backend nccl: torch {torch.__version__} "
                f"sees no CUDA device (cuda available: {torch.cuda.is_available()}, nccl: "
                f"{dist.is_nccl_available()})"}
    if args.backend == "gloo" and not dist.is_gloo_available():
        return {"status": "unavailable", "reason": f"torch {torch.__version__} has no gloo"}

    send({"phase": "init"})
    device = None
    if args.backend == "nccl":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    host = f"[{args.master_addr}]" if ":" in args.master_addr else args.master_addr
    # torch's own bound first (its message names what it waited for), the deadline after it
    left = max(1.0, (deadline - time.monotonic()) * 0.8 - 1)
    dist.init_process_group(args.backend, init_method=f"tcp://{host}:{args.master_port}",
                            rank=args.rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=left))
    # one collective while still in `init`: NCCL creates its communicator (and connects) on
    # the first one, so a hang there is named as the rendezvous, not as a measurement
    try:
        dist.all_reduce(torch.zeros(1, device=device))
    except Exception as err:
        line = same_gpu(str(err)) or same_gpu(nccl_lines(tmp))  # torch's "Last error", or NCCL's
        if line is None:
            raise
        return {"status": "error", "phase": "init", "cause": "duplicate-gpu",
                "error": f"NCCL refused two ranks on one GPU ({line}): every node's rank needs "
                         "a GPU of its own; two of the stack's nodes are one machine, or share "
                         "its GPU"}

    def sync():
        if device is not None:
            torch.cuda.synchronize(device)

    def median_s(tensor, group, warmup, iters):
        for _ in range(warmup):
            dist.all_reduce(tensor, group=group)
        sync()
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    def slowest(values, group):
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.tolist()

    n = args.world_size
    # every pair; a world of one (the NCCL self-test) measures its one rank alone
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)] or [(0,)]
    measured = []
    for members in pairs:
        group = None if n <= 2 else dist.new_group(list(members))
        if args.rank in members:
            send({"phase": "latency"})
            lat = [median_s(torch.zeros(size // 4, dtype=torch.float32, device=device), group,
                            LATENCY_WARMUP, LATENCY_ITERS) for size in LATENCY_BYTES]
            send({"phase": "bandwidth"})
            big = torch.ones(args.bandwidth_bytes // 4, dtype=torch.float32, device=device)
            bw_s = median_s(big, group, BANDWIDTH_WARMUP, BANDWIDTH_ITERS)
            del big
            lat8, lat64, bw_s = slowest([*lat, bw_s], group)
            # nccl-tests: busbw = algbw * 2(k-1)/k for an all-reduce of k ranks (here a pair;
            # 0 for the self-test's one rank), algbw = bytes / time
            k = len(members)
            algbw = args.bandwidth_bytes / bw_s / 1e9
            measured.append({"ranks": list(members), "latency8kUs": round(lat8 * 1e6, 1),
                             "latency64kUs": round(lat64 * 1e6, 1),
                             "busBandwidthGBs": round(algbw * 2 * (k - 1) / k, 3),
                             "algBandwidthGBs": round(algbw, 3),
                             "bandwidthBytes": args.bandwidth_bytes,
                             "bandwidthSeconds": round(bw_s, 6)})
        if n > 2:
            dist.barrier()

    send({"phase": "report"})
    me = {"rank": args.rank, "node": args.node, "host": socket.gethostname(),
          "env": {k: os.environ[k] for k in FABRIC_ENV if k in os.environ},
          "mtu": mtus, "torch": torch.__version__}
    if args.backend == "nccl":
        me.update(nccl_transport(tmp, n), gpu=gpu_of(torch))
    else:
        me.update({"transport": "gloo/tcp", "gdr": False, "hcas": [], "socketInterfaces": []})
    ranks = [None] * n
    dist.all_gather_object(ranks, {**me, "pairs": measured})
    dist.destroy_process_group()
    figures = {tuple(m["ranks"]): m for r in ranks for m in r.pop("pairs")}
    out = {"status": "ok", "rank": args.rank, "node": args.node, "worldSize": n,
           "backend": args.backend, "ranks": ranks}
    if n == 1:
        out["selfTest"] = True  # no fabric: this node's GPU and NCCL alone
    if args.rank == 0:  # every pair's figures, with its nodes and their transports
        out["pairs"] = [{**figures[m], "nodes": [ranks[i]["node"] for i in m],
                         "transport": "+".join(sorted({ranks[i]["transport"] for i in m})),
                         **shared(ranks, m)}
                        for m in pairs]
    else:
        out["pairs"] = measured
    return out


def shared(ranks, members):
    """`sharedGpu` where a pair's ranks ran on one GPU (one host, one GPU UUID): NCCL refuses
    that unless the ranks claim different hosts (NCCL_HOSTID); the figures then measure the
    GPU's time slicing between two processes, not a fabric."""
    if len(members) < 2:
        return {}
    gpus = {(ranks[i].get("host"), (ranks[i].get("gpu") or {}).get("uuid")) for i in members}
    return {"sharedGpu": True} if len(gpus) == 1 and None not in next(iter(gpus)) else {}


# --- the parent: the deadline, the one JSON line ----------------------------------------------

def emit(obj, code):
    sys.stdout.write(json.dumps({"check": "fabric", **obj}, sort_keys=True) + "\n")
    sys.stdout.flush()
    return code


def tail(tmp):
    lines = []
    for path in sorted(glob.glob(os.path.join(tmp, "*.log"))):
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            lines += [ln.rstrip() for ln in f if ln.strip()]
    keep = [ln for ln in lines if "NCCL INFO" not in ln
            and not re.match(r"(frame #\d+:|<omitting python frames>)", ln)]
    return keep[-LOG_TAIL:]


def run_child(args, w, tmp, deadline):
    """In the child: stdout and stderr (torch's, gloo's, NCCL's C prints) into a log file."""
    with contextlib.suppress(Exception):  # die with the parent, whatever kills it
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    fd = os.open(os.path.join(tmp, "child.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)

    phase = ["start"]

    def send(obj):
        phase[0] = obj.get("phase", phase[0])
        os.write(w, (json.dumps(obj) + "\n").encode())

    try:
        result = child(args, send, tmp, deadline)
    except BaseException as err:  # noqa: BLE001 - reported, with its phase, by the parent
        result = {"status": "error", "error": f"{type(err).__name__}: {err}".strip(),
                  "phase": phase[0]}
    send({"result": result})
    return 0


def main(argv):
    try:
        args = parse(argv)
    except UsageError as err:
        return emit({"status": "error", "phase": "arguments", "error": str(err)}, EXIT_USAGE)
    start = time.monotonic()
    deadline = start + args.deadline
    who = {"rank": args.rank, "node": args.node, "backend": args.backend}
    tmp = tempfile.mkdtemp(prefix="spark-vllm-fabric-")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        os.setpgid(0, 0)  # its own group: killed whole at the deadline
        code = 1
        try:
            code = run_child(args, w, tmp, deadline)
        finally:
            os._exit(code)
    os.close(w)

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    phase, result, buf = "start", None, b""
    try:
        while result is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 65536)
            if not chunk:
                break  # the child ended
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                phase = msg.get("phase", phase)
                result = msg.get("result", result)
    except SystemExit:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        shutil.rmtree(tmp, ignore_errors=True)
        return emit({**who, "status": "error", "phase": phase, "error": "terminated (SIGTERM) "
                     f"while {PHASES[phase]}"}, EXIT_FAILED)
    seconds = round(time.monotonic() - start, 2)
    timed_out = result is None and time.monotonic() >= deadline
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # done or not: nothing it started outlives the check
    _, status = os.waitpid(pid, 0)
    logs = tail(tmp)
    if args.keep_logs:  # a recording aid: torch's and NCCL's own lines, as they were
        with contextlib.suppress(OSError):
            os.makedirs(args.keep_logs, exist_ok=True)
            for path in glob.glob(os.path.join(tmp, "*.log")):
                shutil.copy(path, os.path.join(args.keep_logs, os.path.basename(path)))
    shutil.rmtree(tmp, ignore_errors=True)
    if timed_out:
        return emit({**who, "status": "error", "phase": phase, "timedOut": True,
                     "seconds": seconds, "log": logs,
                     "error": f"no result within the check's deadline of {args.deadline:g} s: "
                              f"it was {PHASES[phase]}" + (
                                  f" at {args.master_addr}:{args.master_port}"
                                  if phase == "init" else "")}, EXIT_TIMEOUT)
    if result is None:
        how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit {os.WEXITSTATUS(status)}")
        return emit({**who, "status": "error", "phase": phase, "seconds": seconds, "log": logs,
                     "error": f"the measuring process ended ({how}) while {PHASES[phase]}"},
                    EXIT_FAILED)
    if result["status"] == "unavailable":
        return emit({**who, **result, "seconds": seconds}, EXIT_UNAVAILABLE)
    if result["status"] == "error":
        result["error"] = f"{PHASES[result['phase']]}: {result['error']}"
        return emit({**who, **result, "seconds": seconds, "log": logs}, EXIT_FAILED)
    return emit({**who, **result, "seconds": seconds}, EXIT_OK)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
