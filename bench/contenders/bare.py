"""(c) The bare critical path: the floor. Only the unavoidable steps, over SSH, no checks.

Same image and the very same `docker run` lines as spark-vllm (components/render/commands.py), so the
difference to (a) is the engine, the checks and the waits, not the containers:

  head:    docker run … ray start --head --block;  poll its log for "Ray runtime started"
  workers: docker run … ray start --address …      poll their logs (all at once, one SSH each)
  head:    docker run … vllm serve …               the harness polls /health from outside

One SSH round-trip per step and node; the remote polls use the program's own interval
(commands.POLL_INTERVAL_S) so neither side wins on polling. It keeps no state: re-applying
anything means teardown + up; a vLLM-only change replaces the vLLM container alone.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import LOG_DIR, Lab, Node, Result, on_nodes, ssh
from bench.contenders import Contender, Outcome
from spark_vllm.components.render import commands
from spark_vllm.components.render.backends import ray as ray_backend
from spark_vllm.components.spec import NAMESPACE, ClusterSpec, decode_config, parse_spec

STACK_NAME = "bare"  # container names spark-vllm-bare-*: never the program's own


def stack_raw(stack_file: Path) -> dict[str, Any]:
    """The stack file's `spark-vllm:` config, decoded as the program decodes it (the CLI may
    store scalars as text), without namespace and secrets."""
    cfg = (yaml.safe_load(stack_file.read_text()) or {}).get("config", {})
    flat = {}
    for key, value in cfg.items():
        if key.startswith(NAMESPACE + ":") and not (isinstance(value, dict) and "secure" in value):
            flat[key] = value if isinstance(value, str) else json.dumps(value)
    raw, _ = decode_config(flat)
    return raw


def _bare_argv(argv: list[str]) -> list[str]:
    """The bare path has no secrets: drop `--env-file X` (an empty file would do the same) and
    spark-vllm's API-key middleware (`--middleware X`: its file is copied in by the program's
    vLLM command, which the bare path does not run; without the copy vLLM cannot start)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--env-file", "--middleware"):
            skip = True
        else:
            out.append(a)
    return out


def _run_and_wait(argv: list[str], name: str, timeout: float) -> str:
    """docker run, then wait for Ray's start line in its log: the only wait the floor needs.
    The deadline only keeps an abandoned loop from outliving the bench on the node."""
    mark = shlex.quote(ray_backend.RAY_STARTED_MARK)
    return (f"{shlex.join(_bare_argv(argv))} >/dev/null && "
            f"end=$(( $(date +%s) + {int(timeout)} )) && "
            f"until docker logs {shlex.quote(name)} 2>&1 | grep -q {mark}; do "
            f'[ "$(date +%s)" -lt "$end" ] || exit 124; '
            f"sleep {commands.POLL_INTERVAL_S}; done")


class Bare(Contender):
    name = "bare"
    label = "bare path"

    def __init__(self, lab: Lab, stack_file: Path) -> None:
        super().__init__(lab)
        self.stack_file = stack_file
        self.log = LOG_DIR / "bare.log"
        self.raw: dict[str, Any] = {}

    def prepare(self) -> None:
        # Read once: the lab's stack file is spark-vllm's to edit (and to remove at the end).
        self.raw = stack_raw(self.stack_file)
        self.spec()  # fail now, not mid-run, if it does not parse

    def spec(self) -> ClusterSpec:
        raw = dict(self.raw)
        raw["env"] = {**(raw.get("env") or {}), "NCCL_DEBUG": self.state.nccl_debug}
        raw["vllmArgs"] = ([] if self.state.max_model_len is None
                           else ["--max-model-len", str(self.state.max_model_len)])
        return parse_spec(raw, STACK_NAME, frozenset({"sshPrivateKey"}))

    def _names(self, node: Node) -> list[str]:
        spec = self.spec()
        roles = [commands.VLLM, commands.HEAD] if node == self.lab.head else [commands.WORKER]
        return [commands.container_name(spec, r) for r in roles]

    def _start_ray(self, timeout: float, steps: dict[str, float] | None = None
                   ) -> Result | None:
        """Head, then all workers at once; the failed Result, or None when all started.
        `steps`: each step's seconds go there (the head, the slowest worker)."""
        spec = self.spec()
        head = ssh(self.lab.head, _run_and_wait(ray_backend.head_run_argv(spec),
                                                commands.container_name(spec, commands.HEAD),
                                                timeout),
                   timeout=timeout + 5, log=self.log)
        if steps is not None:
            steps["ray_head_s"] = head.seconds
        if not head.ok:
            return head
        by_name = {n.name: n for n in spec.workers}
        workers = self.lab.nodes[1:]
        name = commands.container_name(spec, commands.WORKER)
        left = max(1.0, timeout - head.seconds)
        t0 = time.monotonic()
        results = on_nodes(workers, lambda n: _run_and_wait(
            ray_backend.worker_run_argv(spec, by_name[n.name]), name, left),
            timeout=left + 5, log=self.log)
        if steps is not None:
            steps["ray_workers_s"] = time.monotonic() - t0
        for res in results:
            if not res.ok:
                return res
        return None

    def _start_vllm(self) -> Result:
        argv = _bare_argv(ray_backend.vllm_run_argv(self.spec()))
        return ssh(self.lab.head, f"{shlex.join(argv)} >/dev/null", log=self.log)

    def up(self) -> Outcome:
        # the steps' seconds, for the report's side-by-side cold up (report.cold_up_parts):
        # what follows vLLM's `docker run` until /health answers is the harness's wait
        steps: dict[str, float] = {}
        failed = self._start_ray(timeout=120, steps=steps)
        if failed is not None:
            return Outcome(False, failed.tail(), {"steps": steps})
        res = self._start_vllm()
        steps["vllm_run_s"] = res.seconds
        return Outcome(res.ok, "" if res.ok else res.tail(), {"steps": steps})

    def reapply(self) -> Outcome:
        down = self.down()
        if not down.ok:
            return down
        return self.up()

    def set_env(self, value: str) -> Outcome:
        self.state.nccl_debug = value
        return self.reapply()

    def set_vllm_len(self, value: int) -> Outcome:
        self.state.max_model_len = value
        name = commands.container_name(self.spec(), commands.VLLM)
        rm = ssh(self.lab.head, f"docker rm -f -v {shlex.quote(name)} >/dev/null", log=self.log)
        if not rm.ok:
            return Outcome(False, rm.tail())
        res = self._start_vllm()
        return Outcome(res.ok, "" if res.ok else res.tail())

    def down(self) -> Outcome:
        results = on_nodes(self.lab.nodes, lambda n: "docker rm -f -v "
                           + " ".join(shlex.quote(x) for x in self._names(n))
                           + " >/dev/null 2>&1 || true", log=self.log)
        bad = [r for r in results if not r.ok]
        return Outcome(not bad, bad[0].tail() if bad else "")

    def join_failure(self, cap_s: float) -> tuple[float | None, Outcome]:
        # No check anywhere: the worker's wait never ends, the bare path never says why.
        t0 = time.monotonic()
        failed = self._start_ray(timeout=cap_s)
        seconds = time.monotonic() - t0
        if failed is not None and failed.rc != 124:
            return seconds, Outcome(True, "reported: " + failed.tail(3))
        return None, Outcome(True, f"nothing reported within {cap_s:.0f} s")

    def clean(self) -> None:
        self.down()
