"""Several models on one 2-node lab, behind one gateway, on the real engine, in order:

1. one `pulumi up` serves two models (one across both nodes, one on node-2 alone) behind the
   gateway on node-1; /v1/models lists both; each answers through it; the API key is required
   on the gateway and on each model's own server; `status` and `top` read each model;
   `status --watch` repairs a dead model without restarting the other or the gateway;
2. a change to one model's vllmArgs restarts that model's containers alone (docker's ids and
   start times on the nodes);
3. a third model that does not fit beside them (the lab's simulated GPU memory) is refused
   with the per-node table, before any container: nothing on the nodes changed;
4. destroy leaves no container of the stack on any node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from lab import cluster, config, faults, images, nodes
from lab.run import Progress
from tests.integration.conftest import API_KEY, _teardown, start_lab
from tests.integration.engine import (
    REPO,
    STACK,
    Lab,
    Run,
    chat,
    containers,
    engine_env,
    node_sh,
    watch_until_repaired,
)
from tests.integration.test_day2 import status
from tests.integration.test_native import summary_of

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
GIB_MIB = 1024
MODELS = [
    {"name": "big", "model": "Qwen/Qwen3.5-122B-A10B-FP8", "servedModelName": "big",
     "tensorParallelSize": 2, "vllmArgs": ["--gpu-memory-utilization", "0.5"]},
    {"name": "small", "model": "Qwen/Qwen3.5-122B-A10B-FP8", "servedModelName": "small",
     "tensorParallelSize": 1, "nodes": ["node-2"],
     "vllmArgs": ["--gpu-memory-utilization", "0.3"]},
]


def ok(run: Run) -> Run:
    assert run.error is None, run.failure()
    return run


@pytest.fixture(scope="module")
def lab2m() -> Iterator[Lab]:
    lab = None
    try:
        lab = start_lab(2)
        head = cluster.find_node("node-1")
        # the gateway's image (LiteLLM from PyPI, built once per its files) on the head only
        nodes.load_inner_image([head], images.ensure_gateway_image(Progress(quiet=True)))
        for key in ("model", "tensorParallelSize", "pipelineParallelSize"):
            lab.stack.remove_config(f"spark-vllm:{key}")
        lab.set_all({"backend": "native", "joinTimeout": 60, "models": MODELS,
                     "gateway": {"image": config.GATEWAY_IMAGE, "imagePull": "never"}})
        yield lab
    finally:
        _teardown(lab)


def get(url: str, key: str | None) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, None


def by_name() -> dict[str, Any]:
    return {c.name: c for c in containers(NODES)}


def test_one_up_serves_two_models_behind_one_endpoint(lab2m: Lab) -> None:
    ok(lab2m.up())
    out = lab2m.outputs()
    endpoint = out["endpoint"]
    assert endpoint == f"http://{cluster.find_node('node-1').mgmt_ip}:8000/v1"
    status, listed = get(f"{endpoint}/models", API_KEY)
    assert status == 200 and sorted(m["id"] for m in listed["data"]) == ["big", "small"]
    # each model answers through the gateway: vllm-sim names the ranks' nodes in its reply
    fabric = {n.name: n.fabric_ip for n in cluster.info().nodes}
    big = chat(endpoint, "big", API_KEY)
    assert fabric["node-1"] in big and fabric["node-2"] in big, big
    small = chat(endpoint, "small", API_KEY)
    assert fabric["node-2"] in small and fabric["node-1"] not in small, small
    # the key on the gateway and on each model's own server
    assert get(f"{endpoint}/models", None)[0] == 401
    assert get(f"{endpoint}/models", "wrong")[0] == 401
    for m in out["models"].values():
        assert get(f"{m['endpoint']}/models", None)[0] == 401, m
        assert get(f"{m['endpoint']}/models", API_KEY)[0] == 200, m
    names = by_name()
    assert {f"spark-vllm-{STACK}-gateway", f"spark-vllm-{STACK}.big-vllm-leader",
            f"spark-vllm-{STACK}.big-vllm-rank", f"spark-vllm-{STACK}.small-vllm-leader"} \
        <= set(names)
    assert all(c.running for c in names.values())


def test_status_and_top_read_each_model_at_its_own_server(lab2m: Lab) -> None:
    """`status` names each model's verdict; `top --once` shows a block per model with its own
    vLLM's metrics (the endpoint is the gateway, which has none), and never the key."""
    rc, report = status()
    assert rc == 0, report
    assert {k: m["state"] for k, m in report["models"].items()} == {"big": "serving",
                                                                   "small": "serving"}, report
    chat(lab2m.outputs()["endpoint"], "small", API_KEY)  # tokens for small's counters
    proc = subprocess.run([sys.executable, "-m", "spark_vllm.cli", "top", "--stack", STACK,
                           "--once"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **engine_env()}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    screen = proc.stdout
    for block in ("model big (big) on node-1, node-2: SERVING\n    requests: ",
                  "model small (small) on node-2: SERVING\n    requests: "):
        assert block in screen, screen
    print(screen)  # with -s: the screen docs/operations.md shows
    assert "metrics: unreachable" not in screen and API_KEY not in screen, screen


def test_the_watcher_repairs_a_dead_model_without_restarting_the_other(lab2m: Lab) -> None:
    """small's server killed: `status --watch` names small, repairs it with `pulumi up
    --refresh`, and big's containers and the gateway keep their ids and start times."""
    before = by_name()
    small = f"spark-vllm-{STACK}.small-vllm-leader"
    node_sh("node-2", f"docker kill {small}")
    text = "".join(watch_until_repaired("--interval", "1", "--max-repairs", "1"))
    assert "repaired: serving again" in text, text[-3000:]
    assert "model small" in text and "model big" not in text.split("repairing")[0], text[-3000:]
    after = by_name()
    changed = {n for n in before if (before[n].id, before[n].started)
               != (after[n].id, after[n].started)}
    assert changed == {small}, changed
    assert all(c.running for c in after.values()), after
    assert chat(lab2m.outputs()["endpoint"], "small", API_KEY)


def test_a_change_to_one_model_restarts_it_alone(lab2m: Lab) -> None:
    before = by_name()
    models = json.loads(json.dumps(MODELS))
    models[1]["vllmArgs"] = [*models[1]["vllmArgs"], "--max-num-seqs", "8"]
    lab2m.set("models", models)
    # the PR summary of the real preview: the one model's server, on its node, and nothing else
    text = summary_of(lab2m)
    restarts = [line for line in text.splitlines() if " replace " in line
                and any(f"  {role}  " in line for role in ("vLLM", "vLLM rank", "gateway"))]
    assert len(restarts) == 1 and restarts[0].startswith("node-2 · small"), text
    assert "vllmArgs: --gpu-memory-utilization 0.3 → --gpu-memory-utilization 0.3 " \
        "--max-num-seqs 8" in text, text
    # the memory check runs again on the head, saying which model's estimate changed
    check = next(line for line in text.splitlines() if "memory check" in line)
    assert check.startswith("node-1 ") and "models[small].--max-num-seqs" in check, text
    ok(lab2m.up())
    after = by_name()
    changed = {n for n in before if (before[n].id, before[n].started)
               != (after[n].id, after[n].started)}
    assert changed == {f"spark-vllm-{STACK}.small-vllm-leader"}, changed
    assert chat(lab2m.outputs()["endpoint"], "small", API_KEY)


def test_a_third_model_that_does_not_fit_is_refused_with_the_per_node_table(lab2m: Lab) -> None:
    for n in NODES:  # 100 GiB, 95 GiB free: the lab's vLLM-sim holds none of it
        faults.set_gpu_memory(cluster.find_node(n), 100 * GIB_MIB, 95 * GIB_MIB)
    try:
        before = by_name()
        models = lab2m.get("models")
        third = {"name": "third", "model": "Qwen/Qwen3.5-122B-A10B-FP8",
                 "servedModelName": "third", "tensorParallelSize": 1, "nodes": ["node-2"],
                 "vllmArgs": ["--gpu-memory-utilization", "0.4"]}
        lab2m.set("models", [*models, third])
        run = lab2m.up()
        assert run.error is not None
        text = "\n".join(run.output)
        assert "The models do not fit together" in text, text[-3000:]
        assert "node-2: total 100.0 GiB" in text, text[-3000:]
        for line in ("big: 0.5 × 100.0 = 50.0 GiB", "small: 0.3 × 100.0 = 30.0 GiB",
                     "third: 0.4 × 100.0 = 40.0 GiB"):
            assert line in text, line
        assert "does not fit" in text
        after = by_name()
        assert {n: (c.id, c.started) for n, c in after.items()} == \
            {n: (c.id, c.started) for n, c in before.items()}
        assert not any("third" in n for n in after)
    finally:
        for n in NODES:
            faults.clear_gpu_memory(cluster.find_node(n))
        lab2m.set("models", [m for m in lab2m.get("models") if m["name"] != "third"])


def test_destroy_leaves_nothing(lab2m: Lab) -> None:
    ok(lab2m.destroy())
    assert containers(NODES) == []
