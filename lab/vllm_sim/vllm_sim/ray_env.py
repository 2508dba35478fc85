"""V2 mode: what the driver's environment does to every rank (vLLM 0.33.0).

- vllm/v1/executor/ray_env_utils.py:10-20 get_driver_env_vars: the WHOLE driver environment,
  minus WORKER_SPECIFIC_ENV_VARS (vllm/v1/executor/ray_utils.py:17-25) and minus the names in
  the non-carry-over file, goes to every rank.
- vllm/v1/executor/ray_executor_v2.py:173-177 initialize_worker: applied with
  `os.environ.setdefault`, so a rank keeps what its own process (the node's `ray start`
  container) already has, and takes the driver's value for everything else.
- vllm/ray/ray_env.py:11-29: the exclusions are read once, in the driver, from
  `$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json` (`set(json.load(f))`, so a JSON list of
  names); a file that is not JSON logs a warning and excludes nothing (:24-29).
- vllm/envs.py:705-710 and 347-351: VLLM_CONFIG_ROOT defaults to
  `expanduser($XDG_CONFIG_HOME or ~/.config)/vllm`.
"""

import json
import os

from vllm_sim.logger import init_logger

logger = init_logger(__name__)

# vllm/v1/executor/ray_utils.py:17-25
WORKER_SPECIFIC_ENV_VARS: frozenset[str] = frozenset(
    {
        "VLLM_HOST_IP",
        "VLLM_HOST_PORT",
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "LOCAL_RANK",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }
)
NON_CARRY_OVER_FILE_NAME = "ray_non_carry_over_env_vars.json"

# What each rank reports about its environment (values), and the secrets it reports by
# presence only: the values never leave the rank.
REPORTED_PREFIXES = ("NCCL_", "GLOO_", "TP_", "UCX_")
REPORTED_NAMES = ("VLLM_HOST_IP", "VLLM_RPC_BASE_PATH")
SECRET_NAMES = ("HF_TOKEN", "VLLM_API_KEY")


def vllm_config_root(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    default_root = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.expanduser(env.get("VLLM_CONFIG_ROOT") or os.path.join(default_root, "vllm"))


def non_carry_over_file() -> str:
    return os.path.join(vllm_config_root(), NON_CARRY_OVER_FILE_NAME)


def read_non_carry_over_env_vars() -> set[str]:
    path = non_carry_over_file()
    if not os.path.exists(path):
        return set()
    try:
        with open(path) as f:
            return set(json.load(f))
    except json.JSONDecodeError:
        logger.warning(
            "Failed to parse %s. Using an empty set for non-carry-over env vars.", path
        )
        return set()


def get_driver_env_vars(worker_specific_vars: frozenset[str] = WORKER_SPECIFIC_ENV_VARS) -> dict:
    exclude = set(worker_specific_vars) | read_non_carry_over_env_vars()
    return {k: v for k, v in os.environ.items() if k not in exclude}


def env_report(own_env: dict[str, str], now: dict[str, str]) -> dict[str, dict]:
    """What a rank ended up with, and where each value came from ("node": the rank process had
    it before carry-over; "driver": filled in from the driver). Secrets: presence only."""
    report: dict[str, dict] = {}
    for key in sorted(now):
        if key.startswith(REPORTED_PREFIXES) or key in REPORTED_NAMES:
            report[key] = {"value": now[key], "source": "node" if key in own_env else "driver"}
    for key in SECRET_NAMES:
        entry: dict = {"present": key in now}
        if key in now:
            entry["source"] = "node" if key in own_env else "driver"
        report[key] = entry
    return report
