"""The CPU tier's platform (see __init__.py for what it changes)."""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform


class RayCpuPlatform(CpuPlatform):
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "spark_vllm_cpu_platform.communicator.SharedShmCpuCommunicator"
