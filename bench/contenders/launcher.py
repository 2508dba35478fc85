"""(b) Ray's cluster launcher: `ray up` / `ray down` (ray[default] 2.60, provider local), then
`vllm serve` started in the head container with `ray exec` and waited for at /health.

The config carries the four fixes `ray up` needed on the lab:
no `--network=host` in run_options (the launcher adds --net=host), RAY_UP_enable_autoscaler_v2=0,
fabric IPs as head_ip/worker_ips with `--node-ip-address` in the start commands, and the local
provider's cluster-<name>.{state,lock} deleted before each `ray up`. Plus `--stop-timeout=1`.

The env (NCCL_DEBUG, VLLM_HOST_IP) is exported in the start commands, so `ray up` applies an
env change by restarting Ray, as it does on every re-apply. `ray up` restarts Ray under a
running vLLM (its rank actors die), so every apply also restarts `vllm serve`.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import LOG_DIR, WORK_DIR, Lab, Result, health_ok, run, ssh, venv_env
from bench.contenders import Contender, Outcome
from lab import keys

CLUSTER = "sparkbench"
CONTAINER = "spark-bench-ray"
IMAGE = "spark-vllm-sim:lab"
MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
RAY_PORT = 6379
API_PORT = 8000
VLLM_LOG = "/tmp/bench-vllm.log"
RAY_CMD_TIMEOUT_S = 300
# The launcher runs every command through `bash --login`, whose /etc/profile resets PATH and
# drops the image's /opt/venv/bin (where ray and vllm live).
VENV_PATH = "export PATH=/opt/venv/bin:$PATH"
# The launcher rsyncs its bootstrap files *into* the container (`rsync -e 'docker exec -i'`) and
# the autoscaler in the head container reaches the workers with ssh + rsync: the image needs
# both; the simulator image has neither. Rather than a different image, lend it the node's own
# (same Debian): the two binaries and the one library the image lacks.
TOOLS_FROM_NODE = ["-v", "/usr/bin/rsync:/usr/bin/rsync:ro", "-v", "/usr/bin/ssh:/usr/bin/ssh:ro",
                   "-v", "/lib/x86_64-linux-gnu/libpopt.so.0:/lib/x86_64-linux-gnu/libpopt.so.0:ro"]


def _export(env: dict[str, str]) -> str:
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


def cluster_config(lab: Lab, nccl_debug: str) -> dict[str, Any]:
    """The launcher's YAML for this lab, as an operator would write it."""
    fabric = [n.fabric_ip for n in lab.nodes]
    env = {"NCCL_DEBUG": nccl_debug, "RAY_USAGE_STATS_ENABLED": "0",
           "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1"}
    # One start command serves every worker: each finds its own fabric address among the
    # cluster's (hostname -I under --net=host lists the node's addresses).
    find_me = ("me=; for ip in " + " ".join(fabric[1:]) + "; do "
               "hostname -I | tr ' ' '\\n' | grep -qx $ip && me=$ip; done")
    workers = len(lab.nodes) - 1
    return {
        "cluster_name": CLUSTER,
        "max_workers": workers,
        "min_workers": workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 60,
        "provider": {"type": "local", "head_ip": fabric[0], "worker_ips": fabric[1:]},
        "auth": {"ssh_user": keys.USER, "ssh_private_key": str(keys.client_key())},
        "docker": {
            "image": IMAGE,
            "container_name": CONTAINER,
            "pull_before_run": False,
            # no --ulimit: the lab's nodes lack CAP_SYS_RESOURCE (docker 20.10 then refuses to start the container)
            "run_options": ["--stop-timeout=1", "--ipc=host", "--shm-size=10.24g",
                            "-v", "/root/.cache/huggingface:/root/.cache/huggingface",
                            *TOOLS_FROM_NODE],
        },
        "file_mounts": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            f"{VENV_PATH}; ray stop",
            f"{VENV_PATH}; {_export({**env, 'VLLM_HOST_IP': fabric[0]})}; ulimit -c unlimited; "
            f"ray start --head --port={RAY_PORT} --node-ip-address={fabric[0]} --num-gpus=1 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml",
        ],
        "worker_start_ray_commands": [
            f"{VENV_PATH}; ray stop",
            f"{VENV_PATH}; {find_me}; {_export(env)}; export VLLM_HOST_IP=$me; "
            f"ray start --address=$RAY_HEAD_IP:{RAY_PORT} --node-ip-address=$me --num-gpus=1",
        ],
    }


def serve_command(lab: Lab, max_model_len: int | None) -> str:
    """`vllm serve` in the background of the head container (replacing a running one)."""
    args = ["vllm", "serve", MODEL, "--tensor-parallel-size", str(len(lab.nodes)),
            "--distributed-executor-backend", "ray", "--host", "0.0.0.0",
            "--port", str(API_PORT), "--served-model-name", MODEL]
    if max_model_len is not None:
        args += ["--max-model-len", str(max_model_len)]
    env = {"VLLM_HOST_IP": lab.head.fabric_ip, "RAY_ADDRESS": f"{lab.head.fabric_ip}:{RAY_PORT}"}
    return (f"{VENV_PATH}; pkill -x vllm; {_export(env)}; "
            f"setsid nohup {shlex.join(args)} > {VLLM_LOG} 2>&1 < /dev/null &")


class Launcher(Contender):
    name = "launcher"
    label = "ray up"

    def __init__(self, lab: Lab) -> None:
        super().__init__(lab)
        self.dir = WORK_DIR / "launcher"
        self.yaml = self.dir / f"{CLUSTER}.yaml"
        self.log = LOG_DIR / "launcher.log"
        # Ray's local-provider state goes under our own RAY_TMPDIR, never the host's /tmp/ray.
        self.env = venv_env({"RAY_UP_enable_autoscaler_v2": "0",
                             "RAY_TMPDIR": str(self.dir / "tmp"),
                             "RAY_USAGE_STATS_ENABLED": "0"})

    def prepare(self) -> None:
        self._write()

    def _write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.yaml.write_text(yaml.safe_dump(cluster_config(self.lab, self.state.nccl_debug),
                                            sort_keys=False))

    def _ray(self, *args: str, timeout: float = RAY_CMD_TIMEOUT_S) -> Result:
        return run([str(Path(self.env["PATH"].split(":")[0]) / "ray"), *args],
                   timeout=timeout, env=self.env, log=self.log)

    def _forget_state(self) -> None:
        # fix 4: a kept state file makes the next `ray down` leave the worker running.
        for suffix in ("state", "lock"):
            (self.dir / "tmp" / "ray" / f"cluster-{CLUSTER}.{suffix}").unlink(missing_ok=True)

    def _ray_up(self, timeout: float = RAY_CMD_TIMEOUT_S) -> Result:
        self._write()
        self._forget_state()
        return self._ray("up", "-y", "--no-config-cache", "--disable-usage-stats",
                         str(self.yaml), timeout=timeout)

    def _serve(self) -> Result:
        return self._ray("exec", str(self.yaml), serve_command(self.lab, self.state.max_model_len))

    def _apply(self) -> Outcome:
        up = self._ray_up()
        if not up.ok:
            return Outcome(False, up.tail())
        serve = self._serve()
        return Outcome(serve.ok, "" if serve.ok else serve.tail(),
                       {"ray_up_s": round(up.seconds, 2), "ray_exec_s": round(serve.seconds, 2)})

    def up(self) -> Outcome:
        return self._apply()

    def reapply(self) -> Outcome:
        return self._apply()

    def set_env(self, value: str) -> Outcome:
        self.state.nccl_debug = value
        return self._apply()

    def set_vllm_len(self, value: int) -> Outcome:
        self.state.max_model_len = value
        serve = self._serve()
        return Outcome(serve.ok, "" if serve.ok else serve.tail(),
                       {"ray_exec_s": round(serve.seconds, 2)})

    def down(self) -> Outcome:
        res = self._ray("down", "-y", str(self.yaml))
        return Outcome(res.ok, "" if res.ok else res.tail())

    def join_failure(self, cap_s: float) -> tuple[float | None, Outcome]:
        # `ray up` returns once the head runs; the worker's failure stays in the autoscaler's
        # log. What an operator sees: a command failing, or /health never answering.
        t0 = time.monotonic()
        up = self._ray_up(timeout=cap_s)
        if not up.ok:
            return time.monotonic() - t0, Outcome(True, "ray up failed: " + up.tail(3))
        serve = self._serve()
        if not serve.ok:
            return time.monotonic() - t0, Outcome(True, "ray exec failed: " + serve.tail(3))
        while time.monotonic() - t0 < cap_s:
            if health_ok(self.lab.health_url):
                return None, Outcome(False, "serving despite the blocked fabric?")
            time.sleep(1)
        return None, Outcome(True, f"nothing reported within {cap_s:.0f} s "
                             f"(ray up {up.seconds:.1f} s, then vLLM waits)")

    def clean(self) -> None:
        self._ray("down", "-y", str(self.yaml), timeout=120)
        self._forget_state()
        for node in self.lab.nodes:  # a worker the launcher lost track of
            ssh(node, f"docker rm -f {CONTAINER} >/dev/null 2>&1 || true", log=self.log)
