"""V2 mode: vLLM 0.33.0's RayExecutorV2 (vllm/v1/executor/ray_executor_v2.py), simulated.

The steps of RayExecutorV2._init_executor (:284-485), in order:
1. initialize_ray_cluster (placement group, no pin)            -> ray_utils.initialize_ray_cluster_v2
2. bundles sorted driver-node-first, Ray node ids/IPs (:306-327) -> ray_utils.get_bundles_sorted_by_node
3. broadcast MessageQueue: n_local = ranks on the driver's Ray node use /dev/shm + an ipc://
   socket under the DRIVER's VLLM_RPC_BASE_PATH; the rest TCP on the driver's Ray node IP
   (:329-339)
4. one actor per bundle: num_cpus=0, num_gpus=1, PG bundle, runtime_env with
   RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 (:341-408; vllm/platforms/cuda.py:234-236);
   the driver's env is collected for carry-over (:347-350, ray_env.py)
5. GPU ids per actor (:410-427); 6. rank 0's dist-init address (Ray's node IP, :130-142), then
   initialize_worker on every rank: driver env applied with setdefault (:173-177), weights
   loaded, the rank's response queue created - ipc:// under the RANK's VLLM_RPC_BASE_PATH if it
   is on the driver's node, else TCP (:193-212); 7. the response handles (:458-469)
8. run() on every rank (:471-474); 9. the wait_until_ready barrier (:476-479): blocks without
   bound or log if a local rank and the driver cannot see each other's ipc path.
Then the engine's profile run: each rank's torch.compile, through its compile cache
(compile_or_warm_up_model, compile_cache.py), the largest time over the ranks returned.
Then a monitor thread ray.wait()s on the run() refs every 5 s (:487-537); a finished ref
means a dead rank: "RayWorkerProc rank=[r] died unexpectedly, shutting down executor.", the
actors are killed, the failure callback fires.
"""

import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from vllm_sim import compile_cache, plugins
from vllm_sim.logger import configure_logging, init_logger
from vllm_sim.ray_env import WORKER_SPECIFIC_ENV_VARS, env_report, get_driver_env_vars
from vllm_sim.ray_executor import RankInfo
from vllm_sim.ray_utils import ParallelConfig, get_bundles_sorted_by_node, initialize_ray_cluster_v2
from vllm_sim.shm_broadcast import Handle, MessageQueue
from vllm_sim.weights import Loaded, ModelSource, load_weights

logger = init_logger(__name__)

READY_STR = "READY"
MONITOR_POLL_S = 5.0  # ray_executor_v2.py:508
# vllm/platforms/cuda.py:234-236, applied by _build_runtime_env (ray_executor_v2.py:264-265)
NOSET_DEVICE_ENV = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


class RayWorkerProc:
    """Stands in for vLLM's RayWorkerProc actor (ray_executor_v2.py:79-236)."""

    def __init__(self, rank: int, input_handle: Handle, is_driver_node: bool) -> None:
        configure_logging()  # vLLM's workers log in the same shape; Ray forwards the lines
        # The rank process's own environment: what the node's `ray start` had (plus Ray's).
        self.own_env = dict(os.environ)
        self.rank = rank
        self.input_handle = input_handle
        self.is_driver_node = is_driver_node
        self.rpc_broadcast_mq: MessageQueue | None = None
        self.worker_response_mq: MessageQueue | None = None
        self._dist_store: socket.socket | None = None

    def get_node_and_physical_gpu_ids(self) -> tuple[str, list[int]]:
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), [int(g) for g in ctx.get_accelerator_ids().get("GPU", [])]

    def create_dist_init_method(self) -> str:
        # :130-142: a TCPStore on Ray's node IP, port 0, kept open. (The simulator binds and
        # holds the port; the ranks do not rendezvous on it.)
        host = ray.util.get_node_ip_address()
        store = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        store.bind((host, 0))
        store.listen()
        self._dist_store = store
        return f"tcp://{host}:{store.getsockname()[1]}"

    def initialize_worker(
        self,
        local_rank: int,
        env_vars: dict[str, str],
        distributed_init_method: str,
        driver_env_vars: dict[str, str] | None,
        load_seconds: float,
        source: ModelSource,
    ) -> Loaded | None:
        for key, value in (driver_env_vars or {}).items():
            os.environ.setdefault(key, value)  # :173-175: never overwrites node-local values
        for key, value in env_vars.items():
            os.environ[key] = value
        # then WorkerWrapperBase.init_worker: vLLM's general plugins, loaded in the env the
        # rank now has (plugins.py)
        plugins.load_general_plugins()
        self.local_rank = local_rank
        self.distributed_init_method = distributed_init_method
        # :186-190 -> WorkerProc.__init__: each rank loads the weights from its own node's disk
        # (the shard bar on rank 0 only, weight_utils.py:845-848).
        where = f"rank {self.rank} on {ray.util.get_node_ip_address()} ({socket.gethostname()})"
        # vLLM 0.26.0 v1/worker/gpu_model_runner.py load_model's first line, in each rank
        logger.info("Starting to load model %s...", source.model)
        loaded = load_weights(source, progress=self.rank == 0, where=where,
                              pretend_s=load_seconds)
        if loaded is None:  # not cached: the pretend load still takes its time
            time.sleep(load_seconds)
        _memory_monitor(self.own_env)  # the weights are in: the node's memory is full
        # :193-212
        self.rpc_broadcast_mq = MessageQueue.create_from_handle(self.input_handle, self.rank)
        self.worker_response_mq = MessageQueue(
            n_reader=1,
            n_local_reader=1 if self.is_driver_node else 0,
            connect_ip=ray.util.get_node_ip_address(),
        )
        return loaded

    def wait_for_init(self) -> dict[str, Any]:
        assert self.worker_response_mq is not None
        ctx = ray.get_runtime_context()
        return {
            "status": READY_STR,
            "handle": self.worker_response_mq.export_handle(),
            # Simulator-only: who this rank is and the env it ended up with.
            "node_id": ctx.get_node_id(),
            "ray_node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "env": env_report(self.own_env, dict(os.environ)),
        }

    def compile_or_warm_up_model(self, factors: dict[str, Any], compile_seconds: float) -> float:
        """The rank's torch.compile, when vLLM's Worker does it: after the barrier, in the
        engine's profile run (vllm/v1/worker/gpu_worker.py determine_available_memory; the
        time returned by compile_or_warm_up_model). Loaded from the node's VLLM_CACHE_ROOT,
        else compiled and stored there (compile_cache.py). Returns its seconds."""
        seconds, _hit = compile_cache.compile(
            self.rank, compile_cache.rank_factors(factors), compile_seconds
        )
        return seconds

    def step(self) -> bool:
        """Simulator-only: one engine step needs every rank. A rank that is frozen (SIGSTOP)
        never answers, so nothing is generated, as real vLLM 0.26.0 did
        (tests/fixtures/real-vllm: no token for 30 s, generation_tokens_total still)."""
        return True

    def run(self) -> None:
        """:223-236: both barriers, then the busy loop until the driver goes away."""
        assert self.rpc_broadcast_mq is not None and self.worker_response_mq is not None
        self.rpc_broadcast_mq.wait_until_ready()
        self.worker_response_mq.wait_until_ready()
        if self.rpc_broadcast_mq.is_local_reader and not self.rpc_broadcast_mq.shm_attached:
            # vLLM swallows the failed attach (shm_broadcast.py:373-377) and fails on the first
            # read of the ring buffer, right after the barrier.
            raise AttributeError("'ShmRingBuffer' object has no attribute 'shared_memory'")
        self.rpc_broadcast_mq.wait_closed()


def _actor_name(instance_id: str, rank: int, pc: ParallelConfig) -> str:
    # vllm/v1/executor/ray_utils.py:94-109
    name = f"vllm_Worker_{instance_id}"
    if pc.tensor_parallel_size > 1:
        name += f"_TP{rank % pc.tensor_parallel_size}"
    if pc.pipeline_parallel_size > 1:
        name += f"_PP{(rank // pc.tensor_parallel_size) % pc.pipeline_parallel_size}"
    return name


def _log_loaded(loaded: list[Loaded | None]) -> None:
    checked = [(r, w) for r, w in enumerate(loaded) if w is not None]
    if checked:
        logger.info(
            "Weights checked on rank(s) %s: %s (simulated: headers and sizes only)",
            [r for r, _ in checked],
            "; ".join(dict.fromkeys(
                f"{w.files} files, {w.tensors} tensors, {w.bytes / 1024**3:.2f} GiB"
                for _, w in checked)),
        )
    absent = [r for r, w in enumerate(loaded) if w is None]
    if absent:
        logger.info("Weights not cached on rank(s) %s: a real vLLM would have downloaded them.",
                    absent)


class RayExecutorV2Sim:
    def __init__(self, pc: ParallelConfig, load_seconds: float, source: ModelSource) -> None:
        self.pc = pc
        self.is_failed = False
        self.shutting_down = False
        self.failure_callback: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self.ranks: list[RankInfo] = []
        self.rank_reports: list[dict[str, Any]] = []
        self.handles: list[Any] = []
        self.rpc_broadcast_mq: MessageQueue | None = None
        self.response_mqs: list[MessageQueue] = []
        try:
            self._init_executor(load_seconds, source)
        except BaseException:  # incl. SIGTERM (SystemExit) while blocked in the barrier
            self.shutdown()
            raise

    def _init_executor(self, load_seconds: float, source: ModelSource) -> None:
        pc = self.pc
        placement_group = initialize_ray_cluster_v2(pc)
        assignments = get_bundles_sorted_by_node(placement_group)
        driver_node = ray.get_runtime_context().get_node_id()
        driver_ip = ray.util.get_node_ip_address()

        n_local = sum(1 for _, node_id, _ in assignments if node_id == driver_node)
        self.rpc_broadcast_mq = MessageQueue(pc.world_size, n_local, connect_ip=driver_ip)
        handle = self.rpc_broadcast_mq.export_handle()
        logger.info(
            "Driver on Ray node %s (%s): %d rank(s) on this node over /dev/shm + %s, %d over %s",
            driver_node[:12],
            driver_ip,
            n_local,
            handle.local_subscribe_addr or "-",
            pc.world_size - n_local,
            handle.remote_subscribe_addr or "-",
        )

        driver_env_vars = get_driver_env_vars(WORKER_SPECIFIC_ENV_VARS)
        # two threads: run() holds one for the actor's life, step() takes the other
        remote_cls = ray.remote(max_concurrency=2)(RayWorkerProc)
        instance_id = uuid.uuid4().hex[:5]
        for rank, (bundle_idx, node_id, _ip) in enumerate(assignments):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=bundle_idx
            )
            actor = remote_cls.options(
                name=_actor_name(instance_id, rank, pc),
                num_cpus=0,
                num_gpus=1,
                scheduling_strategy=strategy,
                runtime_env={"env_vars": dict(NOSET_DEVICE_ENV)},
            ).remote(rank, handle, node_id == driver_node)
            self.handles.append(actor)

        node_and_gpus = ray.get([a.get_node_and_physical_gpu_ids.remote() for a in self.handles])
        node_workers: dict[str, list[int]] = defaultdict(list)
        for i, (node_id, _) in enumerate(node_and_gpus):
            node_workers[node_id].append(i)
        init_method = ray.get(self.handles[0].create_dist_init_method.remote())

        logger.info("Loading weights (simulated) on %d rank(s)... %s", len(self.handles),
                    source.model)
        t0 = time.time()
        loaded: list[Loaded | None] = ray.get(
            [
                a.initialize_worker.remote(
                    node_workers[node_and_gpus[i][0]].index(i),
                    {},
                    init_method,
                    driver_env_vars,
                    load_seconds,
                    source,
                )
                for i, a in enumerate(self.handles)
            ]
        )
        _log_loaded(loaded)
        logger.info(
            "Model loading took 0.0000 GiB and %.2f seconds (simulated)", time.time() - t0
        )

        results = ray.get([a.wait_for_init.remote() for a in self.handles])
        for i, result in enumerate(results):
            if result["status"] != READY_STR:
                raise RuntimeError(f"Worker {i} failed to initialize: {result}")
            self.response_mqs.append(MessageQueue.create_from_handle(result["handle"], 0))
            self.ranks.append(
                RankInfo(
                    rank=i,
                    ip=result["ray_node_ip"],
                    ray_node_ip=result["ray_node_ip"],
                    node_id=result["node_id"],
                    hostname=result["hostname"],
                    gpu_ids=result["gpu_ids"],
                    pid=result["pid"],
                )
            )
            self.rank_reports.append(
                {
                    "rank": i,
                    "node_ip": result["ray_node_ip"],
                    "node_id": result["node_id"],
                    "driver_node": result["node_id"] == driver_node,
                    "pid": result["pid"],
                    "env": result["env"],
                }
            )
        for r in self.ranks:
            logger.info(
                "rank %d -> node %s (hostname=%s, node_id=%s, GPU ids=%s, pid=%d)",
                r.rank,
                r.ray_node_ip,
                r.hostname,
                r.node_id[:12],
                ",".join(r.gpu_ids) or "-",
                r.pid,
            )

        self.run_refs = [a.run.remote() for a in self.handles]
        # Step 9: no bound, no log - as vLLM.
        self.rpc_broadcast_mq.wait_until_ready()
        for mq in self.response_mqs:
            mq.wait_until_ready()
        self._start_worker_monitor()

    def compile_or_warm_up_model(self, factors: dict[str, Any], compile_seconds: float) -> float:
        """Every rank compiles (or loads its cache); the engine keeps the largest time
        (vllm/v1/executor/abstract.py:124-136). The ranks' second thread runs it (run() holds
        the first), as step() does."""
        return max(ray.get([a.compile_or_warm_up_model.remote(factors, compile_seconds)
                            for a in self.handles]), default=0.0)

    def register_failure_callback(self, callback: Callable[[], None]) -> None:
        self.failure_callback = callback

    def _start_worker_monitor(self) -> None:
        ref_to_rank = {ref: rank for rank, ref in enumerate(self.run_refs)}

        def monitor() -> None:
            while not self.shutting_down and ray.is_initialized():
                try:
                    done, _ = ray.wait(self.run_refs, num_returns=1, timeout=MONITOR_POLL_S)
                except Exception:
                    logger.exception("RayWorkerMonitor: unexpected error, exiting monitor thread")
                    return
                if not done or self.shutting_down:
                    continue
                self.is_failed = True
                logger.error(
                    "RayWorkerProc rank=%s died unexpectedly, shutting down executor.",
                    [ref_to_rank[r] for r in done],
                )
                self.shutdown()
                if self.failure_callback is not None:
                    callback, self.failure_callback = self.failure_callback, None
                    callback()
                return

        self._monitor_thread = threading.Thread(target=monitor, daemon=True, name="RayWorkerMonitor")
        self._monitor_thread.start()

    def check_health(self) -> bool:
        return not self.is_failed

    def step(self) -> None:
        """One engine step: every rank answers (blocks while one is frozen, as vLLM's step
        does; a dead rank is the monitor's to report)."""
        ray.get([a.step.remote() for a in self.handles])

    def shutdown(self) -> None:
        """:556-582: kill the actors, shut the queues. A killed actor cleans nothing up, so
        the driver also removes the ranks' sockets and segments it can see (the simulator's
        own tidiness: vLLM leaves them)."""
        with self._lock:
            if self.shutting_down:
                return
            self.shutting_down = True
        for actor in self.handles:
            try:
                ray.kill(actor)
            except Exception:
                logger.exception("Failed to kill actor")
        # :539-554: the monitor must be out of ray.wait before Ray is torn down. (vLLM joins
        # before killing; killed actors end the monitor's wait at once, so join after.)
        monitor = getattr(self, "_monitor_thread", None)
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(timeout=10)
        if self.rpc_broadcast_mq is not None:
            self.rpc_broadcast_mq.close()
        for mq in self.response_mqs:
            mq.close()
            mq.remove_writer_files()


def _memory_monitor(raylet_env: dict[str, str]) -> None:
    """Ray's memory monitor on this rank's node, played where the load fills the node's
    memory: VLLM_SIM_NODE_MEMORY_USAGE (simulator-only) is the share of the node's memory in
    use once the weights are in (on a GB10 the GPU's allocations are node memory). Above
    RAY_memory_usage_threshold (0.95) with RAY_memory_monitor_refresh_ms not 0 (Ray 2.56.1's
    defaults, src/ray/common/ray_config_def.h; 250 ms: on), the raylet kills the worker, as
    here: its message (the raylet's text), then SIGKILL. The monitor is the raylet's: its
    settings are read from the env the rank process started with (its node's `ray start`),
    never from the driver's env that vLLM copies in."""
    usage = os.environ.get("VLLM_SIM_NODE_MEMORY_USAGE")
    if not usage or raylet_env.get("RAY_memory_monitor_refresh_ms", "250").strip() == "0":
        return
    threshold = float(raylet_env.get("RAY_memory_usage_threshold", "0.95"))
    if float(usage) <= threshold:
        return
    print(f"(raylet) 1 worker(s) were killed due to the node running low on memory. Memory on "
          f"the node (IP: {ray.util.get_node_ip_address()}) was {float(usage):.2f} of its total, "
          f"which exceeds the memory usage threshold of {threshold}. To disable worker killing, "
          "set the environment variable `RAY_memory_monitor_refresh_ms` to zero. (simulated: "
          "VLLM_SIM_NODE_MEMORY_USAGE)", file=sys.stderr, flush=True)
    # Ray's log monitor forwards the line to the driver before the death reaches it (the
    # raylet's own report arrives first on a real node too)
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
