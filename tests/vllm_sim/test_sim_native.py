"""vLLM's native multi-node mode (no Ray) in vllm-sim: `--nnodes 2 --node-rank R --master-addr
--master-port`, `--headless` on rank 1; rank 0 on 127.0.0.2, the headless rank on 127.0.0.3,
each with its own VLLM_HOST_IP (lab/vllm_sim/vllm_sim/native.py and c10d.py cite the vLLM
0.33.0 / 0.17.1 and torch source, and the torch 2.11.0 observations, behind every line here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import vllm_sim  # noqa: F401  (installed by make test)
from vsim_harness import (
    HEAD_IP,
    LEGACY,
    V2,
    WORKER_IP,
    Serve,
    StreamProbe,
    clean_env,
    exe,
    free_port,
    rank_lines,
    read_metrics,
    start_serve,
)

pytestmark = pytest.mark.slow

TP2 = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello native"}]}
# ~2 s at 8 tokens per step and >= 10 ms per step (api_server.py): in flight when frozen
LONG = {"model": "m", "max_tokens": 1600, "ignore_eos": True,
        "messages": [{"role": "user", "content": "go on"}]}


def flags(rank: int, master_port: int, *more: str) -> list[str]:
    out = [*TP2, "--node-rank", str(rank), "--master-addr", HEAD_IP,
           "--master-port", str(master_port), *more]
    return out + (["--headless"] if rank > 0 else [])


def rank0(logs: Path, master_port: int, env: dict[str, str] | None = None, mode=V2) -> Serve:
    return start_serve(None, "m", flags(0, master_port),
                       {**mode, "VLLM_HOST_IP": HEAD_IP, **(env or {})}, logs)


def headless(logs: Path, master_port: int, env: dict[str, str] | None = None, mode=V2) -> Serve:
    return start_serve(None, "m", flags(1, master_port),
                       {**mode, "VLLM_HOST_IP": WORKER_IP, **(env or {})}, logs)


def wait_for(s: Serve, text: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in s.output():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in the log after {timeout_s} s:\n"
                                 f"{s.output()[-4000:]}")
        if s.proc.poll() is not None:
            raise AssertionError(f"exited {s.proc.returncode} before {text!r}:\n{s.output()}")
        time.sleep(0.1)


@pytest.fixture
def procs() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    try:
        yield started
    finally:
        for s in started:
            if s.proc.poll() is None:
                try:
                    os.kill(s.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            s.stop()


def chat(s: Serve, timeout_s: float = 10, body: dict | None = None) -> requests.Response:
    return requests.post(f"{s.url}/v1/chat/completions", json=body or CHAT, timeout=timeout_s)


def established_from(ip: str, port: int) -> bool:
    """An ESTABLISHED connection from `ip` to local port `port` (/proc/net/tcp, IPv4)."""
    want_local = f":{port:04X}"
    want_remote = "".join(f"{int(b):02X}" for b in reversed(ip.split(".")))
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "01" and f[1].endswith(want_local) and f[2].startswith(want_remote + ":"):
            return True
    return False


# --- two nodes ---------------------------------------------------------------------------------


def test_headless_first_then_rank0_serve_a_chat_then_rank0_dies(tmp_path, procs):
    """The headless rank starts first and retries (silently, torch's default log level) until
    rank 0 listens; the group forms, both load and compile, rank 0 serves. Rank 0 killed: the
    headless rank stays up, torch's heartbeat logging the store's loss every second; SIGTERM
    ends it with exit 0."""
    mport = free_port()
    h = headless(tmp_path, mport)
    procs.append(h)
    wait_for(h, f"world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://{HEAD_IP}:"
                f"{mport} backend=nccl")
    time.sleep(1.0)
    assert "[c10d]" not in h.output()  # nothing listens yet: TRACE-level only
    r = rank0(tmp_path, mport)
    procs.append(r)
    r.wait_ready()

    out_r, out_h = r.output(), h.output()
    assert (f"DP group leader: node_rank=0, node_rank_within_dp=0, master_addr={HEAD_IP}, "
            f"mq_connect_ip={HEAD_IP} (local), world_size=2, local_world_size=1") in out_r
    assert (f"world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://{HEAD_IP}:{mport} "
            "backend=nccl") in out_r
    assert ("rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, "
            "ETP rank 0, EP rank N/A, EPLB rank N/A") in out_r
    assert (f"Launching vLLM (v0.33.0) headless multiproc executor, with head node address "
            f"{HEAD_IP}:{mport} for torch.distributed process group.") in out_h
    assert "rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 1" \
        in out_h
    assert "non-default args" not in out_h and "API server version" not in out_h
    assert [(rk, ip) for rk, ip, _ in rank_lines(out_r)] == [(0, HEAD_IP), (1, WORKER_IP)]
    assert "rank_1_0/backbone" in out_h  # the headless rank compiled on its own node
    # the headless rank holds its rendezvous connection to rank 0, from its node's address
    assert established_from(WORKER_IP, mport)

    answer = chat(r)
    assert answer.status_code == 200, answer.text
    text = answer.json()["choices"][0]["message"]["content"]
    assert f"ranks on {HEAD_IP}, {WORKER_IP}" in text
    assert text.endswith("you said: hello native")

    r.proc.kill()
    r.proc.wait(timeout=10)
    wait_for(h, "TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(", 10)
    wait_for(h, "TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(", 10)
    assert "Failed to recv, got 0 bytes. Connection was likely closed." in h.output()
    assert h.proc.poll() is None  # it never exits on its own
    h.proc.send_signal(signal.SIGTERM)
    assert h.wait_exit(10) == 0
    assert "[shutdown] Executor: all workers exited gracefully" in h.output()


def test_killed_headless_rank_hangs_requests_then_the_engine_dies(tmp_path, procs):
    """Frozen (SIGSTOP) with a request in flight: /health 200, running > 0, tokens still, the
    wedge; SIGCONT and it finishes. Killed: the next chat never answers while /health stays
    200; after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS execute_model times out, the engine dies and
    the API server exits 0."""
    mport = free_port()
    r = rank0(tmp_path, mport, {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "8"})
    procs.append(r)
    wait_for(r, "backend=nccl")
    h = headless(tmp_path, mport)
    procs.append(h)
    r.wait_ready()
    assert chat(r).status_code == 200

    # frozen mid-request: the wedge signature the program reads
    with ThreadPoolExecutor(1) as pool:
        inflight = pool.submit(chat, r, 60, LONG)
        time.sleep(0.8)
        os.kill(h.proc.pid, signal.SIGSTOP)
        time.sleep(0.5)
        first = read_metrics(r.url)
        time.sleep(1.5)
        second = read_metrics(r.url)
        assert requests.get(f"{r.url}/health", timeout=5).status_code == 200
        assert second["vllm:num_requests_running"] >= 1
        assert second["vllm:generation_tokens_total"] == first["vllm:generation_tokens_total"]
        canary = StreamProbe(r.url, "/v1/completions",
                             {"model": "m", "prompt": "x", "max_tokens": 1, "stream": True})
        time.sleep(1.0)
        assert canary.events == []
        os.kill(h.proc.pid, signal.SIGCONT)
        assert inflight.result(timeout=30).status_code == 200
        canary.join(10)

    h.proc.kill()
    h.proc.wait(timeout=10)
    killed_at = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        chat(r, timeout_s=3)
    assert requests.get(f"{r.url}/health", timeout=5).status_code == 200
    assert r.proc.poll() is None
    assert r.wait_exit(30) == 0
    assert time.monotonic() - killed_at >= 5  # the execute timeout (8 s) from the first step
    out = r.output()
    assert "TimeoutError: RPC call to execute_model timed out." in out
    assert "EngineCore encountered a fatal error." in out


# --- joining and timing out ----------------------------------------------------------------------


def test_headless_retries_while_nothing_listens(tmp_path, procs):
    """At TORCH_CPP_LOG_LEVEL=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL torch shows each refused
    connect; at its default level nothing; either way the rank keeps trying."""
    loud = headless(tmp_path, free_port(),
                    {"TORCH_CPP_LOG_LEVEL": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    quiet = headless(tmp_path, free_port())
    procs += [loud, quiet]
    wait_for(loud, "is not yet listening (errno: 111 - Connection refused), will retry.")
    assert "[c10d - trace] The server socket on [::ffff:127.0.0.2]:" in loud.output()
    time.sleep(3)
    for s in (loud, quiet):
        assert s.proc.poll() is None, s.output()
        assert "WorkerProc failed to start" not in s.output()
    assert "[c10d]" not in quiet.output()


def test_join_timeouts_with_torchs_text(tmp_path, procs):
    """Rank 0 alone: DistStoreError after the timeout (whole seconds, `elapsed > timeout`), then
    the engine's and the API server's errors, exit 1. A headless rank alone: torch's two rounds
    (retrying, then timed out), then vLLM's worker/executor errors, exit 1."""
    env = {"VLLM_SIM_NATIVE_JOIN_TIMEOUT_S": "2"}
    r = rank0(tmp_path, free_port(), env)
    h = headless(tmp_path, free_port(), env)
    procs += [r, h]
    assert r.wait_exit(30) == 1
    out = r.output()
    assert ("torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. "
            "1/2 clients joined.") in out
    for line in ("WorkerProc failed to start.", "EngineCore failed to start.",
                 "Exception: WorkerProc initialization failed due to an exception in a background "
                 "process. See stack trace for root cause.",
                 "RuntimeError: Engine core initialization failed. See root cause above. Failed "
                 "core proc(s): {'EngineCore': 1}"):
        assert line in out, line
    assert h.wait_exit(30) == 1
    out = h.output()
    assert "[c10d] The client socket has timed out after 2000ms while trying to connect to (" \
        f"{HEAD_IP}, " in out
    assert "- retrying (try=0, timeout=2000ms, delay=" in out
    assert "- timed out (try=1, timeout=2000ms): The client socket has timed out" in out
    assert "torch.distributed.DistNetworkError: The client socket has timed out after 2000ms" \
        in out
    assert "Exception: WorkerProc initialization failed due to an exception" in out


# --- the command line ----------------------------------------------------------------------------


def vllm(argv: list[str], mode: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([exe("vllm"), "serve", "m", "--port", str(free_port()), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_env(**mode))


CASES = [
    (V2, ["-tp", "2", "--nnodes", "2", "--distributed-executor-backend", "ray"],
     "pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n"
     "  Value error, nnodes > 1 can only be set when distributed executor backend is mp, uni or "
     "external_launcher. [type=value_error, input_value=ArgsKwargs((), {'pipeline..."),
    (V2, ["-tp", "3", "--nnodes", "2"],
     "ValueError: Invalid data-parallel launch options: `--nnodes 2` must evenly divide the total "
     "world size (3)."),
    (V2, ["-tp", "2", "--nnodes", "2", "--node-rank", "2", "--headless"],
     "ValueError: Invalid data-parallel launch options: `--node-rank` must be between 0 and 1; "
     "got `--node-rank 2`."),
    (V2, ["-tp", "2", "--nnodes", "2", "-dpb", "ray"],
     "`--nnodes 2` requires `--data-parallel-backend mp`; got `--data-parallel-backend ray`."),
    (V2, ["-tp", "2", "--nnodes", "2", "-r", "1", "--headless", "--api-server-count", "1"],
     "ValueError: --api-server-count=1 cannot be used with --headless (no API servers are "
     "started in headless mode)."),
    (V2, ["-tp", "4", "--nnodes", "2"],  # two ranks on a one-GPU node
     "AssertionError: DP adjusted local rank 1 is out of bounds for 1 devices."),
    (LEGACY, ["-tp", "3", "--nnodes", "2"],
     "AssertionError: world_size=3 must be divisible by nnodes=2."),
    (LEGACY, ["-tp", "2", "-n", "2", "--distributed-executor-backend", "ray"],
     "nnodes > 1 can only be set when distributed executor backend is mp, uni or "
     "external_launcher. [type=value_error, input_value=ArgsKwargs((), {'pipeline...'_api_process"),
]


def test_what_vllm_refuses_exits_1_with_its_text():
    running = [(vllm(argv, mode), want) for mode, argv, want in CASES]
    for proc, want in running:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1, out
        assert want in out, out
        assert "Route:" not in out


# --- legacy mode (vLLM 0.17.1 had native multi-node too) --------------------------------------


def test_legacy_two_nodes_and_sigterm(tmp_path, procs):
    mport = free_port()
    r = rank0(tmp_path, mport, mode=LEGACY)
    h = headless(tmp_path, mport, mode=LEGACY)
    procs += [r, h]
    r.wait_ready()
    assert chat(r).status_code == 200
    assert "Launching vLLM (v0.17.1) headless multiproc executor" in h.output()
    assert ("rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 1, "
            "EP rank N/A, EPLB rank N/A") in h.output()
    r.proc.send_signal(signal.SIGTERM)
    assert r.wait_exit(20) == 0
    wait_for(h, "Failed to check the \"should dump\" flag on TCPStore, (maybe TCPStore server has "
                "shut down too early)", 10)
    assert h.proc.poll() is None
