"""One Ray actor per rank, placed like vLLM's RayDistributedExecutor._init_workers_ray.

Each actor takes `num_gpus=1, num_cpus=0` from its bundle and reports what vLLM's worker
would: its IP by get_ip() *in the worker's own process* (VLLM_HOST_IP is worker-specific and
is NOT copied from the driver, so it comes from the environment `ray start` had on that node),
plus Ray's node address, node id and hostname. Ranks are re-ordered as vLLM does (driver's
node first) and vLLM's "Every node should have a unique IP address" rule is enforced.
"""

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from vllm_sim import compile_cache
from vllm_sim.logger import init_logger
from vllm_sim.network_utils import get_ip

logger = init_logger(__name__)

# Liveness probe of the rank actors, as used by /health: bounded and cached so that a health
# poller cannot pile up Ray calls.
PING_TIMEOUT_S = 5.0
HEALTH_CACHE_S = 3.0


class RaySimWorker:
    """Stands in for vLLM's RayWorkerWrapper; holds its GPU bundle while the server runs."""

    def __init__(self, rpc_rank: int) -> None:
        self.rpc_rank = rpc_rank

    def describe(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "created_rank": self.rpc_rank,
            "ip": get_ip(),
            "ray_node_ip": ray.util.get_node_ip_address(),
            "node_id": ctx.get_node_id(),
            "hostname": socket.gethostname(),
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "pid": os.getpid(),
        }

    def ping(self) -> bool:
        return True

    def compile_or_warm_up_model(
        self, rank: int, factors: dict[str, Any], compile_seconds: float
    ) -> float:
        """The rank's torch.compile (the engine's profile run), through the node's
        VLLM_CACHE_ROOT (compile_cache.py). `rank`: the rank after vLLM's re-ordering, which
        names the cache dir (rank_<rank>_0). Returns its seconds."""
        seconds, _hit = compile_cache.compile(
            rank, compile_cache.rank_factors(factors), compile_seconds
        )
        return seconds


@dataclass
class RankInfo:
    rank: int
    ip: str  # the worker's get_ip(): what vLLM would use for NCCL/gloo
    ray_node_ip: str  # Ray's NodeManagerAddress of the node the actor landed on
    node_id: str
    hostname: str
    gpu_ids: list[str]
    pid: int  # the actor's process on its node (a test kills it to play "node lost")


class SimExecutor:
    def __init__(self, workers: list[Any], ranks: list[RankInfo]) -> None:
        self.workers = workers
        self.ranks = ranks
        self._lock = threading.Lock()
        self._checked_at = 0.0
        self._alive = True
        self._reported_dead = False

    def compile_or_warm_up_model(self, factors: dict[str, Any], compile_seconds: float) -> float:
        """Every rank compiles (or loads its cache); the engine keeps the largest time
        (vllm/v1/executor/abstract.py:124-136)."""
        return max(ray.get([w.compile_or_warm_up_model.remote(rank, factors, compile_seconds)
                            for rank, w in enumerate(self.workers)]), default=0.0)

    def check_health(self) -> bool:
        """True while every rank actor answers; cached for HEALTH_CACHE_S."""
        if not self.workers:
            return True
        if not self._lock.acquire(blocking=False):
            return self._alive  # a check is already running: report the last answer
        try:
            if time.monotonic() - self._checked_at < HEALTH_CACHE_S:
                return self._alive
            try:
                ray.get([w.ping.remote() for w in self.workers], timeout=PING_TIMEOUT_S)
                self._alive = True
            except Exception as exc:  # RayActorError, GetTimeoutError, lost GCS ...
                self._alive = False
                if not self._reported_dead:
                    self._reported_dead = True
                    logger.error(
                        "EngineCore encountered a fatal error (simulated): a Ray worker "
                        "did not answer within %.0f s: %s: %s",
                        PING_TIMEOUT_S,
                        type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "",
                    )
            self._checked_at = time.monotonic()
            return self._alive
        finally:
            self._lock.release()


def init_workers_ray(placement_group: PlacementGroup, world_size: int) -> SimExecutor:
    bundle_indices = [
        i for i, bundle in enumerate(placement_group.bundle_specs) if bundle.get("GPU", 0)
    ][:world_size]

    remote_cls = ray.remote(RaySimWorker)
    workers = []
    driver_ip = get_ip()
    for rank, bundle_id in enumerate(bundle_indices):
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=placement_group,
            placement_group_capture_child_tasks=True,
            placement_group_bundle_index=bundle_id,
        )
        worker = remote_cls.options(num_cpus=0, num_gpus=1, scheduling_strategy=strategy).remote(
            rpc_rank=rank
        )
        workers.append(worker)

    infos: list[dict[str, Any]] = ray.get([w.describe.remote() for w in workers])  # type: ignore[attr-defined]
    ip_counts: dict[str, int] = {}
    for info in infos:
        ip_counts[info["ip"]] = ip_counts.get(info["ip"], 0) + 1

    # vLLM's order: workers on the driver's node first, then nodes with fewer workers, then IP.
    order = sorted(
        range(len(infos)),
        key=lambda i: (
            0 if infos[i]["ip"] == driver_ip else 1,
            ip_counts[infos[i]["ip"]],
            infos[i]["ip"],
        ),
    )
    sorted_workers = [workers[i] for i in order]
    ranks = [
        RankInfo(
            rank=rank,
            ip=infos[i]["ip"],
            ray_node_ip=infos[i]["ray_node_ip"],
            node_id=infos[i]["node_id"],
            hostname=infos[i]["hostname"],
            gpu_ids=infos[i]["gpu_ids"],
            pid=infos[i]["pid"],
        )
        for rank, i in enumerate(order)
    ]
    for r in ranks:
        logger.info(
            "rank %d -> node %s (hostname=%s, node_id=%s, worker get_ip()=%s, GPU ids=%s, pid=%d)",
            r.rank,
            r.ray_node_ip,
            r.hostname,
            r.node_id[:12],
            r.ip,
            ",".join(r.gpu_ids) or "-",
            r.pid,
        )

    node_ids = list(dict.fromkeys(r.node_id for r in ranks))
    all_ips = set([r.ip for r in ranks] + [driver_ip])
    n_ips = len(all_ips)
    n_nodes = len(node_ids)
    if n_nodes != n_ips:
        raise RuntimeError(
            f"Every node should have a unique IP address. Got {n_nodes}"
            f" nodes with node ids {node_ids} and "
            f"{n_ips} unique IP addresses {all_ips}. Please check your"
            " network configuration. If you set `VLLM_HOST_IP`"
            " environment variable, make sure it is unique for"
            " each node."
        )
    return SimExecutor(sorted_workers, ranks)
