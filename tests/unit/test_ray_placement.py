"""Issue 46: the vLLM command fails on vLLM's "Waiting for creating a placement group" line only
when Ray's own state shows the group cannot be placed (components/scripts/ray_gate.py
`placement`); a group that is merely slow to place is waited for, each 10 s saying what Ray
reports.

The decision is checked on real Ray 2.60.0's answers (tests/fixtures/ray-placement/, recorded by
lab/ray_placement_record.py from a two-node Ray cluster: the seeds' pin, more GPUs than the
cluster, another job's group holding the GPUs, an actor holding them, the group placed once the
actor ended); the vLLM command's wait on a fake docker whose `placement` answers are the test's.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spark_vllm.components.render import commands as c
from spark_vllm.components.render.backends import ray as ray_backend
from tests.unit.test_commands import duo, run_with_fake_docker

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "components" / "scripts"))
import ray_gate  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ray-placement" / "ray-2.60.0.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
# vLLM 0.26.0's line, as the GPU tier recorded it (TP 2 on one GPU), and the seeds' (V1 executor)
LINE_TP2 = ("INFO 12-01 10:00:00 [ray_utils.py:228] Waiting for creating a placement group of "
            "specs for 10 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status` and "
            "`ray list nodes` to see if you have enough resources, and make sure the IP "
            "addresses used by ray cluster are the same as VLLM_HOST_IP environment variable "
            "specified in each node if you are running on a multi-node.")
LINE_PIN = ("Waiting for creating a placement group of specs for 10 seconds. "
            "specs=[{'node:192.168.200.12': 0.001, 'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status`")


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_verdict_on_real_rays_answers(name: str) -> None:
    case = CASES[name]
    verdict, why = ray_gate.placement_verdict(case["specs"], case["state"])
    assert verdict == case["expect"], why
    nodes = {n["NodeManagerAddress"] for n in case["state"]["nodes"] if n["Alive"]}
    if name == "node_pin_missing":  # names the pinned address and the nodes Ray has
        assert "node:10.99.0.10" in why and all(ip in why for ip in nodes)
    if name == "more_gpus_than_the_cluster":
        assert "asks Ray for 4 GPUs and Ray's cluster has 3" in why
    if name == "held_by_another_jobs_group":  # names the group and the job that holds it
        group = next(g for g in case["state"]["groups"].values() if g["state"] == "CREATED")
        assert group["name"] == "other-vllm" and group["creator_job"]
        assert f"placement group other-vllm ({group['placement_group_id']}" in why
        assert f"of job {group['creator_job']}" in why
    if name == "held_by_an_actor":  # slow, not impossible: what Ray says
        assert "the group is PENDING (NO_RESOURCES" in why and "outside placement groups" in why


def test_a_group_of_a_finished_job_is_waited_for() -> None:
    """The replaced vLLM's group, still CREATED a moment after its job ended (Ray removes it):
    the same state as another live job's, with that job dead, is a wait, not a failure."""
    state = copy.deepcopy(CASES["held_by_another_jobs_group"]["state"])
    holder = next(g for g in state["groups"].values() if g["state"] == "CREATED")
    for job in state["jobs"]:
        if job["JobID"] == holder["creator_job"]:
            job["IsDead"] = True
    verdict, why = ray_gate.placement_verdict([{"GPU": 1.0}, {"GPU": 1.0}], state)
    assert verdict == "wait" and "a finished job, which Ray is removing" in why


def test_a_node_that_has_the_pinned_address_is_waited_for() -> None:
    """The pin alone is no evidence: once Ray has a node under the address (the gate passed),
    a slow group is waited for."""
    state = copy.deepcopy(CASES["held_by_an_actor"]["state"])
    node = next(n for n in state["nodes"] if n["Alive"])
    node["Resources"]["node:10.99.0.10"] = 1.0
    for g in state["groups"].values():
        if g["state"] == "PENDING":
            g["bundles"]["0"] = {"GPU": 1.0, "node:10.99.0.10": 0.001}
    specs = [{"GPU": 1.0, "node:10.99.0.10": 0.001}, {"GPU": 1.0}]
    assert ray_gate.placement_verdict(specs, state)[0] == "wait"


def test_the_specs_are_read_from_vllms_line() -> None:
    assert ray_gate.parse_specs(LINE_TP2) == [{"GPU": 1.0}, {"GPU": 1.0}]
    assert ray_gate.parse_specs(LINE_PIN) == [{"node:192.168.200.12": 0.001, "GPU": 1.0},
                                             {"GPU": 1.0}]


def waiting(tmp_path: Path, rc: int, said: str, serve_after: float | None) -> dict[str, Any]:
    """The vLLM command with vLLM's waiting line in its log, the placement check answering
    `rc` / `said`, and the readiness probe serving after `serve_after` s (None: never)."""
    (tmp_path / "logs").write_text(LINE_PIN + "\n")
    (tmp_path / "placement-rc").write_text(str(rc))
    (tmp_path / "placement-said").write_text(said + "\n")
    if serve_after is None:
        (tmp_path / "exec-fails").touch()
    else:
        (tmp_path / "exec-sleep").write_text(str(serve_after))
    script = ray_backend.vllm_start_script(duo())
    t0 = time.monotonic()
    out = run_with_fake_docker(script, tmp=tmp_path, check=False, stdin=c.vllm_stdin(None))
    out["_seconds"] = [str(time.monotonic() - t0)]
    return out


def test_the_outage_fails_at_once_with_what_ray_said(tmp_path: Path) -> None:
    said = ("vLLM pins its placement group to node:192.168.200.12 (its VLLM_HOST_IP, "
            "192.168.200.12) and Ray has no node with that address: Ray's nodes are 10.1.230.180")
    out = waiting(tmp_path, ray_backend.PG_CANNOT_RC, said, serve_after=None)
    err = out["_stderr"][0]
    assert out["_rc"] == ["1"], err
    assert f"FAILED: vLLM is waiting for a Ray placement group that Ray cannot place: {said}" in err
    assert float(out["_seconds"][0]) < 10  # the first check, not vLLM's 1800 s
    calls = (tmp_path / "calls.exec").read_bytes().decode().split("\0")
    assert "placement" in calls and "/tmp/ray/spark-vllm/ray_gate.py" in calls
    head = duo().head.identity_ip  # Ray's GCS at the head's identity, as the gate reads it
    assert json.loads(calls[calls.index("placement") + 1]) == {"address": f"{head}:6379"}
    assert calls[calls.index("placement") + 2] == LINE_PIN  # vLLM's last waiting line


def test_a_slow_placement_is_waited_for_and_serves(tmp_path: Path) -> None:
    said = "GPUs free: 192.168.231.12 0/1; the group is PENDING (NO_RESOURCES, attempt 2)"
    out = waiting(tmp_path, 0, said, serve_after=3)
    err = out["_stderr"][0]
    assert out["_rc"] == ["0"], err
    assert f"vLLM waits for its Ray placement group; Ray says: {said}" in err
    assert "FAILED" not in err


def test_a_check_that_cannot_ask_ray_keeps_waiting(tmp_path: Path) -> None:
    """A traceback (exit 1) or a timeout of the check is no verdict: the start goes on."""
    out = waiting(tmp_path, 1, "Traceback ...\nConnectionError: GCS busy", serve_after=3)
    err = out["_stderr"][0]
    assert out["_rc"] == ["0"], err
    assert "asking Ray failed (exit 1: ConnectionError: GCS busy): waiting" in err


def test_the_gate_program_travels_in_vllms_stdin_and_into_the_head(tmp_path: Path) -> None:
    out = waiting(tmp_path, 0, "placed", serve_after=0)
    assert out["_rc"] == ["0"], out["_stderr"]
    copied = (tmp_path / "copied" / "ray_gate.py").read_text()
    assert copied == c.script_text("ray_gate.py")
    assert (tmp_path / "copied" / "spark_vllm_auth.py").read_text() == c.script_text(
        "spark_vllm_auth.py")  # the middleware ends where it did


def test_a_placed_group_is_said_once_and_not_asked_again(tmp_path: Path) -> None:
    """vLLM's waiting line stays in its log while it loads for minutes: once Ray says the group
    is placed, the command says so and stops asking (it would repeat that vLLM waits)."""
    out = waiting(tmp_path, 0, ray_backend.PLACED + " (no pending group of these specs)",
                  serve_after=3)
    err = out["_stderr"][0]
    assert out["_rc"] == ["0"], err
    assert err.count("vLLM's Ray placement group is placed") == 1
    assert "vLLM waits for its Ray placement group" not in err
    assert ray_backend.PLACED in ray_gate.placement_verdict(
        CASES["placed_after_the_actor"]["specs"], CASES["placed_after_the_actor"]["state"])[1]
