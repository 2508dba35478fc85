"""Records real Ray's answers for the placement check (components/scripts/ray_gate.py
`placement`): what `cluster_state` reads from the GCS while a placement group waits, in each
case the check must tell apart. Run with the repository's venv (its Ray is the lab's):

    .venv/bin/python lab/ray_placement_record.py OUT.json

A Ray cluster of two nodes on this machine (a head with 2 GPUs, a worker with 1: Ray takes
`--num-gpus` at its word), then, each case in a fresh job: a group pinned to `node:<an address
Ray does not have>` (the seeds' outage); a group of more GPUs than the cluster has; a group
whose GPUs another live job's group holds (another vLLM); a group whose GPUs an actor holds
(a slow but placeable start, which is then placed once the actor ends). Every wait is bounded;
the cluster is stopped at the end whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "components" / "scripts"))
import ray_gate  # noqa: E402

PORT = 6397
ADDRESS = f"127.0.0.1:{PORT}"
HOLDER = """
import sys, time, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
pg = placement_group([{"GPU": 1.0}, {"GPU": 1.0}], strategy="PACK", name="other-vllm")
ray.get(pg.ready(), timeout=30)
print("held", flush=True)
time.sleep(120)
"""


def ray_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", *args], check=True,
                   capture_output=True, timeout=120)


def wait_pending(specs: list[dict[str, float]], seconds: float = 20) -> dict:
    """The state once Ray has a PENDING group of `specs` (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    while True:
        state = ray_gate.cluster_state(ADDRESS)
        pending = [g for g in state["groups"].values() if g["state"] == "PENDING"]
        if pending or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def main(out: Path) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    env_ip = os.environ.get("RAY_NODE_IP", "127.0.0.1")
    ray_cli("stop", "--force")
    cases: dict[str, dict] = {}
    holder = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ray_cli("start", "--head", f"--port={PORT}", f"--node-ip-address={env_ip}",
                    "--num-gpus=2", "--num-cpus=2", "--include-dashboard=false",
                    f"--temp-dir={tmp}")
            ray_cli("start", f"--address={ADDRESS}", f"--node-ip-address={env_ip}",
                    "--num-gpus=1", "--num-cpus=1")
            ray.init(address=ADDRESS, logging_level="ERROR", log_to_driver=False)
            deadline = time.monotonic() + 30
            while len([n for n in ray.nodes() if n["Alive"]]) < 2:
                assert time.monotonic() < deadline, "the worker raylet did not join"
                time.sleep(0.5)

            def case(name: str, specs: list[dict[str, float]], expect: str) -> None:
                pg = placement_group(specs, strategy="PACK")
                state = wait_pending(specs)
                cases[name] = {"specs": specs, "expect": expect, "state": state,
                               "verdict": list(ray_gate.placement_verdict(specs, state))}
                print(name, cases[name]["verdict"], flush=True)
                remove_placement_group(pg)

            case("node_pin_missing", [{"GPU": 1.0, "node:10.99.0.10": 0.001}, {"GPU": 1.0}],
                 "cannot")
            case("more_gpus_than_the_cluster", [{"GPU": 1.0}] * 4, "cannot")
            holder = subprocess.Popen([sys.executable, "-c", HOLDER, ADDRESS],
                                      stdout=subprocess.PIPE, text=True)
            assert holder.stdout and holder.stdout.readline().strip() == "held"
            case("held_by_another_jobs_group", [{"GPU": 1.0}, {"GPU": 1.0}], "cannot")
            holder.kill()
            holder.wait(30)
            holder = None

            @ray.remote(num_gpus=2)
            class Hold:
                def ping(self) -> str:
                    return "ok"

            actor = Hold.remote()
            ray.get(actor.ping.remote(), timeout=60)
            specs = [{"GPU": 1.0}, {"GPU": 1.0}]
            pg = placement_group(specs, strategy="PACK")
            state = wait_pending(specs)
            cases["held_by_an_actor"] = {"specs": specs, "expect": "wait", "state": state,
                                         "verdict": list(ray_gate.placement_verdict(specs,
                                                                                    state))}
            print("held_by_an_actor", cases["held_by_an_actor"]["verdict"], flush=True)
            ray.kill(actor)
            ray.get(pg.ready(), timeout=60)  # the slow start: placed once the actor is gone
            state = ray_gate.cluster_state(ADDRESS)
            cases["placed_after_the_actor"] = {
                "specs": specs, "expect": "wait", "state": state,
                "verdict": list(ray_gate.placement_verdict(specs, state))}
            print("placed_after_the_actor", cases["placed_after_the_actor"]["verdict"])
            ray.shutdown()
    finally:
        if holder is not None:
            holder.kill()
        ray_cli("stop", "--force")
    out.write_text(json.dumps({"ray": ray.__version__, "cases": cases}, indent=1,
                              sort_keys=True, default=str) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
