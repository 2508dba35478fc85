"""(d) sparkrun 0.4.2 (PyPI, 2026-10): the peer Spark owners use, on its default path.

Its own venv (bench/sparkrun_env.py: pinned by hash, CPython 3.12, telemetry off, a HOME of
its own), its code unpatched, driving the lab's nodes over SSH with the lab's image and model,
`runtime: vllm-distributed` (vLLM's native multi-node: every container started with
`sleep infinity`, the head's `vllm serve` by `docker exec`, then the `--headless` workers).
What its user runs, per step:

  cold up            sparkrun run RECIPE --hosts H1,H2 --offline --no-follow --trust
  no-op re-apply     the same with --ensure ("reuse an existing job when present")
  env / vLLM change  the recipe edited, then `sparkrun run` (its step 1 stops the job's
                     containers on every node, then it cold-starts; --ensure would keep the
                     running job: its job id is the recipe's name and hosts, not its content)
  rank killed/wedged the same as the no-op (--ensure): the only command that keeps a job
  teardown          sparkrun stop RECIPE --hosts H1,H2

`--offline`: the lab reaches no registry (sparkrun's own default would try the Hub first).
`--trust`: the recipe is a local file whose `model:` is a host directory, which sparkrun
identity-mounts only for trusted recipes. `--no-follow`: wait for readiness (one streamed
completion on rank 0) without printing the model's log; the command returns when ready.

Where the lab is not a Spark, the lab is shimmed, not sparkrun (every shim is listed in
bench/README.md):
1. nvidia-smi: its hardware probe (sparkrun/core/hardware_probe.py) asks for `driver_version`,
   `name,memory.total` and `compute_cap`; the lab's nodes have no GPU. During sparkrun's turn
   only (installed before its cold up, removed after its teardown: the other contenders see
   the lab as before), /usr/local/bin/nvidia-smi answers what a GB10 answers: "NVIDIA GB10,
   [N/A]" (GB10 reports no memory numbers; sparkrun then reads /proc/meminfo), compute
   capability 12.1, a driver version; anything else exits 9.
2. The recipe's `executor_config`: `accelerator_vendor: cpu` (no `--gpus`: the nodes' Docker
   has no NVIDIA runtime), `privileged: false` and `ulimit: []` (the lab's nodes cannot grant
   either: bench/README.md, the launcher's fixes). sparkrun's own recipe keys, read from its
   executors/docker.py.
3. The model as a local directory on every node, /srv/bench-model: the lab's model (its HF
   snapshot, dereferenced) copied once per lab, untimed. sparkrun refuses to bind-mount
   anything under /root (utils/shell.py _FORBIDDEN_MOUNT_PREFIXES), where the lab's HF cache
   lives, and offline it copies a Hub model only from the control machine's cache.
4. Its recipe registries disabled and their bootstrap marked done (registries.yaml): the lab
   reaches no GitHub, and each command would retry three clones.
5. The image is already on every node (the lab preloads it for everyone); sparkrun checks it
   by id and copies nothing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from bench import incident, ranks, sparkrun_env
from bench.common import (
    API_PORT,
    LOG_DIR,
    WORK_DIR,
    Lab,
    Result,
    on_nodes,
    run,
    ssh,
    ssh_with_lab_key,
)
from bench.contenders import Contender, Outcome
from lab import keys
from lab.config import FABRIC_IFNAME, LAB_MODEL
from lab.config import INNER_IMAGE as IMAGE

MODEL_DIR = "/srv/bench-model"
HF_REPO = f"/root/.cache/huggingface/hub/models--{LAB_MODEL.replace('/', '--')}"
SHIM = "/usr/local/bin/nvidia-smi"
SHIM_MARK = "spark-vllm bench: simulated GB10 nvidia-smi for sparkrun"
SHIM_SH = f"""#!/bin/sh
# {SHIM_MARK} (this lab node has no GPU)
case "$*" in
  *--query-gpu=driver_version*) echo "580.95.05" ;;
  *--query-gpu=name,memory.total*) echo "NVIDIA GB10, [N/A]" ;;
  *--query-gpu=compute_cap*) echo "12.1" ;;
  *) echo "{SHIM_MARK}: answers only sparkrun's probe queries" >&2; exit 9 ;;
esac
"""
RUN_TIMEOUT_S = 300.0
# a repair's --ensure waits for one streamed completion; through a dead or frozen rank that
# can wait for long: bounded by the scenario's own deadline (bench/scenarios.py)
REPAIR_TIMEOUT_S = 180.0
INCIDENT_CLUSTER = "bench-incident"
# What stops its Ray path on the lab (read from sparkrun 0.4.2 and seen on the nodes):
NOT_REACHABLE = (
    "not reachable on the lab without changing sparkrun: its Ray path starts Ray with "
    "`ray start --node-ip-address $NODE_IP` (orchestration/executors/_base.py), and NODE_IP "
    "comes only from its InfiniBand detection (orchestration/infiniband.py: an ACTIVE port "
    "under /sys/class/infiniband), which the lab's nodes cannot have (their sysfs is "
    "read-only): NODE_IP is empty, `--node-ip-address` swallows the next flag, the head runs "
    "a GCS without a raylet, and vLLM's ray.init finds no Ray instance; sparkrun reports the "
    "serve's exit")
SERVED_NAME = "lab"


def recipe(nccl_debug: str, max_model_len: int | None, tp: int) -> dict[str, Any]:
    cmd = "vllm serve {model} --port {port} -tp {tensor_parallel} --served-model-name {served_model_name}"
    if max_model_len:
        cmd += f" --max-model-len {max_model_len}"
    return {
        "model": MODEL_DIR,
        "runtime": "vllm-distributed",
        "container": IMAGE,
        "defaults": {"port": API_PORT, "tensor_parallel": tp, "served_model_name": SERVED_NAME},
        "executor_config": {"accelerator_vendor": "cpu", "privileged": False, "ulimit": []},
        "env": {"NCCL_DEBUG": nccl_debug},
        "command": cmd,
    }


def _timings(out: str) -> dict[str, Any]:
    """sparkrun's own report of where its time went (its "Launch timings" and readiness)."""
    prof: dict[str, Any] = {}
    if m := re.search(r"Launch timings \(total ([\d.]+)s\)", out):
        prof["sparkrun_total_s"] = float(m.group(1))
    if m := re.search(r"TTR HTTP-ready\s+([\d.]+)s", out):
        prof["container_to_http_ready_s"] = float(m.group(1))
    prof["job_already_running"] = "Job already running" in out
    return prof


class Sparkrun(Contender):
    name = "sparkrun"
    label = "sparkrun 0.4.2"

    def __init__(self, lab: Lab) -> None:
        super().__init__(lab)
        self.log = LOG_DIR / "sparkrun.log"
        self.recipe_path = WORK_DIR / "sparkrun" / "bench-lab.yaml"
        self.hosts = ",".join(n.mgmt_ip for n in lab.nodes)
        self.bin: Path | None = None

    # --- setup (untimed) -------------------------------------------------------------------

    def prepare(self) -> None:
        self.bin = sparkrun_env.sparkrun_bin()
        self.leave()  # a shim left by an interrupted run would change what the others measure
        home = sparkrun_env.home_dir()
        cfg_dir = home / ".config" / "sparkrun"
        cfg_dir.mkdir(parents=True, exist_ok=True)
        # the lab's key and pinned host keys, as every other contender's SSH
        opts = ["-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={keys.known_hosts()}"]
        (cfg_dir / "config.yaml").write_text(yaml.safe_dump(
            {"ssh": {"user": "root", "key": str(keys.client_key()), "options": opts}}))
        self._registries_off(cfg_dir / "registries.yaml")
        self._model_everywhere()
        self._write_recipe()

    def _registries_off(self, path: Path) -> None:
        if not path.exists():  # sparkrun writes its defaults on first use
            self._sparkrun("registry", "list", timeout=120)
        doc = yaml.safe_load(path.read_text()) or {}
        for entry in doc.get("registries", []):
            entry["enabled"] = False
        doc["pending_bootstrap_urls"] = []
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def _model_everywhere(self) -> None:
        """The lab's model, dereferenced, at MODEL_DIR on every node (once per lab)."""
        script = "\n".join([
            "set -e",
            f"[ -f {MODEL_DIR}/config.json ] && exit 0",
            f"snap=$(ls -d {HF_REPO}/snapshots/* | head -n 1)",
            f"rm -rf {MODEL_DIR}.tmp; mkdir -p /srv; cp -rL \"$snap\" {MODEL_DIR}.tmp",
            f"mv {MODEL_DIR}.tmp {MODEL_DIR}",
        ])
        head = ssh(self.lab.head, script, timeout=900, log=self.log)
        if not head.ok:
            raise RuntimeError(f"sparkrun: the model on {self.lab.head.name}: {head.tail()}")
        for node in self.lab.nodes[1:]:
            if ssh(node, f"test -f {MODEL_DIR}/config.json", log=self.log).ok:
                continue
            res = ssh_with_lab_key(self.lab.head, f'rsync -a -e "$RSH" {MODEL_DIR}/ '
                                   f"root@{node.fabric_ip}:{MODEL_DIR}/", timeout=900,
                                   log=self.log)
            if not res.ok:
                raise RuntimeError(f"sparkrun: the model to {node.name}: {res.tail()}")

    def _write_recipe(self) -> None:
        self.recipe_path.parent.mkdir(parents=True, exist_ok=True)
        doc = recipe(self.state.nccl_debug, self.state.max_model_len, len(self.lab.nodes))
        self.recipe_path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def enter(self) -> None:
        """Before its lifecycle: the GB10 nvidia-smi on every node."""
        script = (f"if [ -e {SHIM} ] && ! grep -q '{SHIM_MARK}' {SHIM}; then "
                  f"echo 'a real nvidia-smi is there' >&2; exit 3; fi; "
                  f"cat > {SHIM} && chmod 755 {SHIM}")
        for node in self.lab.nodes:
            res = run(keys.ssh_argv(node.mgmt_ip, script), timeout=60, stdin=SHIM_SH,
                      log=self.log)
            if not res.ok:
                raise RuntimeError(f"sparkrun: the nvidia-smi shim on {node.name}: {res.tail()}")

    def leave(self) -> None:
        on_nodes(self.lab.nodes, lambda n: f"grep -q '{SHIM_MARK}' {SHIM} 2>/dev/null && "
                 f"rm -f {SHIM}; true", log=self.log)

    # --- the commands ----------------------------------------------------------------------

    def _sparkrun(self, *args: str, timeout: float = RUN_TIMEOUT_S) -> Result:
        assert self.bin is not None, "prepare() first"
        return run([str(self.bin), *args], timeout=timeout, env=sparkrun_env.env(), log=self.log)

    def _run(self, *extra: str, timeout: float = RUN_TIMEOUT_S) -> Outcome:
        res = self._sparkrun("run", str(self.recipe_path), "--hosts", self.hosts, "--offline",
                             "--no-follow", "--trust", *extra, timeout=timeout)
        return Outcome(res.ok, "" if res.ok else res.tail(), _timings(res.out))

    def up(self) -> Outcome:
        self._write_recipe()
        return self._run()

    def reapply(self) -> Outcome:
        return self._run("--ensure")

    def set_env(self, value: str) -> Outcome:
        self.state.nccl_debug = value
        self._write_recipe()
        return self._run()

    def set_vllm_len(self, value: int) -> Outcome:
        self.state.max_model_len = value
        self._write_recipe()
        return self._run()

    def repair(self) -> Outcome:
        return self._run("--ensure", timeout=REPAIR_TIMEOUT_S)

    def down(self) -> Outcome:
        res = self._sparkrun("stop", str(self.recipe_path), "--hosts", self.hosts, timeout=120)
        return Outcome(res.ok, "" if res.ok else res.tail())

    def join_failure(self, cap_s: float) -> tuple[float | None, Outcome]:
        self._write_recipe()
        t0 = time.monotonic()
        out = self._run(timeout=cap_s)
        seconds = time.monotonic() - t0
        if out.ok:
            return None, Outcome(True, "served: its ranks met over the management network "
                                       "(sparkrun keeps the management address as the "
                                       "rendezvous when it finds no IB/CX7 address map)",
                                 out.profile)
        if "timed out after" in out.note:
            return None, Outcome(False, out.note, out.profile)
        return seconds, out

    def clean(self) -> None:
        on_nodes(self.lab.nodes, lambda n: 'ids=$(docker ps -aq --filter name=sparkrun_); '
                 '[ -z "$ids" ] || docker rm -f -v $ids >/dev/null 2>&1; true', log=self.log)
        self._reconcile()

    def _reconcile(self) -> None:
        """Release the host reservations a sparkrun process left when it was killed (a bench
        stopped mid-run, or a command the bench timed out), as its user does after checking
        the nodes (`sparkrun daemon resources reconcile OWNER --acknowledge-effects`): the
        containers were just removed. Without it every later command stops at "Execution
        resources are busy or require reconciliation after an interrupted operation"."""
        res = self._sparkrun("daemon", "resources", "list", timeout=60)
        try:
            claims = json.loads(res.out[res.out.index("["):]) if res.ok else []
        except ValueError:
            claims = []
        for owner in sorted({c["owner"] for c in claims if not c.get("alive")}):
            self._sparkrun("daemon", "resources", "reconcile", owner, "--acknowledge-effects",
                           timeout=60)

    def incident(self, cap_s: float) -> tuple[float | None, Outcome]:
        """Its Ray path (`runtime: vllm-ray`, the V1-executor image) on a saved cluster whose
        management interface is pinned to the fabric NIC (bench/incident.py)."""
        self._sparkrun("cluster", "delete", INCIDENT_CLUSTER, "--force", timeout=60)
        made = self._sparkrun("cluster", "create", INCIDENT_CLUSTER, "--hosts", self.hosts,
                              "-u", "root", "--scheduler", "greedy", timeout=60)
        pinned = self._sparkrun("cluster", "update", INCIDENT_CLUSTER, "--mgmt-interface",
                                FABRIC_IFNAME, timeout=60)
        if not (made.ok and pinned.ok):
            return None, Outcome(False, f"cluster set-up failed: {made.tail()} {pinned.tail()}")
        doc = {**recipe(self.state.nccl_debug, self.state.max_model_len, len(self.lab.nodes)),
               "runtime": "vllm-ray", "container": incident.V1_IMAGE}
        path = self.recipe_path.with_name("bench-incident.yaml")
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        res = self._sparkrun("run", str(path), "--cluster", INCIDENT_CLUSTER, "--offline",
                             "--no-follow", "--trust", timeout=cap_s)
        said = incident.evidence(self.lab)
        if res.ok and ranks.tokens_once(self.lab, timeout=5) is None:
            return res.seconds, Outcome(True, f"served (no incident): {said}")
        if "Could not find any running Ray instance" in res.out:
            return None, Outcome(False, f"{NOT_REACHABLE} (exit {res.rc} after "
                                        f"{res.seconds:.1f} s)")
        if res.rc == 124:
            return None, Outcome(True, f"nothing reported within {cap_s:.0f} s, not serving; "
                                       f"vLLM: {said}")
        return res.seconds, Outcome(True, f"reported a failure (exit {res.rc}): "
                                          f"{res.tail(4)} | vLLM: {said}")
