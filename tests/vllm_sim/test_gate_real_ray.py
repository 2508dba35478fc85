"""The readiness gate (components/scripts/ray_gate.py) against a real two-node Ray on loopback.

Run exactly as the gate command runs it on the head: `python3 - PAYLOAD` with the program on
stdin. It must read Ray's node table without registering a job (a job makes the head's raylet
prestart Python workers while the cluster is still coming up), and fail within its bound with
the expected-vs-seen table when a node is missing.
"""

import json
import subprocess
import sys
import time

import pytest
from vsim_harness import HEAD_IP, WORKER_IP, clean_env

from spark_vllm.components.render.backends import ray as ray_backend

pytestmark = pytest.mark.slow

ABSENT_IP = "127.0.0.9"


def run_gate(cluster, expected: list[dict], timeout: int) -> subprocess.CompletedProcess:
    payload = json.dumps({"expected": expected, "timeout": timeout, "address": cluster.address,
                          "preflight": []})
    return subprocess.run([sys.executable, "-", payload], input=ray_backend.gate_program(),
                          capture_output=True, text=True, env=clean_env(), timeout=timeout + 60)


def job_count(cluster) -> int:
    script = ("import sys, ray\nfrom ray._private import state\n"
              "from ray._raylet import GcsClientOptions\ng = state.GlobalState()\n"
              "g._initialize_global_state(GcsClientOptions.create(sys.argv[1], None, "
              "allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))\n"
              "print(len(g.job_table()))\n")
    out = subprocess.run([sys.executable, "-c", script, cluster.address], capture_output=True,
                         text=True, env=clean_env(), timeout=60, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_gate_reads_the_table_without_registering_a_job(cluster):
    before = job_count(cluster)
    done = run_gate(cluster, [{"name": "a", "ip": HEAD_IP, "gpus": 1},
                              {"name": "b", "ip": WORKER_IP, "gpus": 1}], timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        {"name": "a", "ip": HEAD_IP, "gpus": 1}, {"name": "b", "ip": WORKER_IP, "gpus": 1}]
    assert "Ray's node table matches the spec" in done.stderr
    assert "using ray.init" not in done.stderr  # the GCS path worked on this Ray
    assert job_count(cluster) == before  # no driver: the raylet prestarts no workers


def test_gate_fails_within_its_bound_naming_the_missing_node(cluster):
    start = time.monotonic()
    done = run_gate(cluster, [{"name": "a", "ip": HEAD_IP, "gpus": 1},
                              {"name": "c", "ip": ABSENT_IP, "gpus": 1}], timeout=5)
    took = time.monotonic() - start
    assert done.returncode == 1
    assert "does not match the spec after 5 s" in done.stderr
    row = next(line for line in done.stderr.splitlines() if line.startswith("c "))
    assert row.split()[:4] == ["c", ABSENT_IP, "1", "MISSING"]
    unexpected = next(line for line in done.stderr.splitlines() if WORKER_IP in line)
    assert unexpected.startswith("(not in spec)")
    assert took < 5 + 15  # the bound, plus Python and Ray's import on a busy 2-CPU machine
