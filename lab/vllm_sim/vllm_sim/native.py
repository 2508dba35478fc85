"""vLLM's native multi-node mode (no Ray), simulated: one `vllm serve` per node,

    vllm serve MODEL -tp T -pp P --distributed-executor-backend mp --nnodes N --node-rank R \
        --master-addr HEAD_IP --master-port PORT          # and --headless on ranks R > 0

(vLLM docs serving/parallelism_scaling.md). vllm-sim plays one GPU per node: each node runs
world_size / nnodes = 1 rank. Both modes have it: vLLM 0.17.1 (legacy) and 0.33.0 (V2), cited
as "0.33.0 path:line" / "0.17.1 path:line" (paths inside the wheels).

Command line and config (what fails before any rank starts; uncaught in vLLM: traceback, exit 1):
- `--headless` with `--api-server-count N > 0`: ValueError (0.33.0 entrypoints/cli/serve.py:69-77,
  0.17.1 :53-61). Headless ranks log neither the version nor the non-default args (those are
  setup_server's: 0.33.0 entrypoints/launchers/launcher.py:365-368, 0.17.1
  entrypoints/openai/api_server.py:425) and bind no HTTP port.
- the model's config is read first (create_model_config), then (0.33.0 engine/arg_utils.py
  :2390-2420) `--nnodes N` requires `--data-parallel-backend mp`; world_size (DP x PP x TP x PCP)
  must divide by nnodes; 0 <= node_rank < nnodes: ValueErrors "Invalid data-parallel launch
  options: ..."; 0.17.1 (engine/arg_utils.py:1558-1577) and 0.26.0 (:1970-1989) have
  AssertionErrors instead ("world_size=3 must be divisible by nnodes=2.", "node_rank=2 must be
  less than nnodes=2."): played for every version below 0.33.
  Then "Inferred data_parallel_rank %d from node_rank %d" (0.33.0 :2512-2517, 0.17.1 :1633-1638).
- ParallelConfig (a pydantic dataclass, so its ValueError prints as pydantic's
  ValidationError): no --distributed-executor-backend and nnodes > 1 on CUDA -> "mp" (0.33.0
  config/parallel.py:1054-1065, 0.17.1 :715-726): `mp` need not be given. A backend other than
  mp/uni/external_launcher with nnodes > 1: "nnodes > 1 can only be set when distributed
  executor backend is mp, uni or external_launcher." (0.33.0 :1107-1115, 0.17.1 :767-775).
- not simulated, refused with a vllm-sim message: data parallelism (DP > 1), the `uni` and
  `external_launcher` backends with nnodes > 1, `--headless` on node rank 0 (vLLM's headless DP
  engines: 0.33.0 serve.py:235-244), prefill context parallelism.

Startup (each node its own config, weights and compile cache; one rank per node here):
- rank 0 (no --headless) binds the API port first (as the Ray path), then its executor is the
  "DP group leader" (0.33.0 v1/executor/multiproc_executor.py:162-185, 0.17.1 :130-150); its
  worker logs "world_size=W rank=0 local_rank=0 distributed_init_method=tcp://A:P backend=nccl"
  (0.33.0 distributed/parallel_state.py:1928-1936, 0.17.1 :1392-1400) and hosts the TCPStore,
  waiting for every rank (c10d.py: 600 s, or --distributed-timeout-seconds in 0.33.0; the
  simulator-only VLLM_SIM_NATIVE_JOIN_TIMEOUT_S overrides the default). A rank that never comes:
  the worker's "WorkerProc failed to start." with torch's DistStoreError (0.33.0
  multiproc_executor.py:1056-1057), "EngineCore failed to start." with "WorkerProc initialization
  failed due to an exception in a background process. See stack trace for root cause."
  (:890-893, :914-916; v1/engine/core.py:1582-1584), then the API server's "RuntimeError: Engine
  core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}"
  (v1/engine/utils.py:1473-1481); exit 1.
- a headless rank logs "Launching vLLM (v%s) headless multiproc executor, with head node address
  %s for torch.distributed process group." (0.33.0 serve.py:218-233, 0.17.1 :170-185), its worker
  the same world_size line with rank R, then connects to the master as torch does (c10d.py:
  silent at torch's default log level while nothing listens, ~2 x the timeout in all before it
  gives up); failing, "WorkerProc failed to start." and the uncaught "Exception: WorkerProc
  initialization failed ...", exit 1.
- once the group formed: "rank R in world size W is assigned as DP rank 0, PP rank p, PCP rank 0,
  TP rank t, ETP rank t, EP rank N/A, EPLB rank N/A" (0.33.0 parallel_state.py:2385-2397; 0.17.1
  :1715-1727 and 0.26.0 :1946-1958 have no ETP); every rank loads the weights from its own node (weights.py); then the
  message queues (WorkerProc._init_message_queues, 0.33.0 multiproc_executor.py:715-745 and
  :250-273): rank 0's executor binds the broadcast queue on every address and advertises
  get_ip() (VLLM_HOST_IP) of its node ("mq_connect_ip"); each headless rank binds its response
  queue and advertises ITS get_ip(); each side connects to the other's advertised address and
  both wait (shm_broadcast wait_until_ready: no timeout, no log; ZMQ retries a connect
  silently). A VLLM_HOST_IP that does not reach its node therefore hangs the start forever,
  silently, after the weights loaded. Then the engine's profile run: every rank compiles through
  its own node's compile cache (compile_cache.py), rank 0 keeps the longest (as the Ray path).
- the simulator's own lines: "rank r -> node IP (hostname=..., node_rank=..., pid=...)" on rank 0
  once the ranks reported, and its weight summaries; /sim/ranks as in V2 Ray mode (each rank's
  own environment: no carry-over in this mode).

Serving: every engine step is a round trip over every headless rank's queues (a TP all-reduce
or PP hand-over needs every rank): the step waits for each rank's answer up to
VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (default 300: 0.33.0 envs.py:252, 1863-1864; 0.17.1
envs.py:184, 1352-1353), the timeout of execute_model's collective_rpc (0.33.0
multiproc_executor.py:406-417, 498-509; 0.17.1 :284-304, 359-370).
- a headless rank killed or frozen (SIGSTOP) while idle: nothing happens on rank 0 (its worker
  monitor watches only local worker processes, 0.33.0 multiproc_executor.py:364-398; no message
  goes out while idle). The next request's step never gets that rank's answer: /health stays
  200 (AsyncLLM.check_health only reads the engine's dead flag, 0.33.0 v1/engine/async_llm.py
  :1129-1134; 0.17.1 :875-878), vllm:num_requests_running keeps its last published value and
  vllm:generation_tokens_total stands still (api_server.py). Read from source only: on a GPU the
  rank-0 worker would sit in an NCCL collective with the dead peer (vLLM's own pynccl, not
  watched by torch's NCCL watchdog), which is what the simulator's unanswered round trip plays.
  After the execute timeout: "RPC call to execute_model timed out." -> "EngineCore encountered a
  fatal error." (0.33.0 v1/engine/core.py:1582-1587), the in-flight requests fail with 500, and
  the API server's watchdog ends the process within 5 s (exit 0, as cli.py's V2 path: 0.33.0
  entrypoints/launchers/launcher.py:314-337, 0.17.1 entrypoints/launcher.py:128-150). A frozen
  rank continued (SIGCONT) before that answers and generation resumes.
- rank 0 killed: a headless rank's worker waits on the broadcast queue forever (0.33.0
  multiproc_executor.py:1154-1161, dequeue(indefinite=True): ZMQ reconnects silently) and its
  process stays up; torch's heartbeat monitor logs the store's loss every second (c10d.py). It
  never rejoins: a restarted rank 0 waits for it until its own timeout.
- SIGTERM: rank 0 as cli.py (uvicorn's graceful shutdown, exit 0; its headless ranks keep
  running, as above); a headless rank: run_headless's handler raises SystemExit (0.33.0
  serve.py:205-216, 0.17.1 :158-168): the executor's shutdown lines, exit 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from vllm_sim import _major_minor, compile_cache, simulated_version
from vllm_sim.c10d import (
    DEFAULT_PG_NCCL_TIMEOUT_S,
    Conn,
    DistNetworkError,
    DistStoreError,
    StoreServer,
    TorchLog,
    _bind_source,
    _named_exception,
    heartbeat,
    raised_from,
    store_client_connect,
)
from vllm_sim.logger import init_logger
from vllm_sim.network_utils import get_ip
from vllm_sim.ray_env import env_report
from vllm_sim.weights import Loaded, ModelSource, load_weights

logger = init_logger(__name__)

# vllm/config/parallel.py defaults (0.33.0 :317-328, 0.17.1 :226-235)
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29501
# data_parallel_rpc_port (0.33.0 config/parallel.py:161)
DEFAULT_DP_RPC_PORT = 29550
# VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (module docstring)
DEFAULT_EXECUTE_MODEL_TIMEOUT_S = 300
# ZMQ's default reconnect interval: a queue's connect is retried silently
MQ_RECONNECT_S = 0.1

ValidationError = _named_exception("pydantic_core._pydantic_core", "ValidationError", ValueError)
AcceleratorError = _named_exception("torch", "AcceleratorError", RuntimeError)

WORKER_INIT_FAILED = ("WorkerProc initialization failed due to an exception in a background "
                      "process. See stack trace for root cause.")


class NotSimulatedError(Exception):
    """A native-mode setup vllm-sim does not play."""


# vLLM's own log lines, printed with the file:line vLLM's logger shows (0.33.0, 0.17.1; the V2
# versions in between show 0.33.0's)
_WHERE: dict[str, tuple[str, int, int]] = {
    "inferred": ("arg_utils.py", 2513, 1634),
    "leader": ("multiproc_executor.py", 167, 134),
    "dist_init": ("parallel_state.py", 1929, 1393),
    "assigned": ("parallel_state.py", 2385, 1715),
    "headless": ("serve.py", 224, 176),
    "headless_dp": ("serve.py", 239, 191),
    "worker_failed": ("multiproc_executor.py", 1057, 800),
    "engine_failed": ("core.py", 1584, 1100),
    "shutdown_wait": ("multiproc_executor.py", 580, 0),
    "shutdown_done": ("multiproc_executor.py", 587, 0),
    "parent_exited": ("multiproc_executor.py", 944, 749),
}


def _vlog(level: int, key: str, legacy: bool, msg: str, *args: Any,
          exc_info: BaseException | None = None) -> None:
    file, line_new, line_old = _WHERE[key]
    line = line_old if legacy else line_new
    if not logger.isEnabledFor(level):
        return
    info = (type(exc_info), exc_info, exc_info.__traceback__) if exc_info is not None else None
    logger.handle(logger.makeRecord(logger.name, level, file, line, msg, args, info))


def join_timeout_s(flag: int | None) -> float:
    """The store's timeout: --distributed-timeout-seconds (0.33.0: gpu_worker.py:1710-1712),
    else VLLM_SIM_NATIVE_JOIN_TIMEOUT_S (simulator-only), else torch's NCCL default, 600 s."""
    if flag is not None:
        return float(flag)
    raw = os.environ.get("VLLM_SIM_NATIVE_JOIN_TIMEOUT_S")
    return float(raw) if raw else float(DEFAULT_PG_NCCL_TIMEOUT_S)


def execute_model_timeout_s() -> float:
    raw = os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS")
    return float(int(raw)) if raw else float(DEFAULT_EXECUTE_MODEL_TIMEOUT_S)


def torch_minor() -> tuple[int, int]:
    """The torch each played vLLM pins: 0.17.1 torch==2.10.0, 0.26.0 2.11.0, 0.33.0 2.14.0
    (their wheels' METADATA); versions in between take the older pin."""
    v = _major_minor(simulated_version())
    if v >= (0, 33):
        return (2, 14)
    return (2, 11) if v >= (0, 23) else (2, 10)


# --- the command line -------------------------------------------------------------------------

@dataclass
class NativeArgs:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    api_server_count: int | None
    dp_size: int
    dp_backend: str
    backend: str | None
    timeout_flag: int | None
    pcp_size: int
    legacy: bool  # 0.17.1's executor, worker and texts
    # create_engine_config's AssertionErrors and the rank line without ETP: 0.17.1 and 0.26.0
    # (/root/vllm-src: engine/arg_utils.py:1970-1988, distributed/parallel_state.py:1946-1958)
    old_checks: bool

    @property
    def head_address(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"  # utils/network_utils.py get_tcp_uri


def _int(value: Any, default: int | None) -> int | None:
    if value is None:
        return default
    return int(value)


def _legacy_native_flags(extra: list[str]) -> argparse.Namespace:
    """0.17.1's own flags for this mode (engine/arg_utils.py:811-814, entrypoints/openai/
    cli_args.py --headless, --api-server-count), read out of legacy mode's unparsed flags."""
    p = argparse.ArgumentParser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default=None)
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--headless", action="store_true", default=False)
    p.add_argument("--api-server-count", "-asc", type=int, default=None)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-backend", "-dpb", default=None)
    args, _ = p.parse_known_args(extra)
    return args


def requested(args: argparse.Namespace, extra: list[str], v2: bool) -> NativeArgs | None:
    """The native mode's flags when it is asked for (--nnodes > 1 or --headless), else None."""
    src = args if v2 else _legacy_native_flags(list(extra))
    nnodes = _int(getattr(src, "nnodes", 1), 1) or 1
    headless = bool(getattr(src, "headless", False))
    if nnodes <= 1 and not headless:
        return None
    return NativeArgs(
        nnodes=nnodes,
        node_rank=_int(getattr(src, "node_rank", None), 0) or 0,
        master_addr=getattr(src, "master_addr", None) or DEFAULT_MASTER_ADDR,
        master_port=_int(getattr(src, "master_port", None), DEFAULT_MASTER_PORT)
        or DEFAULT_MASTER_PORT,
        headless=headless,
        api_server_count=_int(getattr(src, "api_server_count", None), None),
        dp_size=_int(getattr(src, "data_parallel_size", 1), 1) or 1,
        dp_backend=getattr(src, "data_parallel_backend", None) or "mp",
        backend=args.distributed_executor_backend,
        timeout_flag=_int(getattr(args, "distributed_timeout_seconds", None), None) if v2 else None,
        pcp_size=_int(getattr(args, "prefill_context_parallel_size", None), 1) if v2 else 1,
        legacy=not v2,
        old_checks=_major_minor(simulated_version()) < (0, 33),
    )


def _pydantic_value_error(msg: str, last_kwarg: str) -> BaseException:
    """A ValueError raised in a pydantic dataclass's __post_init__, as pydantic-core reports it:
    the input is ArgsKwargs of ParallelConfig's call (0.33.0 engine/arg_utils.py:2569-2633,
    first pipeline_parallel_size, last numa_bind_cpus; 0.17.1 :1686-1727, last
    _api_process_rank), its repr cut to 25 + "..." + 24 characters."""
    import pydantic

    full = "ArgsKwargs((), {'pipeline_parallel_size': 1, " + last_kwarg + "})"
    shown = full[:25] + "..." + full[-24:]
    minor = ".".join(pydantic.VERSION.split(".")[:2])
    return ValidationError(
        "1 validation error for ParallelConfig\n"
        f"  Value error, {msg} [type=value_error, input_value={shown}, input_type=ArgsKwargs]\n"
        f"    For further information visit https://errors.pydantic.dev/{minor}/v/value_error")


def check_engine_args(nat: NativeArgs, tp: int, pp: int) -> str:
    """create_engine_config's checks for nnodes (module docstring), in vLLM's order; raises what
    vLLM raises. Returns the executor backend ParallelConfig settles on."""
    world_within_dp = pp * tp * nat.pcp_size
    world = nat.dp_size * world_within_dp
    if nat.nnodes > 1:
        if nat.old_checks:
            if nat.dp_backend != "mp":
                raise AssertionError("nnodes > 1 is only supported with data_parallel_backend=mp")
            if world % nat.nnodes != 0:
                raise AssertionError(
                    f"world_size={world} must be divisible by nnodes={nat.nnodes}.")
            if not nat.node_rank < nat.nnodes:
                raise AssertionError(
                    f"node_rank={nat.node_rank} must be less than nnodes={nat.nnodes}.")
        else:
            if nat.dp_backend != "mp":
                raise ValueError(
                    "Invalid data-parallel launch options: "
                    f"`--nnodes {nat.nnodes}` requires `--data-parallel-backend mp`; got "
                    f"`--data-parallel-backend {nat.dp_backend}`. "
                    "Use the MP backend or set `--nnodes 1`.")
            if world % nat.nnodes != 0:
                raise ValueError(
                    "Invalid data-parallel launch options: "
                    f"`--nnodes {nat.nnodes}` must evenly divide the total world size "
                    f"({world}). Adjust `--nnodes`, `--data-parallel-size`, "
                    "`--pipeline-parallel-size`, `--tensor-parallel-size`, or "
                    "`--prefill-context-parallel-size`.")
            if not 0 <= nat.node_rank < nat.nnodes:
                raise ValueError(
                    "Invalid data-parallel launch options: `--node-rank` must be between 0 and "
                    f"{nat.nnodes - 1}; got `--node-rank {nat.node_rank}`. Set it to this "
                    "node's zero-based index.")
        local_world = world // nat.nnodes
        inferred_dp_rank = (nat.node_rank * local_world) // world_within_dp
        _vlog(logging.INFO, "inferred", nat.legacy, "Inferred data_parallel_rank %d from "
              "node_rank %d", inferred_dp_rank, nat.node_rank)
    backend = nat.backend
    if backend is None and world > 1 and nat.nnodes > 1:
        backend = "mp"  # CUDA and nnodes > 1
    elif backend is None and world == 1:
        backend = "uni"
    if backend not in ("mp", "uni", "external_launcher") and nat.nnodes > 1:
        raise _pydantic_value_error(
            "nnodes > 1 can only be set when distributed executor backend is mp, uni or "
            "external_launcher.",
            "'_api_process_rank': 0" if nat.legacy else "'numa_bind_cpus': None")
    if nat.dp_size > 1:
        raise NotSimulatedError("data parallelism (--data-parallel-size > 1) in native multi-node mode")
    if nat.pcp_size != 1:
        raise NotSimulatedError("--prefill-context-parallel-size with native multi-node mode")
    if nat.nnodes > 1 and backend != "mp":
        raise NotSimulatedError(f"--distributed-executor-backend {backend} with --nnodes > 1 "
                           "(only mp is simulated)")
    return backend


def _refuse(what: NotSimulatedError) -> int:
    logger.error("vllm-sim does not simulate %s; it plays vLLM's native multi-node mode with "
                 "the mp executor, one rank per node.", what)
    return 1


def _print_uncaught(exc: BaseException) -> None:
    """What Python prints for an exception nothing catches (vLLM's own, then exit 1)."""
    traceback.print_exception(exc)


# --- a rank ------------------------------------------------------------------------------------

def _rank_names(rank: int, tp: int, pp: int) -> tuple[int, int]:
    """Rank -> (PP rank, TP rank): ranks are laid out DP x PP x PCP x TP (parallel_state.py
    initialize_model_parallel), TP innermost."""
    return (rank // tp) % pp, rank % tp


def log_rank_assignment(rank: int, world: int, tp: int, pp: int, legacy: bool,
                        old_checks: bool) -> None:
    pp_rank, tp_rank = _rank_names(rank, tp, pp)
    if old_checks:
        _vlog(logging.INFO, "assigned", legacy, "rank %s in world size %s is assigned as DP rank "
              "%s, PP rank %s, PCP rank %s, TP rank %s, EP rank %s, EPLB rank %s", rank, world, 0,
              pp_rank, 0, tp_rank, "N/A", "N/A")
    else:
        _vlog(logging.INFO, "assigned", legacy, "rank %s in world size %s is assigned as DP rank "
              "%s, PP rank %s, PCP rank %s, TP rank %s, ETP rank %s, EP rank %s, EPLB rank %s",
              rank, world, 0, pp_rank, 0, tp_rank, tp_rank, "N/A", "N/A")


def _local_rank_error(legacy: bool) -> BaseException:
    """A second local rank on a one-GPU node, in Worker.init_device: 0.33.0 gpu_worker.py:486-490
    asserts; 0.17.1 (:226-257, the assert skipped when nnodes_within_dp > 1) fails in
    torch.cuda.set_device (torch's invalid-ordinal text, c10/cuda)."""
    if not legacy:
        return AssertionError("DP adjusted local rank 1 is out of bounds for 1 devices.")
    return AcceleratorError(
        "CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough "
        "GPUs?\nCUDA kernel errors might be asynchronously reported at some other API call, so "
        "the stacktrace below might be incorrect.\nFor debugging consider passing "
        "CUDA_LAUNCH_BLOCKING=1")


class WorkerFailedError(Exception):
    """WorkerProc.wait_for_ready's exception (0.33.0 multiproc_executor.py:890-893), a plain
    Exception in vLLM: printed as one."""


WorkerFailedError.__module__ = "builtins"
WorkerFailedError.__qualname__ = "Exception"


def _worker_failed(exc: BaseException, legacy: bool) -> WorkerFailedError:
    """The worker's "WorkerProc failed to start." (multiproc_executor.py:1056-1057) with its
    exception, and what its executor raises next."""
    _vlog(logging.ERROR, "worker_failed", legacy, "WorkerProc failed to start.", exc_info=exc)
    return WorkerFailedError(WORKER_INIT_FAILED)


def _raise_in_worker(exc: BaseException, legacy: bool) -> WorkerFailedError:
    try:
        raise exc
    except BaseException as raised:  # noqa: BLE001 - logged with its traceback, then wrapped
        return _worker_failed(raised, legacy)


def _load(source: ModelSource, rank: int, load_s: float) -> tuple[Loaded | None, float]:
    where = f"rank {rank} on {get_ip()} ({socket.gethostname()})"
    # vLLM 0.26.0 v1/worker/gpu_model_runner.py load_model's first line (spark-vllm names the
    # phase of a start from it)
    logger.info("Starting to load model %s...", source.model)
    logger.info("Loading weights (simulated) on rank %d... %s", rank, source.model)
    t0 = time.time()
    loaded = load_weights(source, progress=rank == 0, where=where, pretend_s=load_s)
    if loaded is None:  # not cached: the pretend load still takes its time
        time.sleep(load_s)
    return loaded, time.time() - t0


def _log_loaded(rank: int, loaded: Loaded | None, seconds: float) -> None:
    if loaded is not None:
        logger.info("Weights checked on rank(s) [%d]: %d files, %d tensors, %.2f GiB "
                    "(simulated: headers and sizes only)", rank, loaded.files, loaded.tensors,
                    loaded.bytes / 1024**3)
    else:
        logger.info("Weights not cached on rank(s) [%d]: a real vLLM would have downloaded "
                    "them.", rank)
    logger.info("Model loading took 0.0000 GiB and %.2f seconds (simulated)", seconds)


def _own_report(rank: int, node_rank: int) -> dict[str, Any]:
    env = dict(os.environ)
    return {"rank": rank, "node_ip": get_ip(), "node_id": f"node_rank={node_rank}",
            "driver_node": rank == 0, "pid": os.getpid(), "hostname": socket.gethostname(),
            "env": env_report(env, env)}


def _connect_forever(addr: tuple[str, int], source_ip: str | None,
                     stop: threading.Event) -> socket.socket | None:
    """A queue's connect (ZMQ): retried every MQ_RECONNECT_S, silently, without end."""
    while not stop.is_set():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _bind_source(sock, source_ip)
        sock.settimeout(2.0)
        try:
            sock.connect(addr)
        except OSError:
            sock.close()
            stop.wait(MQ_RECONNECT_S)
            continue
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    return None


def _listen_any() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", 0))
    sock.listen(16)
    return sock


def _forever(stop: threading.Event) -> None:
    """Blocked as a collective with a dead peer is: until the process ends."""
    while not stop.wait(3600):
        pass


def _log_worker_shutdown(legacy: bool) -> None:
    """The executor's shutdown of its local worker: 0.33.0 multiproc_executor.py:580-588 and the
    worker's death-pipe monitor (:944); 0.17.1 logs only the worker's line (:749)."""
    if legacy:
        _vlog(logging.INFO, "parent_exited", legacy, "Parent process exited, terminating worker")
        return
    _vlog(logging.INFO, "shutdown_wait", legacy, "[shutdown] Executor: waiting for worker exit "
          "count=%d", 1)
    _vlog(logging.INFO, "parent_exited", legacy, "Parent process exited, terminating worker "
          "queues")
    _vlog(logging.INFO, "shutdown_done", legacy, "[shutdown] Executor: all workers exited "
          "gracefully")


# --- rank 0: the leader's executor -------------------------------------------------------------

@dataclass
class _Peer:
    rank: int
    ready: dict[str, Any] | None = None
    bcast: Conn | None = None  # rank 0 -> the rank (the rank connected to rank 0's queue)
    resp: Conn | None = None  # the rank -> rank 0 (rank 0 connected to the rank's queue)
    gone_before_ready: bool = False


class NativeExecutor:
    """Rank 0's MultiprocExecutor as the DP group leader, with its rank-0 worker in-process."""

    native = True

    def __init__(self, nat: NativeArgs, tp: int, pp: int, load_s: float,
                 source: ModelSource) -> None:
        self.nat, self.tp, self.pp = nat, tp, pp
        self.world = tp * pp
        self.is_failed = False
        self.failure_error: BaseException | None = None
        self.failure_callback: Any = None
        self.shutting_down = False
        self.stop = threading.Event()
        self.store: StoreServer | None = None
        self.mq_sock: socket.socket | None = None
        self.own_conn: Conn | None = None
        self.peers: dict[int, _Peer] = {r: _Peer(r) for r in range(1, self.world)}
        self.cond = threading.Condition()
        self.rank_reports: list[dict[str, Any]] = []
        self.rank_ips: list[str] = []
        self._step_lock = threading.Lock()
        self._seq = 0
        try:
            self._start(load_s, source)
        except BaseException:
            self.shutdown(log=False)
            raise

    # -- startup

    def _start(self, load_s: float, source: ModelSource) -> None:
        nat = self.nat
        local_world = self.world // nat.nnodes
        mq_connect_ip = get_ip()
        _vlog(logging.INFO, "leader", nat.legacy, "DP group leader: node_rank=%d, "
              "node_rank_within_dp=%d, master_addr=%s, mq_connect_ip=%s (local), world_size=%d, "
              "local_world_size=%d", nat.node_rank, nat.node_rank, nat.master_addr,
              mq_connect_ip, self.world, local_world)
        self.mq_sock = _listen_any()  # the broadcast queue, bound on every address
        _vlog(logging.INFO, "dist_init", nat.legacy, "world_size=%d rank=%d local_rank=%d "
              "distributed_init_method=%s backend=%s", self.world, 0, 0, nat.init_method, "nccl")
        if local_world > 1:
            raise _raise_in_worker(_local_rank_error(nat.legacy), nat.legacy)
        timeout = join_timeout_s(nat.timeout_flag)
        self.tlog = TorchLog()
        try:
            self.store = StoreServer(nat.master_port, self._on_store_message)
            sock = store_client_connect(nat.master_addr, nat.master_port, timeout, self.tlog,
                                        source_ip=get_ip())
            self.own_conn = Conn(sock)
            self.own_conn.send({"op": "join", "rank": 0, "node_rank": nat.node_rank})
            self.store.wait_for_workers(self.world, timeout)
        except (DistNetworkError, DistStoreError) as exc:
            raise _raise_in_worker(exc, nat.legacy) from None
        self.tlog.rank_prefix = "[rank0]:"
        for rank in self.peers:
            conn = self.store.conns.get(rank)
            if conn is None:
                continue  # counted but not this rank (a duplicate): it never answers
            try:
                conn.send({"op": "group", "mq": [mq_connect_ip, self.mq_sock.getsockname()[1]],
                           "world_size": self.world})
            except OSError:
                pass
        log_rank_assignment(0, self.world, self.tp, self.pp, nat.legacy, nat.old_checks)
        try:
            loaded, seconds = _load(source, 0, load_s)
        except Exception as exc:  # noqa: BLE001 - the worker's failure
            raise _worker_failed(exc, nat.legacy) from None
        _log_loaded(0, loaded, seconds)
        self._wait_ready()
        self._report_ranks()
        self._mq_barrier()

    def _on_store_message(self, rank: int, msg: dict[str, Any], conn: Conn) -> None:
        peer = self.peers.get(rank)
        if peer is None:
            return
        with self.cond:
            if msg.get("op") == "ready":
                peer.ready = msg
            elif msg.get("op") == "eof" and peer.ready is None:
                peer.gone_before_ready = True
            self.cond.notify_all()

    def _wait_ready(self) -> None:
        """Every rank loaded and bound its response queue. A rank that dies first: its gloo
        peers see the connection close (read from source only: the text is gloo's, not
        verified)."""
        with self.cond:
            while True:
                gone = [p for p in self.peers.values() if p.gone_before_ready]
                if gone:
                    assert self.store is not None
                    host, port = self.store.joined.get(gone[0].rank, {}).get("peer", ["?", 0])
                    raise _raise_in_worker(RuntimeError(
                        f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
                        f"by peer [{host}]:{port}"), self.nat.legacy)
                if all(p.ready is not None for p in self.peers.values()):
                    return
                self.cond.wait(0.2)

    def _report_ranks(self) -> None:
        reports = [_own_report(0, self.nat.node_rank)]
        for rank in sorted(self.peers):
            reports.append(self.peers[rank].ready["report"])
        self.rank_reports = reports
        self.rank_ips = [r["node_ip"] for r in reports]
        for r in reports:
            logger.info("rank %d -> node %s (hostname=%s, %s, pid=%d)", r["rank"], r["node_ip"],
                        r["hostname"], r["node_id"], r["pid"])
        for rank in sorted(self.peers):
            ready = self.peers[rank].ready
            if ready.get("loaded") is None:
                logger.info("Weights not cached on rank(s) [%d]: a real vLLM would have "
                            "downloaded them.", rank)
            else:
                w = ready["loaded"]
                logger.info("Weights checked on rank(s) [%d]: %d files, %d tensors, %.2f GiB "
                            "(simulated: headers and sizes only)", rank, w["files"], w["tensors"],
                            w["bytes"] / 1024**3)

    def _mq_barrier(self) -> None:
        """Both queues of every rank connected; no bound, no log (module docstring)."""
        def accept_subs() -> None:
            assert self.mq_sock is not None
            while not self.stop.is_set():
                try:
                    sock, _ = self.mq_sock.accept()
                except OSError:
                    return
                conn = Conn(sock)
                hello = conn.recv()
                if not hello or hello.get("op") != "sub":
                    conn.close()
                    continue
                with self.cond:
                    peer = self.peers.get(int(hello["rank"]))
                    if peer is not None and peer.bcast is None:
                        peer.bcast = conn
                    self.cond.notify_all()

        def connect_resp(peer: _Peer) -> None:
            ip, port = peer.ready["response"]
            sock = _connect_forever((ip, int(port)), get_ip(), self.stop)
            if sock is None:
                return
            with self.cond:
                peer.resp = Conn(sock)
                self.cond.notify_all()

        threading.Thread(target=accept_subs, daemon=True, name="MQ-accept").start()
        for peer in self.peers.values():
            threading.Thread(target=connect_resp, args=(peer,), daemon=True,
                             name=f"MQ-connect-{peer.rank}").start()
        with self.cond:
            while not all(p.bcast is not None and p.resp is not None
                          for p in self.peers.values()):
                self.cond.wait(0.5)

    # -- the engine's calls

    def compile_or_warm_up_model(self, factors: dict[str, Any], compile_seconds: float) -> float:
        """Every rank compiles through its own node's cache, rank 0 keeps the longest
        (v1/executor/abstract.py:124-136). A collective_rpc without timeout: a dead rank hangs
        it, as a dead peer hangs the profile run's collectives."""
        for peer in self.peers.values():
            try:
                peer.bcast.send({"op": "compile", "seconds": compile_seconds})
            except OSError:
                pass
        own, _hit = compile_cache.compile(0, compile_cache.rank_factors(factors), compile_seconds)
        times = [own]
        for peer in self.peers.values():
            reply = peer.resp.recv()
            if reply is None:
                _forever(self.stop)
            times.append(float(reply.get("seconds", 0.0)))
        return max(times)

    def step(self) -> None:
        """One engine step: a round trip over every rank's queues, bounded by execute_model's
        timeout (module docstring). A rank that is gone or frozen is waited for to the end."""
        with self._step_lock:
            if self.is_failed:
                raise RuntimeError("Executor failed.")  # multiproc_executor.py:463-464
            self._seq += 1
            deadline = time.monotonic() + execute_model_timeout_s()
            for peer in self.peers.values():
                try:
                    peer.bcast.send({"op": "step", "seq": self._seq})
                except OSError:
                    pass  # a dead peer: the collective waits for it
            for peer in self.peers.values():
                try:
                    reply = peer.resp.recv(max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    reply = None
                if reply is None:
                    self.stop.wait(max(0.0, deadline - time.monotonic()))
                    if self.stop.is_set():
                        raise RuntimeError("Executor failed.")
                    self._fail()
                    raise RuntimeError("Executor failed.")

    def _fail(self) -> None:
        """execute_model's TimeoutError (multiproc_executor.py:506-509), the engine core's
        fatal error (server.py _exit_when_engine_dies logs it with this exception)."""
        try:
            try:
                raise TimeoutError
            except TimeoutError as e:
                raise TimeoutError("RPC call to execute_model timed out.") from e
        except TimeoutError as err:
            self.failure_error = err
        self.is_failed = True
        callback, self.failure_callback = self.failure_callback, None
        if callback is not None:
            threading.Thread(target=callback, daemon=True).start()

    def check_health(self) -> bool:
        return not self.is_failed

    def register_failure_callback(self, callback: Any) -> None:
        self.failure_callback = callback

    def shutdown(self, log: bool = True) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        self.stop.set()
        if log:  # the local worker only (the remote ranks are not told)
            _log_worker_shutdown(self.nat.legacy)
        for peer in self.peers.values():
            for conn in (peer.bcast, peer.resp):
                if conn is not None:
                    conn.close()
        if self.own_conn is not None:
            self.own_conn.close()
        if self.mq_sock is not None:
            self.mq_sock.close()
        if self.store is not None:
            self.store.close()


def serve_leader(args: argparse.Namespace, extra: list[str], nat: NativeArgs, model: str,
                 api_keys: list[str], v2: bool) -> int:
    """Rank 0 with the API server (also a rank > 0 without --headless: see below)."""
    from vllm_sim import server, weights
    from vllm_sim.ray_utils import ParallelConfig

    pc = ParallelConfig(args.tensor_parallel_size, args.pipeline_parallel_size)
    try:
        sock = server._bind_server_socket(args.host, args.port)
    except OSError as exc:
        logger.error("Cannot bind %s:%d: %s", args.host or "0.0.0.0", args.port, exc)
        return 1
    signal.signal(signal.SIGTERM, server._exit_on_sigterm)
    try:
        model = weights.resolve_model(model, args.revision)
        weights.check_config(model, args.revision)
        backend = check_engine_args(nat, pc.tensor_parallel_size, pc.pipeline_parallel_size)
    except NotSimulatedError as what:
        sock.close()
        return _refuse(what)
    except Exception:
        traceback.print_exc()
        sock.close()
        return 1
    served_name = (args.served_model_name or [model])[0]
    source = weights.ModelSource(model, args.revision, args.download_dir)
    load_s = float(os.environ.get("VLLM_SIM_LOAD_SECONDS", server.DEFAULT_LOAD_SECONDS))
    logger.info(
        "Initializing a V1 LLM engine with config: model=%r, tensor_parallel_size=%d, "
        "pipeline_parallel_size=%d, distributed_executor_backend=%s",
        model, pc.tensor_parallel_size, pc.pipeline_parallel_size, backend)
    if nat.node_rank > 0:
        # Not headless on a rank > 0: the engine's executor is a follower (no broadcast queue),
        # and the engine's first collective_rpc asserts (0.33.0 multiproc_executor.py:460-462).
        sock.close()
        return _follower_with_api_server(nat, pc.tensor_parallel_size, pc.pipeline_parallel_size,
                                         load_s, source, args, model, extra)
    try:
        executor = NativeExecutor(nat, pc.tensor_parallel_size, pc.pipeline_parallel_size,
                                  load_s, source)
    except WorkerFailedError as exc:
        _engine_failed_to_start(exc, nat.legacy)
        sock.close()
        return 1
    except BaseException:
        sock.close()
        raise
    try:
        server._init_engine(executor, compile_cache.engine_factors(args, model, extra))
    except BaseException:
        executor.shutdown(log=False)
        sock.close()
        raise
    return server._run_http(args, sock, model, served_name, api_keys, pc, executor.rank_ips,
                         executor, v2)


def _engine_failed_to_start(exc: Exception, legacy: bool) -> None:
    """EngineCore's "failed to start." (v1/engine/core.py:1582-1584) and the API server's
    uncaught RuntimeError (v1/engine/utils.py:1473-1481)."""
    try:
        raise exc
    except Exception as raised:
        _vlog(logging.ERROR, "engine_failed", legacy, "EngineCore failed to start.",
              exc_info=raised)
    try:
        raise RuntimeError("Engine core initialization failed. See root cause above. "
                           "Failed core proc(s): {'EngineCore': 1}") from None
    except RuntimeError as err:
        _print_uncaught(err)


# --- ranks > 0 ---------------------------------------------------------------------------------

class HeadlessRank:
    """A headless node's MultiprocExecutor (monitor_workers=False) and its one worker."""

    def __init__(self, nat: NativeArgs, tp: int, pp: int, load_s: float, source: ModelSource,
                 factors: dict[str, Any]) -> None:
        self.nat, self.tp, self.pp = nat, tp, pp
        self.world = tp * pp
        self.local_world = self.world // nat.nnodes
        self.rank = self.local_world * nat.node_rank  # global_start_rank + local rank 0
        self.load_s, self.source, self.factors = load_s, source, factors
        self.stop = threading.Event()
        self.conns: list[Conn] = []
        self.resp_listener: socket.socket | None = None

    def start(self) -> tuple[Conn, Conn]:
        """Up to the barrier; raises WorkerFailedError as the executor's init does."""
        nat = self.nat
        _vlog(logging.INFO, "dist_init", nat.legacy, "world_size=%d rank=%d local_rank=%d "
              "distributed_init_method=%s backend=%s", self.world, self.rank, 0, nat.init_method,
              "nccl")
        if self.local_world > 1:
            raise _raise_in_worker(_local_rank_error(nat.legacy), nat.legacy)
        timeout = join_timeout_s(nat.timeout_flag)
        tlog = TorchLog()
        try:
            sock = store_client_connect(nat.master_addr, nat.master_port, timeout, tlog,
                                        source_ip=get_ip())
        except DistNetworkError as exc:
            raise _raise_in_worker(exc, nat.legacy) from None
        store = Conn(sock)
        self.conns.append(store)
        try:
            store.send({"op": "join", "rank": self.rank, "node_rank": nat.node_rank,
                        "ip": get_ip(), "world_size": self.world})
            # the process group's creation waits for rank 0 (its NCCL/gloo setup after its
            # waitForWorkers): without a bound of its own here (read from source only)
            group = store.recv()
        except OSError:
            group = None
        if group is None:
            # the master went away before the group formed: the next store read fails
            # (TCPStore.cpp recvValue; read from source only, which read comes next)
            err = ("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
                   "server shutdown or crash?")
            from vllm_sim.c10d import socket_repr
            tlog.warning("TCPStore.cpp", 125, f"recvValue failed on {socket_repr(sock)}: {err}"
                         + raised_from("recvBytes at /pytorch/torch/csrc/distributed/c10d/"
                                       "Utils.hpp:682"))
            raise _raise_in_worker(DistNetworkError(err), nat.legacy) from None
        tlog.rank_prefix = f"[rank{self.rank}]:"
        log_rank_assignment(self.rank, self.world, self.tp, self.pp, nat.legacy,
                            nat.old_checks)
        threading.Thread(target=heartbeat, args=(store, tlog, self.rank, torch_minor() < (2, 14),
                                                 self.stop), daemon=True,
                         name="pt_nccl_heartbt").start()
        try:
            loaded, seconds = _load(self.source, self.rank, self.load_s)
        except Exception as exc:  # noqa: BLE001 - the worker's failure
            raise _worker_failed(exc, nat.legacy) from None
        _log_loaded(self.rank, loaded, seconds)
        self.resp_listener = _listen_any()
        store.send({"op": "ready", "response": [get_ip(), self.resp_listener.getsockname()[1]],
                    "loaded": dataclasses.asdict(loaded) if loaded is not None else None,
                    "report": _own_report(self.rank, nat.node_rank)})
        mq_ip, mq_port = group["mq"]
        bsock = _connect_forever((mq_ip, int(mq_port)), get_ip(), self.stop)
        assert bsock is not None
        bcast = Conn(bsock)
        self.conns.append(bcast)
        bcast.send({"op": "sub", "rank": self.rank})
        rsock, _ = self.resp_listener.accept()
        resp = Conn(rsock)
        self.conns.append(resp)
        return bcast, resp

    def busy_loop(self, bcast: Conn, resp: Conn) -> None:
        """worker_busy_loop (0.33.0 multiproc_executor.py:1154-1161): forever, also when rank 0
        is gone (the queue's dequeue waits indefinitely)."""
        while True:
            msg = bcast.recv()
            if msg is None:
                _forever(self.stop)
            op = msg.get("op")
            try:
                if op == "step":
                    resp.send({"op": "stepped", "seq": msg.get("seq")})
                elif op == "compile":
                    seconds, _hit = compile_cache.compile(
                        self.rank, compile_cache.rank_factors(self.factors), float(msg["seconds"]))
                    resp.send({"op": "compiled", "seconds": seconds})
            except OSError:
                _forever(self.stop)

    def close(self) -> None:
        self.stop.set()
        for conn in self.conns:
            conn.close()
        if self.resp_listener is not None:
            self.resp_listener.close()


def _follower_with_api_server(nat: NativeArgs, tp: int, pp: int, load_s: float,
                              source: ModelSource, args: argparse.Namespace, model: str,
                              extra: list[str]) -> int:
    rank = HeadlessRank(nat, tp, pp, load_s, source,
                        compile_cache.engine_factors(args, model, extra))
    try:
        rank.start()
    except WorkerFailedError as exc:
        _engine_failed_to_start(exc, nat.legacy)
        rank.close()
        return 1
    _engine_failed_to_start(
        AssertionError("collective_rpc should not be called on follower node"), nat.legacy)
    rank.close()
    return 1


def serve_headless(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser,
                   nat: NativeArgs) -> int:
    """`vllm serve ... --headless` (0.33.0 entrypoints/cli/serve.py:69-77, 181-233)."""
    from vllm_sim import weights

    model = args.model_tag or args.model
    if not model:
        parser.error("a model is required: vllm serve MODEL")
    if nat.api_server_count is not None and nat.api_server_count > 0:
        _print_uncaught(ValueError(
            f"--api-server-count={nat.api_server_count} cannot be used with --headless (no API "
            "servers are started in headless mode)."))
        return 1

    requested_shutdown = False

    def on_signal(signum: int, _frame: Any) -> None:  # serve.py:205-216
        nonlocal requested_shutdown
        logger.debug("Received %d signal.", signum)
        if not requested_shutdown:
            requested_shutdown = True
            raise SystemExit

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rank: HeadlessRank | None = None
    try:
        try:
            model = weights.resolve_model(model, args.revision)
            weights.check_config(model, args.revision)
            check_engine_args(nat, args.tensor_parallel_size, args.pipeline_parallel_size)
        except NotSimulatedError as what:
            return _refuse(what)
        except Exception:
            traceback.print_exc()
            return 1
        if nat.node_rank == 0 or nat.nnodes <= 1:  # node_rank_within_dp == 0
            _vlog(logging.INFO, "headless_dp", nat.legacy, "Launching %d data parallel engine(s) "
                  "in headless mode, with head node address %s.", 1,
                  f"tcp://{nat.master_addr}:{DEFAULT_DP_RPC_PORT}")
            return _refuse(NotSimulatedError("--headless on node rank 0 (vLLM's headless data-"
                                        "parallel engines)"))
        _vlog(logging.INFO, "headless", nat.legacy, "Launching vLLM (v%s) headless multiproc "
              "executor, with head node address %s for torch.distributed process group.",
              simulated_version(), nat.head_address)
        source = weights.ModelSource(model, args.revision, args.download_dir)
        from vllm_sim import server

        load_s = float(os.environ.get("VLLM_SIM_LOAD_SECONDS", server.DEFAULT_LOAD_SECONDS))
        rank = HeadlessRank(nat, args.tensor_parallel_size, args.pipeline_parallel_size, load_s,
                            source, compile_cache.engine_factors(args, model, extra))
        try:
            bcast, resp = rank.start()
        except WorkerFailedError as exc:
            _print_uncaught(exc)
            return 1
        rank.busy_loop(bcast, resp)
        return 0
    except SystemExit:
        _log_worker_shutdown(nat.legacy)  # then SystemExit() -> exit 0
        return 0
    finally:
        if rank is not None:
            rank.close()

