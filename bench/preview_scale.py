"""Scale of the program itself: `pulumi preview` wall time and peak memory for 2, 8, 32 nodes.

No lab needed: each size is a temporary stack (stacks/Pulumi.bench-<N>.yaml, fake addresses that
are never contacted — preview runs no remote command) in a scratch file backend, removed after.
Peak memory is the largest sum of RSS over the whole process tree (CLI, language host, program,
command provider), sampled every 50 ms from /proc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, WORK_DIR, run, say
from lab import envsh, keys

SIZES = (2, 8, 32)
SAMPLE_S = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree_rss(root: int) -> int:
    """Bytes of resident memory of root and all its descendants, now."""
    kids, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
        todo += kids.get(pid, [])
    return total


def measure(argv: list[str], env: dict[str, str], timeout: float = 600) -> tuple[float, int, int]:
    """(seconds, peak tree RSS bytes, exit code) of one command."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    seconds = time.monotonic() - t0
    done.set()
    sampler.join()
    if proc.returncode != 0:
        say(f"  preview failed: {err.strip().splitlines()[-3:] if err.strip() else proc.returncode}")
    return seconds, peak, proc.returncode


def fake_config(n: int) -> dict[str, Any]:
    nodes = [{"name": f"node-{i}", "host": f"10.254.{i // 250}.{i % 250 + 1}", "user": "root",
              "fabricIp": f"192.168.{i // 250}.{i % 250 + 1}",
              "fabricInterface": "enp1s0f1np1", "gpus": 1} for i in range(n)]
    ns = "spark-vllm:"
    return {"config": {
        f"{ns}nodes": nodes, f"{ns}image": "spark-vllm-sim:lab", f"{ns}imagePull": "never",
        f"{ns}model": "Qwen/Qwen3.5-122B-A10B-FP8", f"{ns}tensorParallelSize": n,
        f"{ns}pipelineParallelSize": 1, f"{ns}env": {"NCCL_DEBUG": "WARN"},
        f"{ns}dockerGpus": "none", f"{ns}checkGpu": False,
    }}


def _count_resources(stack: str, env: dict[str, str]) -> int:
    """Resources the preview plans (untimed, once): proof the program really ran."""
    proc = subprocess.run(["pulumi", "preview", "--json", "--stack", stack], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    try:
        return len(json.loads(proc.stdout).get("steps", []))
    except ValueError:
        return -1


def run_all(runs: int, sizes: tuple[int, ...] = SIZES) -> list[dict[str, Any]]:
    backend = WORK_DIR / "preview-state"
    shutil.rmtree(backend, ignore_errors=True)
    backend.mkdir(parents=True)
    env = {**envsh.sourced(), "PULUMI_BACKEND_URL": f"file://{backend}"}
    key = keys.client_key().read_text()
    records: list[dict[str, Any]] = []
    resources: dict[int, int] = {}
    files = []
    try:
        for n in sizes:
            stack = f"bench-{n}"
            path = REPO / "stacks" / f"Pulumi.{stack}.yaml"
            files.append(path)
            path.write_text(yaml.safe_dump(fake_config(n), sort_keys=False))
            for argv, stdin in ((["pulumi", "stack", "init", stack], None),
                                (["pulumi", "config", "set", "--secret", "--stack", stack,
                                  "spark-vllm:sshPrivateKey"], key)):
                res = run(argv, env=env, stdin=stdin, timeout=120)
                if not res.ok:
                    raise RuntimeError(f"{' '.join(argv)}: {res.tail()}")
            resources[n] = _count_resources(stack, env)
        for r in range(1, runs + 1):  # sizes interleaved, like the contenders
            for n in sizes:
                argv = ["pulumi", "preview", "--stack", f"bench-{n}", "--non-interactive"]
                seconds, peak, rc = measure(argv, env)
                say(f"  preview {n:2} nodes  run {r}  {seconds:6.2f} s  peak {peak / 2**20:6.0f} MiB"
                    f"{'' if rc == 0 else '  FAILED'}")
                records.append({"nodes": n, "run": r, "resources": resources[n],
                                "seconds": round(seconds, 3),
                                "peak_rss_mib": round(peak / 2**20, 1), "ok": rc == 0})
    finally:
        for n in sizes:
            run(["pulumi", "stack", "rm", "--yes", "--force", f"bench-{n}"], env=env, timeout=120)
        for path in files:
            path.unlink(missing_ok=True)
        shutil.rmtree(backend, ignore_errors=True)
    return records
