"""The GPU tier's scenario runner: the program's own rendered commands against real vLLM.

Runs on the GPU machine (lab/gpu/README.md): every script it runs comes from spark_vllm/ by
calling its builders (the Ray head's and vLLM's start scripts with their argv, env, env-files,
non-carry-over list and middleware, the model staging, the gate, the probe, the liveness read,
the remove scripts), executed with `sh -c` as pulumi-command would on a node, with `docker`
being lab/gpu/docker_shim.py (one mount namespace per container). What vLLM did is written to
OUT/observations-<version>.json; tests/vllm_sim/test_real_vllm_fidelity.py plays it against
vllm-sim. The same runner runs on the CPU against vllm-sim (tests/gpu_tier), so a runner bug
never costs GPU time.

    python3 lab/gpu/runner.py --out DIR --part serve|restart|load|cache|memory|qwen35|heldout|all
        [--site DIR] [--hf DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from spark_vllm.components import memory_estimate, node_memory  # noqa: E402
from spark_vllm.components import spec as specmod  # noqa: E402
from spark_vllm.components.render import (  # noqa: E402
    api_key_commands,
    commands,
    liveness_commands,
    staging_commands,
)
from spark_vllm.components.render.backends import ray as ray_backend  # noqa: E402

IMAGE = "spark-vllm-gpu-tier:local"  # recorded only: the machine is the image (docker_shim)
HF_TOKEN = "hf_observation_not_a_real_token"
API_KEY = "observation-api-key-not-secret"
SECRETS = frozenset({"sshPrivateKey", "hfToken", "apiKey"})
# NVLink multicast stays off on shared hosts; flashinfer does not travel
# (its sampler is imported unless told not to: vllm/v1/sample/ops/topk_topp_sampler.py)
MACHINE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
               "NVSHMEM_DISABLE_NVLS": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
# vLLM's log lines the observations keep (with their time since the container started)
LOG_MARKS = ("Available KV cache memory", "GPU KV cache size", "torch.compile takes",
             "Compiling a graph", "torch.compile took", "Using cache directory",
             "Directly load the compiled graph", "init engine", "Starting vLLM API server",
             "Tensor parallel size", "Waiting for creating a placement group",
             "number of required GPUs", "died unexpectedly", "Executor failed",
             "engine core exited", "Model loading took", "Graph capturing finished",
             "Application startup complete", "Shutting down", "non_carry_over",
             "Error", "error:")
# and for the sized models' starts (vllm_up_logged) only: the earlier parts' logs stay as recorded
SIZED_LOG_MARKS = (*LOG_MARKS, "Encoder cache will be", "GDN prefill kernel",
                   "Maximum concurrency", "maximum model length", "max_model_len",
                   "CUDA graph memory profiling", "Traceback", "Exception",
                   "Setting attention block size", "Auto-fit",
                   "Free memory on device")  # vLLM's own split: weights, peak activation, ...
ROUTES = [("GET", "/health"), ("GET", "/ping"), ("GET", "/v1/models"), ("GET", "/metrics"),
          ("GET", "/version"), ("POST", "/invocations"), ("POST", "/v1/chat/completions"),
          ("POST", "/v1/completions"), ("POST", "/tokenize")]
ENV_KEYS = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "NCCL_IB_HCA",
            "VLLM_HOST_IP", "VLLM_CACHE_ROOT", "HF_HUB_OFFLINE", "VLLM_CONFIG_ROOT",
            "VLLM_RPC_BASE_PATH", "RAY_ADDRESS", "PYTHONPATH", "SPARK_OBS_CARRIED")


def now() -> float:
    return time.monotonic()


def machine_ip() -> str:
    """The address Ray registers (it rewrites 127.0.0.1 to the machine's own)."""
    for probe in ("8.8.8.8", "10.255.255.255"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 80))
                ip = s.getsockname()[0]
                if not ip.startswith("127."):
                    return ip
        except OSError:
            pass
    for line in Path("/proc/net/fib_trie").read_text().splitlines():  # LOCAL entries
        m = re.search(r"\|-- (\d+\.\d+\.\d+\.\d+)", line)
        if m and not m.group(1).startswith(("127.", "0.")) and not m.group(1).endswith(".255"):
            return m.group(1)
    return socket.gethostbyname(socket.gethostname())



def hidden_prefix() -> str:
    """This Python's prefix and the checkout (an editable vllm-sim lives there), those that a
    container's private /tmp or writable-layer dirs would cover, `:`-separated."""
    covered = ("/tmp/", "/root/.cache/", "/root/.config/")
    return ":".join(d for d in dict.fromkeys([sys.prefix, str(REPO)]) if d.startswith(covered))

class Tier:
    def __init__(self, args: argparse.Namespace) -> None:
        self.out = Path(args.out)
        self.site, self.hf = args.site, args.hf
        self.vllm_cache = args.vllm_cache
        self.obs: dict[str, Any] = {"scenarios": {}}
        self.ip = args.ip or machine_ip()
        self.port = 8000
        self.shim_dir = Path(args.shim_dir)
        self.shim_dir.mkdir(parents=True, exist_ok=True)
        shim = self.shim_dir / "docker_shim.py"
        shim.write_text((REPO / "lab/gpu/docker_shim.py").read_text())
        docker = self.shim_dir / "docker"
        docker.write_text(f"#!/bin/sh\nexec {sys.executable} {shim} \"$@\"\n")
        docker.chmod(0o755)
        py_bin = str(Path(sys.executable).parent)
        image_env = {"PATH": f"{self.site}/bin:{py_bin}:/usr/local/sbin:/usr/local/bin:"
                             "/usr/sbin:/usr/bin:/sbin:/bin",
                     "PYTHONPATH": self.site, "HOME": "/root", "LANG": "C.UTF-8",
                     **MACHINE_ENV, **json.loads(args.image_env or "{}")}
        self.host_env = {**os.environ, "PATH": f"{self.shim_dir}:{os.environ['PATH']}",
                         "HOME": "/root", "SHIM_IMAGE_ENV": json.dumps(image_env),
                         # a container's writable layer: private in each container
                         "SHIM_PRIVATE_DIRS": "/root/.cache:/root/.triton:/root/.config:/root/.nv",
                         # the "image": this Python's prefix when a container would hide it
                         # (a checkout, and its venv, under /tmp), bound back over its tmpfs
                         "SHIM_IMAGE_DIRS": hidden_prefix()}
        self.image_env = image_env
        # the CPU tier (lab/cpu_tier) runs the same scenarios on two "nodes": where the API
        # answers from the runner, where the env probe writes, and how a script reaches a node
        self.api_addr = "127.0.0.1"
        self.probe_dir = Path("/root/obs/envprobe")

    def on_node(self, argv: list[str], env: dict[str, str],
                node: str | None) -> tuple[list[str], dict[str, str]]:
        """argv and env of a command run on `node`: here, the machine itself."""
        return argv, env

    # --- running the program's scripts -------------------------------------------------

    def sh(self, script: str, stdin: str = "", extra_env: dict | None = None,
           timeout: float = 900, node: str | None = None) -> dict[str, Any]:
        """Run a rendered script as pulumi-command would (`sh -c`, stdin); stderr lines are
        kept with their time, so a long wait shows its progress lines."""
        env = dict(self.host_env)
        if extra_env:
            env["SHIM_EXTRA_ENV"] = json.dumps(extra_env)
        start = now()
        argv, env = self.on_node(["sh", "-c", script], env, node)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                text=True, cwd="/root")
        lines: list[list[Any]] = []

        def read_err() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append([round(now() - start, 2), line.rstrip("\n")])
        t = threading.Thread(target=read_err, daemon=True)
        t.start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            out = proc.stdout.read()
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc, out = -9, ""
        t.join(5)
        return {"rc": rc, "seconds": round(now() - start, 2), "stdout": out.strip()[-2000:],
                "stderr": lines[-80:]}

    def spec(self, stack: str = "gpu", model: str = "spark-vllm/tiny-dense", tp: int = 1,
             vllm_args: tuple[str, ...] = (), env: dict | None = None,
             ghost_node: str | None = None, vllm_timeout: int = 900,
             compile_cache: str | None = None) -> specmod.ClusterSpec:
        """compile_cache None: the earlier parts' layout (compileCache none, VLLM_CACHE_ROOT a
        machine dir the runner sets); "none": the caches in the containers only (cold after
        every replacement); a path: the program's compileCache on the node."""
        nodes = [{"name": "h200", "host": self.ip, "gpus": 1}]
        if ghost_node:  # a node that never joins: the layout wants a GPU Ray does not have
            nodes.append({"name": "ghost", "host": ghost_node, "gpus": 1})
        raw = {"nodes": nodes, "image": IMAGE, "model": model, "tensorParallelSize": tp,
               "hfCache": self.hf, "modelStaging": "copy", "port": self.port,
               "env": {**({"VLLM_CACHE_ROOT": self.vllm_cache} if compile_cache is None
                          else {}), **(env or {})},
               "compileCache": compile_cache or "none",
               "vllmArgs": list(vllm_args), "vllmTimeout": vllm_timeout, "rayTimeout": 120,
               "rayPort": 6391,  # not Ray's default: a CPU run beside other Ray tests
               # the liveness bounds, shorter than a Spark's defaults (30/60) to save device
               # time: the rules are the same, the bounds are recorded with them
               "canaryTimeout": 10, "wedgeWindow": 20,
               # the scripts are rendered and run here by the runner, never over SSH
               "insecureAcceptAnyHostKey": True}
        return specmod.parse_spec(raw, stack, SECRETS)

    def head_up(self, spec: specmod.ClusterSpec) -> dict:
        return self.sh(ray_backend.head_start_script(spec),
                       commands.secret_env_file(commands.HEAD, HF_TOKEN))

    def gate(self, spec: specmod.ClusterSpec) -> dict:
        return self.sh(ray_backend.gate_script(spec, [json.dumps(self.preflight_report())]),
                       ray_backend.gate_program())

    def stage(self, spec: specmod.ClusterSpec) -> dict:
        return self.sh(staging_commands.stage_script(spec), staging_commands.staging_stdin(
            commands.secret_env_file(staging_commands.MODEL_ROLE, HF_TOKEN)))

    def api_key_up(self, spec: specmod.ClusterSpec) -> dict:
        """The API key's file, as the program's api-key command writes it (the middleware
        reads it; vLLM gets no VLLM_API_KEY)."""
        return self.sh(api_key_commands.api_key_script(spec, spec.head), api_key_commands.api_key_text(API_KEY))

    def vllm_up(self, spec: specmod.ClusterSpec, extra_env: dict | None = None) -> dict:
        key = self.api_key_up(spec)
        if key["rc"]:
            return key
        return self.sh(ray_backend.vllm_start_script(spec), commands.vllm_stdin(HF_TOKEN),
                       extra_env=extra_env)

    def liveness(self, spec: specmod.ClusterSpec) -> dict:
        """The refresh-time read, as liveness.observe runs it: its state line, and what it saw
        (the script's stderr: serving / busy / unknown)."""
        r = self.sh(liveness_commands.inspect_script(commands.container_name(spec, commands.VLLM),
                                            liveness_commands.liveness_target(spec)),
                    commands.script_text("vllm_liveness.py"))
        r["state"] = r["stdout"].splitlines()[-1] if r["stdout"] else ""
        r["seen"] = [ln[1] for ln in r["stderr"] if ln[1].startswith(("serving:", "busy:", "unknown:"))]
        return r

    def probe(self, spec: specmod.ClusterSpec, *mode: str) -> dict:
        name = commands.container_name(spec, commands.VLLM)
        argv = ["docker", "exec", "-i", name, "python3", "-", *commands.probe_target(spec),
                *mode]
        return self.sh(shlex.join(argv), commands.script_text("vllm_probe.py"))

    def remove(self, spec: specmod.ClusterSpec, role: str) -> dict:
        return self.sh(commands.remove_script(spec, spec.head, role))

    def docker(self, *argv: str, node: str | None = None) -> subprocess.CompletedProcess:
        cmd, env = self.on_node(["docker", *argv], dict(self.host_env), node)
        return subprocess.run(cmd, env=env, capture_output=True, text=True)

    def preflight_report(self) -> dict:
        """What the preflight prints for this node (the preflight itself needs `ip` and a
        registry, which the GPU machine lacks): the versions are read from the install."""
        code = ("import ray, sys, importlib.metadata as m; "
                "print(ray.__version__, sys.version.split()[0], m.version('vllm'))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": self.site})
        ray_v, py, vllm = (out.stdout.split() + ["?", "?", "?"])[:3]
        if vllm == "?":  # vllm-sim is installed as vllm-sim: ask the command, as the preflight
            cli = subprocess.run(["vllm", "--version"], capture_output=True, text=True,
                                 env={**os.environ, **self.image_env})
            vllm = (cli.stdout.split() or ["?"])[-1]
        return {"node": "h200", "identity": self.ip, "docker": "shim", "gpus": "1",
                "image_id": "sha256:" + "0" * 64, "ray": ray_v, "python": py, "vllm": vllm}

    def container_log(self, spec: specmod.ClusterSpec, role: str) -> list[str]:
        log = self.docker("logs", commands.container_name(spec, role)).stdout.splitlines()
        return [line[:400] for line in log if any(m in line for m in LOG_MARKS)][-60:]

    # --- HTTP ----------------------------------------------------------------------------

    def http(self, method: str, path: str, body: Any = None, key: bool | str = True,
             timeout: float = 30) -> dict:
        """One request; `key`: the tier's API key (True), none (False) or this one (a str)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {API_KEY if key is True else key}"
        req = urllib.request.Request(f"http://{self.api_addr}:{self.port}{path}", data=data,
                                     headers=headers, method=method)
        start = now()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read().decode(errors="replace")
                return {"status": resp.status, "body": text, "seconds": round(now() - start, 3)}
        except urllib.error.HTTPError as err:
            return {"status": err.code, "body": err.read().decode(errors="replace")[:500],
                    "seconds": round(now() - start, 3)}
        except (OSError, urllib.error.URLError) as err:
            return {"status": None, "error": f"{type(err).__name__}: {err}"[:200],
                    "seconds": round(now() - start, 3)}

    def chat(self, served: str, extra: dict | None = None, timeout: float = 30,
             max_tokens: int = 16) -> dict:
        body = {"model": served, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "spark-vllm smoke test"}],
                **(extra or {})}
        r = self.http("POST", "/v1/chat/completions", body, timeout=timeout)
        if r.get("status") == 200:
            r["json"] = json.loads(r.pop("body"))
        return r

    def canary(self, served: str, bound_s: float) -> dict:
        """A streaming chat: seconds to its first token, or none within bound_s."""
        body = {"model": served, "max_tokens": 4, "stream": True,
                "messages": [{"role": "user", "content": "canary"}]}
        req = urllib.request.Request(
            f"http://{self.api_addr}:{self.port}/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        start = now()
        try:
            with urllib.request.urlopen(req, timeout=bound_s) as resp:
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    delta = json.loads(line[5:])["choices"][0].get("delta", {})
                    if any(delta.get(k) for k in ("content", "reasoning", "reasoning_content")):
                        return {"first_token_s": round(now() - start, 3)}
            return {"first_token_s": None, "ended_s": round(now() - start, 3)}
        except (OSError, urllib.error.URLError) as err:
            return {"first_token_s": None, "error": f"{type(err).__name__}"[:80],
                    "after_s": round(now() - start, 3)}

    def metrics(self) -> dict:
        r = self.http("GET", "/metrics", timeout=5)
        if r.get("status") != 200:
            return {"status": r.get("status")}
        sums: dict[str, float] = {}
        for line in r["body"].splitlines():
            m = re.match(r"^(vllm:[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
            if m and m.group(1) in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                    "vllm:generation_tokens_total"):
                sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
        return {"status": 200, **{k.split(":")[1]: v for k, v in sums.items()}}

    def metric_names(self) -> dict:
        r = self.http("GET", "/metrics", timeout=5)
        names: dict[str, dict] = {}
        kind: dict[str, str] = {}
        for line in r.get("body", "").splitlines():
            if line.startswith("# TYPE vllm:"):
                _, _, name, typ = line.split()
                kind[name] = typ
            m = re.match(r"^(vllm:[a-z_:]+?)(_bucket|_sum|_count|_created)?(\{([^}]*)\})? ", line)
            if m:
                base = m.group(1)
                labels = sorted(re.findall(r'([a-z_]+)="', m.group(4) or ""))
                entry = names.setdefault(base, {"labels": set(), "type": kind.get(base, "")})
                entry["labels"].update(labels)
        return {n: {"type": e["type"] or kind.get(n, ""), "labels": sorted(e["labels"])}
                for n, e in sorted(names.items())}

    # --- rank processes --------------------------------------------------------------------

    def own_mount_namespaces(self) -> set[str]:
        """The mount namespaces of the containers this runner's docker shim started."""
        state = Path(self.host_env.get("SHIM_STATE")
                     or os.environ.get("SHIM_STATE", "/run/spark-vllm-shim"))
        return {f.read_text().strip() for f in state.glob("*/mntns")}

    def rank_pid(self) -> int | None:
        """The rank's process: the Ray actor the env probe saw, else a RayWorkerProc title;
        either only inside this runner's own containers. The machine may run other Rays (CI
        runs this beside the Docker lab, whose vllm-sim ranks carry the same title, and a
        recorded pid may have been reused since): a signal must never reach one of those."""
        own = self.own_mount_namespaces()

        def ours(pid: int) -> bool:
            try:
                return os.readlink(f"/proc/{pid}/ns/mnt") in own
            except OSError:
                return False

        for f in sorted(self.probe_dir.glob("*.json")):
            d = json.loads(f.read_text())
            if d.get("actor") and ours(int(d["pid"])):
                return int(d["pid"])
        out = subprocess.run(["pgrep", "-f", "RayWorkerProc"], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split() if ours(int(p))]
        return pids[0] if pids else None

    def record(self, name: str, fn: Callable[[], Any]) -> Any:
        start = now()
        print(f"[gpu-tier] {name} ...", flush=True)
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - one scenario's failure is an observation
            result = {"runner_error": f"{type(err).__name__}: {err}",
                      "trace": traceback.format_exc()[-1500:]}
        if isinstance(result, dict):
            result.setdefault("scenario_seconds", round(now() - start, 2))
        self.obs["scenarios"][name] = result
        print(f"[gpu-tier] {name}: {json.dumps(result)[:300]}", flush=True)
        self.save()
        return result

    def save(self) -> None:
        h = self.obs.get("header", {})
        path = self.out / f"observations-{h.get('vllm', 'unknown')}-{h.get('part', 'all')}.json"
        path.write_text(json.dumps(self.obs, indent=1, sort_keys=True, default=str) + "\n")

    # --- scenarios -------------------------------------------------------------------------

    def header(self, part: str) -> None:
        pf = self.preflight_report()
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True)
        except OSError:
            gpu = subprocess.CompletedProcess([], 1, "", "")
        # the device's copy of the tree carries a .git of an older base: .commit says what runs
        commit = os.environ.get("SPARK_VLLM_COMMIT", "") or subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
            text=True).stdout.strip()
        self.obs["header"] = {
            "vllm": pf["vllm"], "ray": pf["ray"], "python": pf["python"],
            "torch": _version("torch"), "transformers": _version("transformers"),
            "gpu": gpu.stdout.strip() or "none", "machine": os.uname().nodename,
            "cpus": os.cpu_count(), "kernel": os.uname().release,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": commit or "unknown",
            "part": part, "identity_ip": self.ip,
            "layout": "docker_shim: one mount namespace per container (private /tmp and "
                      "writable-layer dirs, the head's /tmp/ray shared), host net/pid/ipc",
        }

    def serve_part(self) -> None:
        # --max-num-seqs 16: a flood of 64 at once queues, so the canary waits while tokens flow
        s = self.spec(vllm_args=("--max-model-len", "2048", "--gpu-memory-utilization", "0.5",
                                 "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
                                 "--tool-call-parser", "hermes", "--max-num-seqs", "16"))
        served = s.served_name
        self.probe_dir.mkdir(parents=True, exist_ok=True)
        self.record("parser", lambda: self.parser_cases(s))  # CPU only, in the background
        self.record("head_start", lambda: self.head_up(s))
        self.record("gate", lambda: self.gate(s))
        self.record("stage", lambda: self.stage(s))
        # only the vLLM container gets these (the runner's, not the program's): a fabric key
        # and a secret that differ from the head's, and a variable nobody excludes
        vllm_only = {commands.container_name(s, commands.VLLM): {
            "NCCL_SOCKET_IFNAME": "vllm-only0", "HF_TOKEN": "hf_vllm_container_only",
            "SPARK_OBS_CARRIED": "from-the-vllm-container"}}
        self.record("serve_cold", lambda: {**self.vllm_up(s, vllm_only),
                                           "log": self.container_log(s, commands.VLLM)})
        self.record("liveness_serving", lambda: self.liveness(s))
        self.record("probe_modes", lambda: {m: self.probe(s, *a) for m, a in {
            "ready": ("ready",), "smoke": ("smoke",), "wait_smoke": ("wait", "5", "smoke")}
            .items()})
        self.record("routes", self.routes)
        self.record("rank_env", self.rank_env)
        self.record("reasoning", lambda: self.chat(served))
        self.record("reasoning_off", lambda: self.chat(
            served, {"chat_template_kwargs": {"enable_thinking": False}}))
        self.record("tool_call", lambda: self.tool_calls(served))
        self.record("metric_names", self.metric_names)
        self.record("busy_queue", lambda: self.busy(s, served))
        self.record("frozen_idle", lambda: self.frozen(s, served, load=0, seconds=40))
        self.record("frozen_loaded", lambda: self.frozen(s, served, load=16, seconds=25))
        self.record("rank_killed", lambda: self.kill_rank(s))
        self.record("cleanup", lambda: {r: self.remove(s, r) for r in (commands.VLLM,
                                                                      commands.HEAD)})

    def restart_part(self) -> None:
        s = self.spec(vllm_args=("--max-model-len", "2048", "--gpu-memory-utilization", "0.5"))
        # a Ray-container replacement: a new head, a new vLLM, the compile cache on the host
        self.record("head_start_again", lambda: self.head_up(s))
        self.record("serve_cache_kept", lambda: {**self.vllm_up(s),
                                                 "log": self.container_log(s, commands.VLLM)})
        self.record("parser", lambda: self.parser_cases(s))
        self.record("frozen_loaded", lambda: self.frozen(s, s.served_name, load=16, seconds=25))
        if self.obs["header"]["gpu"] == "none":  # the CPU run: the load part's frozen case
            self.record("frozen_inflight", lambda: self.frozen(
                s, s.served_name, load=64, seconds=25, max_tokens=1900, settle_s=0.5))
        self.record("sigterm", lambda: self.sigterm(s))
        tp2 = self.spec(tp=2, ghost_node="10.255.255.2", vllm_timeout=240,
                        vllm_args=("--max-model-len", "2048", "--gpu-memory-utilization", "0.5"))
        self.record("tp2_one_gpu", lambda: {**self.vllm_up(tp2),
                                            "log_after": "(container removed by the script)"})
        self.record("host_ip_not_local", lambda: self.bad_host_ip(self.spec(
            vllm_args=("--max-model-len", "2048", "--gpu-memory-utilization", "0.5"),
            vllm_timeout=150)))
        self.record("kv_fp8_util03", lambda: self.memory(s, (
            "--max-model-len", "2048", "--gpu-memory-utilization", "0.3",
            "--kv-cache-dtype", "fp8")))
        self.record("cleanup_restart", lambda: {r: self.remove(s, r) for r in (commands.VLLM,
                                                                              commands.HEAD)})

    def replaced_start(self, s: specmod.ClusterSpec) -> dict:
        """A Ray-container replacement as `pulumi up` runs it: vLLM and the head removed, a new
        head, a new vLLM; the start script's seconds and vLLM's compile lines."""
        for role in (commands.VLLM, commands.HEAD):
            self.remove(s, role)
        head = self.head_up(s)
        r = self.vllm_up(s)
        cache = s.compile_cache_dir
        du = subprocess.run(["du", "-sk", cache], capture_output=True, text=True).stdout \
            if cache else ""
        return {**r, "head": {"rc": head["rc"], "seconds": head["seconds"],
                              "cache_lines": [ln for ln in head["stderr"]
                                              if "compile cache" in ln[1]]},
                "log": self.container_log(s, commands.VLLM),
                "cache_kib": int(du.split()[0]) if du.split() else None}

    def cache_part(self) -> None:
        """Issue: warm starts after a Ray-container replacement. The program's compileCache
        (a node directory mounted in the head and vLLM containers) against today's layout (the
        caches in the containers: every replacement starts cold)."""
        args = ("--max-model-len", "2048", "--gpu-memory-utilization", "0.5")
        warm = self.spec(vllm_args=args, compile_cache="/root/node-compile-cache")
        cold = self.spec(vllm_args=args, compile_cache="none")
        self.record("stage", lambda: self.stage(warm))
        self.record("cache_first_start", lambda: self.replaced_start(warm))
        self.record("cache_after_replacement", lambda: self.replaced_start(warm))
        self.record("nocache_first_start", lambda: self.replaced_start(cold))
        self.record("nocache_after_replacement", lambda: self.replaced_start(cold))
        self.record("cleanup_cache", lambda: {r: self.remove(cold, r) for r in (commands.VLLM,
                                                                               commands.HEAD)})

    def memory(self, s: specmod.ClusterSpec, args: tuple[str, ...],
               model: str = "spark-vllm/tiny-dense") -> dict:
        """vLLM's own memory lines for one configuration (the estimator's reference)."""
        self.remove(s, commands.VLLM)
        m = self.spec(model=model, vllm_args=args, vllm_timeout=240)
        r = self.vllm_up(m)
        return {"args": list(args), "rc": r["rc"], "seconds": r["seconds"],
                "log": self.container_log(m, commands.VLLM)}

    def vllm_up_logged(self, spec: specmod.ClusterSpec) -> dict:
        """vllm_up, with vLLM's marked log lines read every 2 s while it starts: a start that
        fails is removed by the program's script, and its log with it."""
        name = commands.container_name(spec, commands.VLLM)
        seen: list[str] = []
        done = threading.Event()

        def watch() -> None:
            while not done.wait(2):
                lines = self.docker("logs", name).stdout.splitlines()
                if lines:
                    seen[:] = lines
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        r = self.vllm_up(spec)
        done.set()
        t.join(5)
        log = self.docker("logs", name).stdout.splitlines() or seen
        return {**r, "log": [ln[:600] for ln in log
                             if any(m in ln for m in SIZED_LOG_MARKS)][-80:]}

    def sized(self, model: str, args: tuple[str, ...]) -> dict:
        """One start of a sized model with its own memory lines (the held-out recordings)."""
        self.remove(self.spec(), commands.VLLM)
        # a fresh machine: the seeds' class took 300.9 s to serve from a cold Triton cache (call 4)
        m = self.spec(model=model, vllm_args=args, vllm_timeout=420, env=SIZED_ENV)
        r = self.vllm_up_logged(m)
        return {"model": model, "args": list(args), "rc": r["rc"], "seconds": r["seconds"],
                "log": r["log"], "stderr_tail": r["stderr"][-12:]}

    def gpu_memory_facts(self) -> dict:
        """What each reader says the GPU's memory is: nvidia-smi (total, reserved, free),
        CUDA's cuDeviceTotalMem and cudaMemGetInfo (torch), and the program's node script."""
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.reserved,"
                              "memory.used,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True)
        code = ("import torch, json; f, t = torch.cuda.mem_get_info(); "
                "p = torch.cuda.get_device_properties(0); "
                "print(json.dumps({'free': f, 'total': t, 'props_total': p.total_memory, "
                "'integrated': bool(p.is_integrated)}))")
        torch_info = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        node = self.sh(node_memory.SCRIPT)
        return {"nvidia_smi": smi.stdout.strip() or smi.stderr.strip()[-300:],
                "torch": torch_info.stdout.strip() or torch_info.stderr.strip()[-500:],
                "node_script": node["stdout"], "node_script_rc": node["rc"],
                "node_script_stderr": node["stderr"][-5:]}

    def qwen35_part(self, fitted: bool = True) -> None:
        """The seeds' class (Qwen3_5MoeForConditionalGeneration, block FP8) served as an
        operator would, then the memory lines of sized models: the FITTED set."""
        s = self.spec(model="spark-vllm/qwen35-fp8", vllm_args=QWEN35_ARGS + (
            "--max-model-len", "32768", "--gpu-memory-utilization", "0.5"), vllm_timeout=360,
            env=SIZED_ENV)
        served = s.served_name
        self.record("gpu_memory", self.gpu_memory_facts)
        self.record("head_start", lambda: self.head_up(s))
        self.record("stage", lambda: self.stage(s))
        self.record("qwen35_serve", lambda: {**self.vllm_up_logged(s), "args": list(s.vllm_args)})
        self.record("qwen35_liveness", lambda: self.liveness(s))
        self.record("qwen35_probe", lambda: {m: self.probe(s, *a) for m, a in {
            "ready": ("ready",), "smoke": ("smoke",)}.items()})
        self.record("qwen35_reasoning", lambda: self.chat(served))
        self.record("qwen35_reasoning_off", lambda: self.chat(
            served, {"chat_template_kwargs": {"enable_thinking": False}}))
        self.record("qwen35_tool_call", lambda: self.tool_calls(served))
        for name, (model, args) in (FITTED if fitted else HELD_OUT).items():
            self.record(name, lambda model=model, args=args: self.sized(model, args))
        self.record("cleanup_qwen35", lambda: {r: self.remove(s, r) for r in (commands.VLLM,
                                                                             commands.HEAD)})

    def sized_models(self, models: set[str]) -> dict:
        """The config and every tensor's (dtype, shape, bytes) of the sized models that
        transformers wrote (save_pretrained's names and dtypes are its own; the FP8 ones are
        tiny_model.fp8_tensors' and rebuilt from it), as the admission reads them."""
        out = {}
        for model in sorted(models):
            repo = Path(self.hf) / "hub" / f"models--{model.replace('/', '--')}"
            snap = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
            m = memory_estimate.read_model(str(snap))
            out[model] = {"config": m.config,
                          "tensors": {n: [d, list(sh), b] for n, (d, sh, b) in m.tensors.items()}}
        return out

    def auto_edge(self, name: str, served: str) -> dict:
        """A request of exactly the length --max-model-len auto chose (vLLM's fit counts the
        null block as free), and one a block shorter, as prompt token ids with max_tokens 1:
        answered or not within a deadline."""
        log = "\n".join(self.obs["scenarios"][name].get("log") or [])
        chosen = re.search(r"reduced from (\d+) to (\d+)", log)
        block = re.search(r"Setting attention block size to (\d+) tokens", log)
        if not chosen:
            return {"skipped": "vLLM did not reduce max_model_len"}
        length = int(chosen[2])
        step = int(block[1]) if block else 2048  # unlogged: more than any model's here
        out: dict[str, Any] = {"max_model_len": length, "shorter_by": step,
                               "block_size_logged": bool(block)}
        def metrics() -> list[str]:
            return [ln for ln in self.http("GET", "/metrics").get("body", "").splitlines()
                    if ln.startswith(("vllm:num_requests_", "vllm:kv_cache_usage",
                                      "vllm:num_preemptions"))]

        for label, n, deadline, wait in (("one_block_shorter", length - step, 90, 0),
                                         ("exact_length", length, 30, 15)):
            body = {"model": served, "prompt": [1000 + i % 1000 for i in range(n - 1)],
                    "max_tokens": 1, "temperature": 0}
            with ThreadPoolExecutor(1) as pool:  # the metrics while the request is in flight
                pending = pool.submit(self.http, "POST", "/v1/completions", body,
                                      timeout=deadline)
                time.sleep(wait)
                during = metrics()
                r = pending.result()
            r.update(tokens=n, metrics_after_s=wait, metrics=during)
            if r.get("status") == 200:
                r["usage"] = json.loads(r.pop("body")).get("usage")
            out[label] = r
        return out

    def heldout_part(self, cases: list[str] | None = None) -> None:
        """Sized models' memory lines at configurations the estimator was not fitted on,
        recorded in a call of their own: the HELD-OUT set (`cases`: some of them)."""
        s = self.spec()
        chosen = {n: HELD_OUT[n] for n in cases} if cases else HELD_OUT  # in the order named
        self.record("gpu_memory", self.gpu_memory_facts)
        self.record("sized_models", lambda: self.sized_models(
            {m for m, _ in chosen.values() if m in (DENSE_V, MOE_V)}))
        self.record("head_start", lambda: self.head_up(s))
        for name, (model, args) in chosen.items():
            self.record(name, lambda model=model, args=args: self.sized(model, args))
            if "auto" in args[args.index("--max-model-len") + 1:][:1]:
                self.record(name + "_edge", lambda name=name, model=model: self.auto_edge(
                    name, model))
        self.record("cleanup_heldout", lambda: {r: self.remove(s, r) for r in (commands.VLLM,
                                                                              commands.HEAD)})

    def load_part(self) -> None:
        """A rank frozen with requests in flight, and vLLM's memory lines for the MoE and the
        hybrid (Qwen3-Next) models."""
        s = self.spec(vllm_args=("--max-model-len", "4096", "--gpu-memory-utilization", "0.5"))
        self.probe_dir.mkdir(parents=True, exist_ok=True)
        self.record("head_start", lambda: self.head_up(s))
        self.record("serve_for_load", lambda: {**self.vllm_up(s),
                                               "log": self.container_log(s, commands.VLLM)})
        self.record("frozen_inflight", lambda: self.frozen(s, s.served_name, load=64,
                                                           seconds=25, max_tokens=4000,
                                                           settle_s=0.5))
        self.record("kv_moe_util05", lambda: self.memory(s, (
            "--max-model-len", "2048", "--gpu-memory-utilization", "0.5"),
            model="spark-vllm/tiny-moe"))
        self.record("kv_hybrid_util05", lambda: self.memory(s, (
            "--max-model-len", "2048", "--gpu-memory-utilization", "0.5",
            "--additional-config", '{"gdn_prefill_backend": "triton"}'),
            model="spark-vllm/tiny-hybrid"))
        self.record("cleanup_load", lambda: {r: self.remove(s, r) for r in (commands.VLLM,
                                                                           commands.HEAD)})

    def memory_part(self) -> None:
        """vLLM's memory lines for configurations the estimator (components/memory_estimate.py)
        was not fitted on: other utilizations, batch limits, a longer context, fp8 KV on MoE."""
        s = self.spec(vllm_args=("--max-model-len", "2048", "--gpu-memory-utilization", "0.3"))
        self.record("head_start", lambda: self.head_up(s))
        self.record("stage", lambda: self.stage(s))
        cases = {
            "kv_dense_util03_seqs256_batch2048": ("spark-vllm/tiny-dense", (
                "--max-model-len", "2048", "--gpu-memory-utilization", "0.3",
                "--max-num-seqs", "256", "--max-num-batched-tokens", "2048")),
            "kv_dense_util07_len8192": ("spark-vllm/tiny-dense", (
                "--max-model-len", "8192", "--gpu-memory-utilization", "0.7")),
            "kv_moe_util03_fp8": ("spark-vllm/tiny-moe", (
                "--max-model-len", "2048", "--gpu-memory-utilization", "0.3",
                "--kv-cache-dtype", "fp8")),
            "kv_hybrid_util03_len4096": ("spark-vllm/tiny-hybrid", (
                "--max-model-len", "4096", "--gpu-memory-utilization", "0.3",
                "--additional-config", '{"gdn_prefill_backend": "triton"}')),
        }
        for name, (model, args) in cases.items():
            self.record(name, lambda model=model, args=args: self.memory(s, args, model=model))
        self.record("cleanup_memory", lambda: {r: self.remove(s, r) for r in (commands.VLLM,
                                                                             commands.HEAD)})

    def parser_cases(self, s: specmod.ClusterSpec) -> dict:
        """How `vllm serve`'s parser reads flags the program owns or refuses, without an
        engine: vLLM's own parser in one process, and the CLI's exit code for two refusals."""
        code = (
            "import json, sys\n"
            "try:\n"
            "    from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
            "    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "    parse = lambda argv: make_arg_parser(FlexibleArgumentParser()).parse_args(argv)\n"
            "except ImportError:  # vllm-sim (the CPU run): its own `vllm serve` parser\n"
            "    from vllm_sim.cli import build_parser_v2\n"
            "    from vllm_sim.serve_flags import flexible_argv\n"
            "    parse = lambda argv: build_parser_v2().parse_args(flexible_argv(['serve', *argv]))\n"
            "cases = json.loads(sys.argv[1]); res = {}\n"
            "for name, argv in cases.items():\n"
            "    try:\n"
            "        a = parse(argv)\n"
            "        res[name] = {'tp': a.tensor_parallel_size, 'pp': a.pipeline_parallel_size,"
            " 'dp': a.data_parallel_size, 'nnodes': getattr(a, 'nnodes', None),"
            " 'backend': a.distributed_executor_backend}\n"
            "    except SystemExit as e:\n"
            "        res[name] = {'exit': e.code}\n"
            "print(json.dumps(res))\n")
        m = s.model  # make_arg_parser is `serve`'s own parser: its argv starts at the model
        cases = {"-t 4": [m, "-t", "4"],
                 "--tensor_parallel_size 3": [m, "--tensor_parallel_size", "3"],
                 "--tensor-parallel 5": [m, "--tensor-parallel", "5"],
                 "-dp 2": [m, "-dp", "2"],
                 "--nnodes 2 ray": [m, "--nnodes", "2", "--distributed-executor-backend", "ray"],
                 "--disable-log-requests": [m, "--disable-log-requests"],
                 "--no-such-flag": [m, "--no-such-flag"]}
        env = {**os.environ, **self.image_env}
        result: dict[str, Any] = {}
        with ThreadPoolExecutor(3) as pool:
            parsed = pool.submit(subprocess.run, [sys.executable, "-c", code, json.dumps(cases)],
                                 capture_output=True, text=True, env=env, timeout=240)
            clis = {flag: pool.submit(subprocess.run, ["vllm", "serve", m, flag],
                                      capture_output=True, text=True, env=env, timeout=240)
                    for flag in ("--disable-log-requests", "--no-such-flag")}
            p = parsed.result()
            try:
                result["parsed"] = json.loads(p.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                result["parsed_error"] = (p.stdout + p.stderr)[-1500:]
            for flag, fut in clis.items():
                r = fut.result()
                result[f"cli {flag}"] = {"exit": r.returncode,
                                         "stderr_tail": r.stderr.strip().splitlines()[-3:]}
        return result

    def routes(self) -> dict:
        out: dict[str, Any] = {}
        body = {"model": "x", "prompt": "hi", "max_tokens": 1}
        for method, path in ROUTES:
            b = body if method == "POST" else None
            out[f"{method} {path}"] = {"no_key": self.http(method, path, b, key=False)["status"],
                                       "with_key": self.http(method, path, b)["status"]}
        out["WS /v1/realtime"] = {"no_key": ws_status(self.port, "/v1/realtime", None),
                                  "with_key": ws_status(self.port, "/v1/realtime", API_KEY)}
        return out

    def rank_env(self) -> dict:
        seen = []
        for f in sorted(self.probe_dir.glob("*.json")):
            d = json.loads(f.read_text())
            seen.append({"actor": bool(d.get("actor")), "cmdline": d["cmdline"][:120],
                         "env": {k: d["env"].get(k) for k in ENV_KEYS}})
        sim = self.http("GET", "/sim/ranks") if not any(p["actor"] for p in seen) else {}
        return {"processes": seen,
                "sim_ranks": json.loads(sim["body"]).get("ranks", []) if sim.get("status") == 200
                else [],
                "vllm_container_only": ["NCCL_SOCKET_IFNAME=vllm-only0",
                                        "HF_TOKEN=hf_vllm_container_only",
                                        "SPARK_OBS_CARRIED=from-the-vllm-container"]}

    def tool_calls(self, served: str) -> dict:
        tool = {"type": "function", "function": {
            "name": "get_time", "description": "the time in a zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                                     "enum": ["utc", "cet"]}},
                           "required": ["zone"], "additionalProperties": False}}}
        named = self.chat(served, {"tools": [tool], "tool_choice": {
            "type": "function", "function": {"name": "get_time"}}}, max_tokens=64)
        auto = self.chat(served, {"tools": [tool], "tool_choice": "auto"}, max_tokens=16)
        return {"named": named, "auto": auto}

    def busy(self, s: specmod.ClusterSpec, served: str) -> dict:
        """A long queue: many long requests at once; metrics, a canary and the liveness read
        meanwhile."""
        body = {"model": served, "max_tokens": 1500, "ignore_eos": True,
                "messages": [{"role": "user", "content": "go on"}]}
        samples: list[dict] = []
        with ThreadPoolExecutor(64) as pool:
            futs = [pool.submit(self.http, "POST", "/v1/chat/completions", body, True, 300)
                    for _ in range(300)]
            start = now()
            time.sleep(1.0)
            side = ThreadPoolExecutor(1)  # not behind the 300 queued requests
            live = side.submit(self.liveness, s)
            canary = self.canary(served, 30)
            while not all(f.done() for f in futs) and now() - start < 60:
                samples.append({"t": round(now() - start, 2), **self.metrics()})
                time.sleep(1.0)
            done = sum(1 for f in futs if f.done() and f.result().get("status") == 200)
            live_r = live.result()
            side.shutdown()
        return {"requests": 300, "max_tokens": 1500, "answered": done, "canary": canary,
                "liveness_while_busy": {"state": live_r.get("state"), "seen": live_r.get("seen"),
                                        "seconds": live_r.get("seconds")},
                "samples": samples[:60], "seconds": round(now() - start, 2)}

    def frozen(self, s: specmod.ClusterSpec, served: str, load: int, seconds: int,
               max_tokens: int = 1500, settle_s: float = 3.0) -> dict:
        pid = self.rank_pid()
        if pid is None:
            return {"runner_error": "no rank process found"}
        body = {"model": served, "max_tokens": max_tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": "go on"}]}
        samples: list[dict] = []
        with ThreadPoolExecutor(max(load, 1) + 2) as pool:
            loads = [pool.submit(self.http, "POST", "/v1/chat/completions", body, True, 120)
                     for _ in range(load)]
            if load:
                time.sleep(settle_s)
            before = self.metrics()
            os.kill(pid, signal.SIGSTOP)
            start = now()
            canary = pool.submit(self.canary, served, 30)
            live = pool.submit(self.liveness, s)
            while now() - start < seconds:
                samples.append({"t": round(now() - start, 2),
                                 "health": self.http("GET", "/health", timeout=3)["status"],
                                 **self.metrics()})
                time.sleep(2.0)
            canary_r, live_r = canary.result(), live.result()
            os.kill(pid, signal.SIGCONT)
            resumed = now()
            after = self.canary(served, 60)
            answered = sum(1 for f in loads if f.result().get("status") == 200)
        return {"load_answered": answered, "rank_pid": pid, "load": load, "frozen_s": seconds, "before": before,
                "samples": samples, "canary_while_frozen": canary_r,
                "liveness_while_frozen": {"state": live_r.get("state"), "seen": live_r.get("seen"),
                                          "seconds": live_r.get("seconds")},
                "canary_after_sigcont": after, "recovered_in_s": round(now() - resumed, 2)}

    def kill_rank(self, s: specmod.ClusterSpec) -> dict:
        pid = self.rank_pid()
        if pid is None:
            return {"runner_error": "no rank process found"}
        name = commands.container_name(s, commands.VLLM)
        os.kill(pid, signal.SIGKILL)
        start = now()
        health: list[list[Any]] = []
        last = "start"
        while now() - start < 60:
            st = self.docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                             name).stdout.strip()
            code = self.http("GET", "/health", key=False, timeout=1)["status"]
            if [code, st] != last:
                health.append([round(now() - start, 2), code, st])
                last = [code, st]
            if st.startswith("exited"):
                break
            time.sleep(0.2)
        return {"health_and_state": health, "final": last,
                "liveness_after": self.liveness(s).get("state"),
                "log": self.container_log(s, commands.VLLM)}

    def sigterm(self, s: specmod.ClusterSpec) -> dict:
        name = commands.container_name(s, commands.VLLM)
        self.docker("kill", "-s", "TERM", name)
        start = now()
        while now() - start < 60:
            st = self.docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                             name).stdout.strip()
            if st.startswith("exited"):
                return {"exited_after_s": round(now() - start, 2), "state": st,
                        "log": self.container_log(s, commands.VLLM)[-8:]}
            time.sleep(0.2)
        return {"exited_after_s": None, "state": st}

    def bad_host_ip(self, s: specmod.ClusterSpec) -> dict:
        """VLLM_HOST_IP not an address of this machine while Ray is right (the runner's
        override: the program cannot render this, spec invariant 1)."""
        self.remove(s, commands.VLLM)
        bad = {commands.container_name(s, commands.VLLM): {"VLLM_HOST_IP": "10.255.255.3"}}
        r = self.vllm_up(s, bad)
        r["log"] = self.container_log(s, commands.VLLM)
        if r["rc"] == 0:
            r["chat"] = self.chat(s.served_name)
        return r


# the seeds' serving flags: Qwen3.5's reasoning and tool-call parsers; the GDN prefill kernel
# that runs without flashinfer (which does not travel)
GDN = ("--additional-config", '{"gdn_prefill_backend": "triton"}')
QWEN35_ARGS = ("--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
               "--tool-call-parser", "qwen3_coder", *GDN)
Q35, DENSE_V, MOE_V, MOE_F = ("spark-vllm/qwen35-fp8", "spark-vllm/qwen3-vocab",
                              "spark-vllm/qwen3moe-vocab", "spark-vllm/qwen3moe-fp8")
LMO = ("--language-model-only",)
# Triton's JIT cache kept across containers (each start would compile the MoE kernels again);
# DeepGEMM off: its warmup JIT-compiles ~1250 kernels (over 5 minutes, seen on the first
# qwen35 call), and a DGX Spark's GB10 (SM 12.1) does not run DeepGEMM anyway
SIZED_ENV = {"TRITON_CACHE_DIR": "/root/vllm-cache/triton", "VLLM_USE_DEEP_GEMM": "0",
             "VLLM_MOE_USE_DEEP_GEMM": "0", "VLLM_DEEP_GEMM_WARMUP": "skip"}
FITTED = {
    "fit_qwen35_lmonly_util05": (Q35, (*QWEN35_ARGS, *LMO, "--max-model-len", "32768",
                                       "--gpu-memory-utilization", "0.5")),
    "fit_dense_vocab_util05": (DENSE_V, ("--max-model-len", "8192",
                                         "--gpu-memory-utilization", "0.5")),
    "fit_moe_vocab_util05": (MOE_V, ("--max-model-len", "8192",
                                     "--gpu-memory-utilization", "0.5")),
    "fit_moe_fp8_util05": (MOE_F, ("--max-model-len", "8192",
                                   "--gpu-memory-utilization", "0.5")),
}
HELD_OUT = {
    "held_qwen35_util02_auto": (Q35, (*QWEN35_ARGS, "--max-model-len", "auto",
                                      "--gpu-memory-utilization", "0.2")),
    "held_qwen35_util09_len262144": (Q35, (*QWEN35_ARGS, "--max-model-len", "262144",
                                           "--gpu-memory-utilization", "0.9")),
    "held_moe_fp8_util03_len16384": (MOE_F, ("--max-model-len", "16384",
                                             "--gpu-memory-utilization", "0.3")),
    "held_moe_fp8_util085_kvfp8": (MOE_F, ("--max-model-len", "32768",
                                           "--gpu-memory-utilization", "0.85",
                                           "--kv-cache-dtype", "fp8")),
    "held_dense_vocab_util08_seqs128": (DENSE_V, ("--max-model-len", "8192",
                                                  "--gpu-memory-utilization", "0.8",
                                                  "--max-num-seqs", "128")),
    "held_qwen35_lmonly_util07_batch4096": (Q35, (*QWEN35_ARGS, *LMO, "--max-model-len",
                                                  "65536", "--gpu-memory-utilization", "0.7",
                                                  "--max-num-batched-tokens", "4096")),
    "held_moe_vocab_util025": (MOE_V, ("--max-model-len", "4096",
                                       "--gpu-memory-utilization", "0.25")),
    # call 3: the dense real vocabulary where the sampler (V2 runner) outweighs the forward,
    # and --max-model-len auto where the full 262144 does not fit (the null-block edge)
    "held_dense_vocab_util02_len16384": (DENSE_V, ("--max-model-len", "16384",
                                                   "--gpu-memory-utilization", "0.2")),
    "held_qwen35_util0066_auto": (Q35, (*QWEN35_ARGS, "--max-model-len", "auto",
                                        "--gpu-memory-utilization", "0.066")),
    # call 4: the same with --max-num-seqs under its Mamba cache blocks (call 3's refusal),
    # so that it serves and the request of exactly its length is tried; Qwen3-MoE FP8 at the
    # goal's lowest utilization
    "held_qwen35_util0066_auto_seqs64": (Q35, (*QWEN35_ARGS, "--max-model-len", "auto",
                                               "--gpu-memory-utilization", "0.066",
                                               "--max-num-seqs", "64")),
    "held_moe_fp8_util02_len8192": (MOE_F, ("--max-model-len", "8192",
                                            "--gpu-memory-utilization", "0.2")),
}


def ws_status(port: int, path: str, key: str | None) -> Any:
    """The websocket handshake's answer: 101 accepted, else the HTTP status it refused with."""
    req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           "Sec-WebSocket-Version: 13\r\n"
           + (f"Authorization: Bearer {key}\r\n" if key else "") + "\r\n")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(req.encode())
            line = sock.recv(4096).decode(errors="replace").split("\r\n", 1)[0]
        return int(line.split()[1])
    except (OSError, ValueError, IndexError) as err:
        return f"{type(err).__name__}"


def _version(pkg: str) -> str:
    try:
        import importlib.metadata as md
        return md.version(pkg)
    except Exception:  # noqa: BLE001
        return "none"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", choices=["serve", "restart", "load", "cache", "memory", "qwen35",
                                       "heldout", "qwen35-heldout", "all"], default="all")
    ap.add_argument("--site", default="/root/site")
    ap.add_argument("--hf", default="/root/hf")
    ap.add_argument("--vllm-cache", default="/root/vllm-cache")
    ap.add_argument("--shim-dir", default="/root/shim-bin")
    ap.add_argument("--ip", default="")
    ap.add_argument("--cases", default="", help="heldout: these HELD_OUT cases, comma-separated")
    ap.add_argument("--image-env", default="", help="JSON: more image env (the CPU dry run)")
    args = ap.parse_args()
    tier = Tier(args)
    tier.header(args.part)
    if args.part in ("serve", "all"):
        tier.serve_part()
    if args.part in ("restart", "all"):
        tier.restart_part()
    if args.part == "load":  # GPU only: the memory lines need real vLLM
        tier.load_part()
    if args.part == "cache":  # GPU only: real compile times
        tier.cache_part()
    if args.part == "memory":  # GPU only: the memory lines need real vLLM
        tier.memory_part()
    if args.part == "qwen35":  # GPU only: the seeds' class served, the fitted memory set
        tier.qwen35_part()
    if args.part == "heldout":  # GPU only: the held-out memory set, a call of its own
        tier.heldout_part([c for c in args.cases.split(",") if c])
    if args.part == "qwen35-heldout":  # the seeds' class served, then the held-out set
        tier.qwen35_part(fitted=False)
    tier.save()


if __name__ == "__main__":
    main()
