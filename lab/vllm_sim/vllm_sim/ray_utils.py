"""vLLM's Ray executor cluster set-up (vllm/v1/executor/ray_utils.py), simulated, per mode.

Legacy mode (vLLM 0.17.1, initialize_ray_cluster below):

Same resource request, same waits, same text: one bundle {"GPU": 1.0} per rank, strategy PACK,
the first bundle pinned to `node:<get_ip()>` so that rank 0 lands where the API server runs.
When the pin names an address Ray registered no node under (the seed incident: VLLM_HOST_IP =
RoCE IP, Ray head on the external IP), the group stays PENDING and this waits, logging, exactly
as vLLM does.

V2 mode (vLLM 0.33.0, initialize_ray_cluster_v2 below; vllm/v1/executor/ray_utils.py:266-384):
the same bundles WITHOUT the pin and without the driver-GPU check; the same wait and text
(:201-263); _verify_bundles only warns about TP across nodes (:55-91); ranks are ordered by
get_bundles_sorted_by_node (:141-198): driver's node first, then by Ray node id.
"""

import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass

import ray
from ray._private.state import available_resources_per_node
from ray.util import placement_group_table
from ray.util.placement_group import PlacementGroup

from vllm_sim.logger import init_logger
from vllm_sim.network_utils import get_ip

logger = init_logger(__name__)

# vLLM's constant. VLLM_SIM_PG_WAIT_TIMEOUT shortens it for tests; vLLM has no such knob.
PG_WAIT_TIMEOUT = 1800
DEVICE_STR = "GPU"
# A simulated node exposes one GPU, as a DGX Spark does (GB10).
LOCAL_GPUS = 1


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int
    pipeline_parallel_size: int

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


def pg_wait_timeout_s() -> float:
    raw = os.environ.get("VLLM_SIM_PG_WAIT_TIMEOUT")
    return float(raw) if raw else float(PG_WAIT_TIMEOUT)


def connect_ray() -> None:
    """Join the running cluster. RAY_ADDRESS wins; else the local `ray start` session.

    vLLM calls ray.init(address=None), which starts a private single-node Ray when none is
    found; a simulated node has no GPU to give such an instance, so "auto" fails loudly instead.
    """
    address = os.environ.get("RAY_ADDRESS") or "auto"
    ray.init(address=address, logging_level=logging.WARNING)


def initialize_ray_cluster(parallel_config: ParallelConfig) -> PlacementGroup:
    if parallel_config.world_size > 1 and parallel_config.world_size > LOCAL_GPUS:
        logger.warning(
            "Total GPU requirement (world_size=%d) exceeds locally "
            "visible GPUs (%d). For multi-node Ray clusters, this may be "
            "expected if the total cluster has enough GPUs. "
            "If running single-node, consider reducing "
            "tensor_parallel_size (%d) or pipeline_parallel_size (%d).",
            parallel_config.world_size,
            LOCAL_GPUS,
            parallel_config.tensor_parallel_size,
            parallel_config.pipeline_parallel_size,
        )

    _connect_and_count_devices(parallel_config)
    placement_group_specs: list[dict[str, float]] = [
        {DEVICE_STR: 1.0} for _ in range(parallel_config.world_size)
    ]

    # The driver's node is Ray's idea of it (runtime context), while the pin below is vLLM's
    # get_ip(): the two disagreeing is precisely the incident.
    current_ip = get_ip()
    current_node_id = ray.get_runtime_context().get_node_id()
    current_node_resource = available_resources_per_node().get(current_node_id, {})
    if current_node_resource.get(DEVICE_STR, 0) < 1:
        raise ValueError(
            f"Current node has no {DEVICE_STR} available. "
            f"{current_node_resource=}. vLLM engine cannot start without "
            f"{DEVICE_STR}. Make sure you have at least 1 {DEVICE_STR} "
            f"available in a node {current_node_id=} {current_ip=}."
        )
    placement_group_specs[0][f"node:{current_ip}"] = 0.001

    current_placement_group = ray.util.placement_group(placement_group_specs, strategy="PACK")
    _wait_until_pg_ready(current_placement_group)
    _verify_bundles(current_placement_group, parallel_config)
    return current_placement_group


def _wait_until_pg_ready(current_placement_group: PlacementGroup) -> None:
    """vLLM's wait: log at ~10, 30, 70, 150 ... s, then fail with vLLM's ValueError.

    One deviation: vLLM's last ray.wait can overshoot PG_WAIT_TIMEOUT (its 1800 s is in practice
    ~2550 s: 10+20+...+1280); here the last wait is cut at the timeout, so the bound is real.
    """
    timeout_s = pg_wait_timeout_s()
    placement_group_specs = current_placement_group.bundle_specs

    s = time.time()
    pg_ready_ref = current_placement_group.ready()
    wait_interval = 10
    while time.time() - s < timeout_s:
        ready = _wait_ready(pg_ready_ref, min(time.time() + wait_interval, s + timeout_s))
        if ready:
            break

        # Exponential backoff for warning print.
        wait_interval *= 2
        logger.info(
            "Waiting for creating a placement group of specs for "
            "%d seconds. specs=%s. Check `ray status` and "
            "`ray list nodes` to see if you have enough resources,"
            " and make sure the IP addresses used by ray cluster"
            " are the same as VLLM_HOST_IP environment variable"
            " specified in each node if you are running on a multi-node.",
            int(time.time() - s),
            placement_group_specs,
        )

    try:
        ray.get(pg_ready_ref, timeout=0)
    except ray.exceptions.GetTimeoutError:
        shown_timeout = int(timeout_s) if timeout_s == int(timeout_s) else timeout_s
        total_gpu_required = sum(spec.get("GPU", 0) for spec in placement_group_specs)
        if total_gpu_required > 1:
            raise ValueError(
                f"Cannot provide a placement group requiring "
                f"{total_gpu_required} GPUs "
                f"(placement_group_specs={placement_group_specs}) within "
                f"{shown_timeout} seconds.\n"
                f"Tensor parallel size may exceed available GPUs in your "
                f"cluster. Check resources with `ray status` and "
                f"`ray list nodes`.\n"
                f"If running on K8s with limited GPUs, consider reducing "
                f"--tensor-parallel-size to match available GPU resources."
            ) from None
        raise ValueError(
            "Cannot provide a placement group of "
            f"{placement_group_specs=} within "
            f"{shown_timeout} seconds. See "
            "`ray status` and `ray list nodes` to make sure the cluster "
            "has enough resources."
        ) from None


def _wait_ready(ref: ray.ObjectRef, until: float) -> bool:
    """ray.wait until `until` (epoch s); ray.wait may return early on short timeouts."""
    while True:
        remaining = until - time.time()
        if remaining <= 0:
            return False
        ready, _ = ray.wait([ref], timeout=remaining)
        if ready:
            return True


def _verify_bundles(placement_group: PlacementGroup, parallel_config: ParallelConfig) -> None:
    """vLLM's two rules: the driver's node must hold a bundle; warn if TP spans nodes."""
    pg_data = placement_group_table(placement_group)
    bundle_to_node_ids = pg_data["bundles_to_node_id"]
    bundles = pg_data["bundles"]
    node_id_to_bundle: dict[str, list[dict[str, float]]] = defaultdict(list)
    for bundle_idx, node_id in bundle_to_node_ids.items():
        node_id_to_bundle[node_id].append(bundles[bundle_idx])
    driver_node_id = ray.get_runtime_context().get_node_id()

    if driver_node_id not in node_id_to_bundle:
        raise RuntimeError(
            f"driver node id {driver_node_id} is not included in a placement "
            f"group {placement_group.id}. Node id -> bundles "
            f"{node_id_to_bundle}. "
            "You don't have enough GPUs available in a current node. Check "
            "`ray status` and `ray list nodes` to see if you have available "
            "GPUs in a node `{driver_node_id}` before starting an vLLM engine."
        )

    _warn_tp_spread(node_id_to_bundle, parallel_config)


def initialize_ray_cluster_v2(parallel_config: ParallelConfig) -> PlacementGroup:
    """vllm/v1/executor/ray_utils.py:266-384 (0.33.0)."""
    # :286-287
    if os.environ.get("RAY_USAGE_STATS_ENABLED", "0") != "1":
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # :290-302; device_count() is the node's GPUs: one on a Spark.
    if parallel_config.world_size > 1 and parallel_config.world_size > LOCAL_GPUS:
        logger.warning(
            "Tensor parallel size (%d) exceeds available GPUs (%d). "
            "This may result in Ray placement group allocation failures. "
            "Consider reducing tensor_parallel_size to %d or less, "
            "or ensure your Ray cluster has %d GPUs available.",
            parallel_config.world_size,
            LOCAL_GPUS,
            LOCAL_GPUS,
            parallel_config.world_size,
        )
    _connect_and_count_devices(parallel_config)
    # :357-379: no `node:<ip>` entry, no "Current node has no GPU" check.
    specs: list[dict[str, float]] = [{DEVICE_STR: 1.0} for _ in range(parallel_config.world_size)]
    current_placement_group = ray.util.placement_group(specs, strategy="PACK")
    _wait_until_pg_ready(current_placement_group)
    _warn_tp_across_nodes(current_placement_group, parallel_config)
    return current_placement_group


def _warn_tp_across_nodes(placement_group: PlacementGroup, parallel_config: ParallelConfig) -> None:
    """vllm/v1/executor/ray_utils.py:55-91 (0.33.0): the driver-node rule is gone."""
    pg_data = placement_group_table(placement_group)
    node_id_to_bundle: dict[str, list[dict[str, float]]] = defaultdict(list)
    for bundle_idx, node_id in pg_data["bundles_to_node_id"].items():
        node_id_to_bundle[node_id].append(pg_data["bundles"][bundle_idx])
    _warn_tp_spread(node_id_to_bundle, parallel_config)


def get_bundles_sorted_by_node(placement_group: PlacementGroup) -> list[tuple[int, str, str]]:
    """vllm/v1/executor/ray_utils.py:141-198: (bundle index, node id, NodeManagerAddress),
    bundles on the driver's Ray node first, then by node id (a hex string)."""
    bundle_to_node = placement_group_table(placement_group)["bundles_to_node_id"]
    node_id_to_ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    out: list[tuple[int, str, str]] = []
    for bundle_idx, bundle in enumerate(placement_group.bundle_specs):
        if bundle.get(DEVICE_STR):
            node_id = bundle_to_node.get(bundle_idx)
            out.append((bundle_idx, node_id, node_id_to_ip[node_id]))
    driver_node = ray.get_runtime_context().get_node_id()
    out.sort(key=lambda item: (0 if item[1] == driver_node else 1, item[1]))
    return out


def _connect_and_count_devices(parallel_config: ParallelConfig) -> None:
    """What both executors do before building their placement group (ray_utils.py of 0.17.1
    and 0.33.0 alike): join Ray unless joined, then warn when the cluster has too few GPUs."""
    if ray.is_initialized():
        logger.info("Ray is already initialized. Skipping Ray initialization.")
    else:
        connect_ray()

    logger.info("No current placement group found. Creating a new placement group.")
    num_devices_in_cluster = ray.cluster_resources().get(DEVICE_STR, 0)
    if parallel_config.world_size > num_devices_in_cluster:
        logger.warning(
            "The number of required %ss exceeds the total "
            "number of available %ss in the placement group.",
            DEVICE_STR,
            DEVICE_STR,
        )


def _warn_tp_spread(node_id_to_bundle: dict[str, list[dict[str, float]]],
                    parallel_config: ParallelConfig) -> None:
    """The warning both executors give when TP ranks land on several nodes (ray_utils.py)."""
    for node_id, node_bundles in node_id_to_bundle.items():
        if len(node_bundles) < parallel_config.tensor_parallel_size:
            logger.warning(
                "tensor_parallel_size=%d "
                "is bigger than a reserved number of %ss (%d "
                "%ss) in a node %s. Tensor parallel workers can be "
                "spread out to 2+ nodes which can degrade the performance "
                "unless you have fast interconnect across nodes, like "
                "Infiniband. To resolve this issue, make sure you have more "
                "than %d GPUs available at each node.",
                parallel_config.tensor_parallel_size,
                DEVICE_STR,
                len(node_bundles),
                DEVICE_STR,
                node_id,
                parallel_config.tensor_parallel_size,
            )
