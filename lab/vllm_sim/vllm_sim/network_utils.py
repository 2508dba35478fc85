"""vLLM's get_ip(), same order and same text (vllm/utils/network_utils.py).

The order matters for the incident: Ray auto-detects its node IP by the same default-route trick,
so vLLM and Ray agree unless exactly one of them is overridden (VLLM_HOST_IP on one side,
--node-ip-address on the other).
"""

import os
import socket
import warnings

from vllm_sim.logger import init_logger

logger = init_logger(__name__)

# Connecting a UDP socket sends no packet: it only asks the kernel which source address the
# default route would use. These addresses are never contacted.
_PROBE_V4 = ("8.8.8.8", 80)
_PROBE_V6 = ("2001:4860:4860::8888", 80)


def get_ip() -> str:
    host_ip = os.environ.get("VLLM_HOST_IP", "")
    if "HOST_IP" in os.environ and "VLLM_HOST_IP" not in os.environ:
        logger.warning(
            "The environment variable HOST_IP is deprecated and ignored, as"
            " it is often used by Docker and other software to"
            " interact with the container's network stack. Please "
            "use VLLM_HOST_IP instead to set the IP address for vLLM processes"
            " to communicate with each other."
        )
    if host_ip:
        return host_ip

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(_PROBE_V4)
            return s.getsockname()[0]
    except Exception:
        pass

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.connect(_PROBE_V6)
            return s.getsockname()[0]
    except Exception:
        pass

    warnings.warn(
        "Failed to get the IP address, using 0.0.0.0 by default. "
        "The value can be set by the environment variable"
        " VLLM_HOST_IP or HOST_IP.",
        stacklevel=2,
    )
    return "0.0.0.0"
