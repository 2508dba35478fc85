"""The CPU tier's communicator (see __init__.py for what it changes). Loaded by vLLM through
the platform's get_device_communicator_cls, once the platform is resolved: it imports vLLM's
distributed code, which imports the current platform."""

from __future__ import annotations

import os

import torch.distributed as dist
from vllm.distributed.device_communicators.cpu_communicator import (
    CpuCommunicator,
    _CPUSHMDistributed,
)


def _shm_identity() -> str:
    """This process's /dev/shm: the filesystem it is (a node's own tmpfs has its own device)
    and the host's boot id (two machines' tmpfs may share a device number)."""
    st = os.stat("/dev/shm")
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{boot}:{st.st_dev}:{st.st_ino}"


class SharedShmCpuCommunicator(CpuCommunicator):
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        local = (_CPUSHMDistributed.make_group_name(self), _shm_identity())
        seen: list[tuple[str, str] | None] = [None] * self.world_size
        dist.all_gather_object(seen, local, group=self.device_group)
        return len(set(seen)) == 1
