"""A vLLM general plugin for the GPU tier: what a process's os.environ holds once vLLM set it.

vLLM loads `vllm.general_plugins` in every process it runs, a rank's Ray actor included, in
init_worker, after RayExecutorV2.initialize_worker applied the driver's env with setdefault
(vllm/v1/worker/worker_base.py init_worker -> load_general_plugins, 0.26.0). /proc/PID/environ
cannot show that (it is the exec-time env). Writes DIR/<pid>.json when DIR exists, else
nothing: secrets as presence only, every other name with its value.
"""
import json
import os
import sys

# where it writes: the GPU tier's fixed place, or the CPU tier's own (its image env)
DIR = os.environ.get("SPARK_VLLM_ENVPROBE_DIR", "/root/obs/envprobe")
SECRETS = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def dump():
    if not os.path.isdir(DIR):
        return
    actor = None
    try:
        import ray
        if ray.is_initialized():
            actor = ray.get_runtime_context().get_actor_id()
    except Exception:  # noqa: BLE001 - a probe must never break vLLM
        pass
    try:
        cmdline = open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode()[:300]
    except OSError:
        cmdline = " ".join(sys.argv)[:300]
    env = {k: ("<set>" if k in SECRETS else v) for k, v in os.environ.items()}
    with open(os.path.join(DIR, f"{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "actor": actor, "cmdline": cmdline, "env": env}, f)
