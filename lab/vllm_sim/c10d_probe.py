"""torch.distributed's tcp:// rendezvous, observed on a GPU machine (not vLLM): the source of the
torch 2.11.0 lines, timings and line numbers vllm_sim/c10d.py reproduces (run 2026-12-01 on one
H200: `python3 lab/vllm_sim/c10d_probe.py OUTDIR`, each scenario's stderr in OUTDIR/<name>.log).

A  a client (rank 1), nothing listening, timeout 8 s, torch's default log level: silent, then two
   timeout rounds (socket.cpp:1028, TCPStore.cpp:340 retrying, TCPStore.cpp:328 timed out), 13 s
A2 the same at TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL, 36 s: every refused
   connect at TRACE (socket.cpp:859, :931), 62 s in all
B  the master (rank 0) alone, 6 s: "Timed out after 7 seconds waiting for clients. 1/2 clients
   joined." (DistStoreError)
C  a client of an address that drops packets: the same timeout rounds
D  the client first, the master 3 s later: joins
E  an NCCL process group, the master killed after the join: the client's heartbeat monitor logs
   recvValue/sendBytes failures and "Failed to check the "should dump" flag on TCPStore" every
   second and keeps running
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

CHILD = r"""
import sys, time, datetime, torch, torch.distributed as dist
role, host, port, rank, tmo, backend = sys.argv[1:7]
port, rank, tmo = int(port), int(rank), float(tmo)
t0 = time.time()
print(f"T+0 torch {torch.__version__} role={role} init tcp://{host}:{port} rank={rank}",
      file=sys.stderr, flush=True)
kw = {} if tmo <= 0 else {"timeout": datetime.timedelta(seconds=tmo)}
try:
    dist.init_process_group(backend=backend, init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=2, **kw)
    print(f"T+{time.time() - t0:.2f} joined", file=sys.stderr, flush=True)
    time.sleep(60 if role.startswith("nccl") else 30)
except BaseException as e:
    import traceback
    traceback.print_exc()
    print(f"T+{time.time() - t0:.2f} EXC {type(e).__module__}.{type(e).__name__}",
          file=sys.stderr, flush=True)
    sys.exit(1)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(out: str) -> None:
    child = os.path.join(out, "child.py")
    with open(child, "w") as f:
        f.write(CHILD)
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        with open(os.path.join(out, name + ".log"), "wb") as log:
            procs[name] = subprocess.Popen([sys.executable, "-u", child, *args], stdout=log,
                                           stderr=subprocess.STDOUT,
                                           env={**os.environ, **(env or {})})

    start("A_refused_default", ["client", "127.0.0.1", str(free_port()), "1", "8", "gloo"])
    start("A2_refused_info", ["client", "127.0.0.1", str(free_port()), "1", "36", "gloo"],
          {"TORCH_CPP_LOG_LEVEL": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    start("B_master_alone", ["master", "127.0.0.1", str(free_port()), "0", "6", "gloo"])
    start("C_unreachable", ["client", "192.0.2.1", "29501", "1", "8", "gloo"])
    port_d = free_port()
    start("D_client_first", ["client", "127.0.0.1", str(port_d), "1", "60", "gloo"])
    time.sleep(3)
    start("D_master_late", ["master", "127.0.0.1", str(port_d), "0", "60", "gloo"])
    port_e = free_port()
    start("E_nccl_client", ["nccl_client", "127.0.0.1", str(port_e), "1", "0", "nccl"])
    start("E_nccl_master", ["nccl_master", "127.0.0.1", str(port_e), "0", "0", "nccl"])
    time.sleep(15)
    procs["E_nccl_master"].send_signal(signal.SIGKILL)
    t = time.time()
    while time.time() - t < 95 and any(
            p.poll() is None for n, p in procs.items() if n.startswith(("A", "B", "C"))):
        time.sleep(1)
    time.sleep(5)
    rc = {n: p.poll() for n, p in procs.items()}
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    with open(os.path.join(out, "rc.json"), "w") as f:
        json.dump(rc, f)
    print(rc)


if __name__ == "__main__":
    main(sys.argv[1])
