"""A wedged vLLM is seen and repaired, a busy one is left alone, a dead rank is dead, and the
watcher stops before it loops on the GPU — on the real engine against a 2-node lab whose
vllm-sim wedges as real vLLM 0.26.0 did with a rank frozen (tests/fixtures/real-vllm/).

Each scenario asserts what is left on the nodes (docker's container ids, by role) and what the
engine planned, not only exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import API_KEY, _teardown, start_lab
from tests.integration.engine import (
    REPO,
    STACK,
    Lab,
    Run,
    containers,
    engine_env,
    node_sh,
    read_until,
)
from tests.integration.test_day2 import HEAD, VLLM, WORKER, by_role, by_role_loose, status
from tests.integration.test_lifecycle import assert_serving, lab_identities, ok

pytestmark = pytest.mark.integration

CANARY_S, WINDOW_S = 3, 6
WEDGED = f"wedged: no token for the canary in {CANARY_S} s, none generated in {WINDOW_S} s"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = None
    try:
        lab = start_lab(2)
        lab.set("canaryTimeout", CANARY_S)
        lab.set("wedgeWindow", WINDOW_S)
        # two requests per engine step, as a loaded server with a small --max-num-seqs: a
        # flood queues, and a canary waits behind it while tokens flow
        lab.set("vllmArgs", ["--max-num-seqs", "2"])
        ok(lab.up())
        assert_serving(lab, lab_identities())
        yield lab
    finally:
        _teardown(lab)


def lab_cmd(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "lab", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def endpoint(lab: Lab) -> str:
    return str(lab.outputs()["endpoint"])


def long_request(base: str, tokens: int) -> int:
    body = {"model": "Qwen/Qwen3.5-122B-A10B-FP8", "prompt": "go on", "max_tokens": tokens,
            "ignore_eos": True}
    req = urllib.request.Request(f"{base}/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status


COMMANDS = {"ray-head", "ray-worker-node-2", "ray-gate", "vllm-serve"}


def planned(run: Run) -> set[str]:
    """The container commands (and the gate) a preview would replace."""
    return {n for n, op in run.changed().items() if op != "refresh" and n in COMMANDS}


def replaced(run: Run) -> set[str]:
    return {s.name for s in run.steps if s.phase == "done" and s.op == "create-replacement"
            } & COMMANDS


def refreshed_away(run: Run) -> set[str]:
    """The liveness companions whose refresh read another state than the one recorded."""
    return {s.name for s in run.steps if s.op == "refresh" and "state" in s.diffs}


def test_1_a_long_queue_on_a_healthy_vllm_is_busy_and_not_replaced(lab: Lab) -> None:
    before = by_role()
    base = endpoint(lab)
    with ThreadPoolExecutor(6) as pool:
        # 6 requests of 2000 tokens against 2 slots: ~5 s each in vllm-sim (400 tokens/s, as real
        # vLLM 0.26.0 paced), 3 rounds (~15 s):
        # the canary of the status below waits in the queue while tokens flow
        flood = [pool.submit(long_request, base, 2000) for _ in range(6)]
        time.sleep(1.0)
        code, report = status()
        run = ok(lab.preview(refresh=True))
        answered = [f.result() for f in flood]
    assert answered == [200] * 6
    assert report["vllm"]["state"] == "busy", report  # not "serving": the queue was seen
    assert code == 0 and report["serving"], report
    # nothing to replace: busy is running
    assert refreshed_away(run) == set() and planned(run) == set(), run.changed()
    assert by_role() == before


def test_2_a_frozen_rank_is_named_wedged_and_one_up_refresh_serves_again_keeping_ray(
        lab: Lab) -> None:
    before = by_role()
    lab_cmd("wedge", "node-2")
    try:
        t0 = time.monotonic()
        preview = ok(lab.preview(refresh=True))
        seen_after = time.monotonic() - t0
        text = "\n".join(preview.output)
        assert WEDGED in text, text[-3000:]
        assert refreshed_away(preview) == {"vllm-serve-liveness"}, preview.changed()
        assert planned(preview) == {"vllm-serve"}, preview.changed()  # Ray is healthy: kept
        code, report = status()
        assert code == 1 and report["vllm"]["state"] == "wedged", report
        assert by_role() == before  # a preview changes nothing
        up = ok(lab.up(refresh=True))
    finally:
        lab_cmd("wedge", "node-2", "--thaw")  # a no-op when the repair's new ranks run
    after = by_role()
    assert {k for k in before if before[k] != after[k]} == {VLLM}
    assert after[HEAD] == before[HEAD] and after[WORKER] == before[WORKER]
    assert replaced(up) == {"vllm-serve"}, up.ops("done")
    assert_serving(lab, lab_identities())
    print(f"wedge named by preview --refresh after {seen_after:.1f} s; repaired in "
          f"{up.seconds:.1f} s")


def test_3_a_dead_rank_makes_vllm_exit_0_which_reads_dead_and_is_repaired(lab: Lab) -> None:
    before = by_role()
    out = node_sh("node-2", f"docker exec spark-vllm-{STACK}-ray-worker sh -c "
                            "'pkill -KILL -f \"^ray::(RayWorkerProc|RaySimWorker)\"'", check=False)
    deadline = time.monotonic() + 60
    state = ""
    while time.monotonic() < deadline:
        state = node_sh("node-1", f"docker inspect --format '{{{{.State.Status}}}} "
                                  f"{{{{.State.ExitCode}}}}' spark-vllm-{STACK}-vllm").strip()
        if state.startswith("exited"):
            break
        time.sleep(0.5)
    assert state == "exited 0", (state, out)
    code, report = status()
    assert code == 1 and report["vllm"]["state"] == "dead", report
    assert "exited (0)" in report["vllm"]["seen"]
    preview = ok(lab.preview(refresh=True))
    assert refreshed_away(preview) == {"vllm-serve-liveness"}, preview.changed()
    assert planned(preview) == {"vllm-serve"}, preview.changed()
    up = ok(lab.up(refresh=True))
    assert replaced(up) == {"vllm-serve"}, up.ops("done")
    after = by_role()
    assert after[VLLM] != before[VLLM]
    assert_serving(lab, lab_identities())


def watch(*extra: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_vllm.status", "--stack", STACK, "--watch",
         "--interval", "1", *extra], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, **engine_env()}, timeout=timeout)


def test_4_a_node_whose_memory_did_not_come_back_is_refused_with_its_numbers(lab: Lab) -> None:
    """vLLM dies; node-2's (simulated) GPU has 20 GiB free of 121.7 GiB after it stopped:
    the watcher refuses to restart, names the node and the numbers, and changes nothing."""
    lab_cmd("gpu-memory", "node-2", "--total-gib", "121.7", "--free-gib", "20")
    try:
        node_sh("node-1", f"docker kill spark-vllm-{STACK}-vllm")
        before = by_role_loose()
        w = watch("--memory-wait", "4")
        assert w.returncode == 3, w.stdout[-3000:]  # stopped for a person
        assert "refusing to restart vLLM: the memory did not come back" in w.stdout
        assert ("node-2: GPU 0: 20.0 GiB free of 121.7 GiB (nvidia-smi); vLLM needs 0.9 × "
                "121.7 = 109.5 GiB free to start") in w.stdout, w.stdout[-3000:]
        assert "repairing" not in w.stdout
        assert by_role_loose() == before  # nothing started, nothing removed
    finally:
        lab_cmd("gpu-memory", "node-2", "--clear")
    ok(lab.up(refresh=True))
    assert_serving(lab, lab_identities())


def test_5_the_watcher_stops_after_max_repairs_in_its_window_and_says_why(lab: Lab) -> None:
    """One repair allowed per window: vLLM dies, is repaired; dies again: the watcher stops,
    saying a node may need a reboot, instead of restarting vLLM again and again."""
    watcher = subprocess.Popen(
        [sys.executable, "-m", "spark_vllm.status", "--stack", STACK, "--watch",
         "--interval", "1", "--max-repairs", "1", "--repair-window", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env={**os.environ, **engine_env()})
    killed_again = []

    def on_line(line: str) -> bool:
        if "repaired: serving again" in line and not killed_again:
            node_sh("node-1", f"docker kill spark-vllm-{STACK}-vllm")
            killed_again.append(True)
        return "stopping:" in line

    try:
        node_sh("node-1", f"docker kill spark-vllm-{STACK}-vllm")
        # a repair (~20 s), a second death, its failed repair: minutes at most
        lines = read_until(watcher, on_line, deadline_s=300)
        assert watcher.wait(timeout=60) == 3  # stopped for a person
    finally:
        if watcher.poll() is None:
            watcher.terminate()
            watcher.wait(timeout=30)
    text = "".join(lines)
    assert "repaired: serving again (1 repair(s)" in text, text[-3000:]
    assert "stopping: 1 repairs in the last 10 min and still not serving" in text
    assert "eugr/spark-vllm-docker#257" in text and "reboot" in text
    assert text.count("repairing: pulumi up --refresh") == 1
    ok(lab.up(refresh=True))
    assert_serving(lab, lab_identities())




def test_6_a_context_that_cannot_fit_is_refused_before_any_container_and_one_that_fits_serves(
        lab: Lab) -> None:
    """The lab declares each node's GPU memory (a simulated nvidia-smi: 12 GiB, all free). The
    lab model's config (Qwen3-MoE shape: 48 full-attention layers, 4 KV heads of 128) at TP 2
    needs 48 KiB of KV per token per rank: its default 262144-token context wants 12 GiB per
    rank, more than 0.9 x 12 GiB leaves. Refused from a clean slate with the table and the
    longest context that fits; that context serves."""
    ok(lab.destroy())
    args = lab.get("vllmArgs")
    for node in ("node-1", "node-2"):
        lab_cmd("gpu-memory", node, "--total-gib", "12", "--free-gib", "12")
    try:
        run = lab.up()
        assert run.error is not None
        text = run.error + "\n".join(run.output)
        assert "vLLM would not fit at --gpu-memory-utilization 0.9 with --max-model-len 262144" \
            in text, text[-3000:]
        assert re.search(r"node-2 +\| +12\.00 \| +[\d.]+ \| +12\.00 \| +-[\d.]+", text), text
        longest = int(re.search(r"fits on every node: (\d+)\.", text)[1])  # type: ignore[index]
        assert 65536 < longest < 262144
        assert containers(["node-1", "node-2"]) == []  # no container on any node
        lab.set("vllmArgs", [*args, "--max-model-len", str(longest)])
        fits = ok(lab.up())
        assert re.search(r"memory: node-2: fits: 12\.0 GiB free", "\n".join(fits.output))
        summary = lab.outputs()["memory"]
        assert summary["checked"] and summary["maxModelLen"] == longest
        assert_serving(lab, lab_identities())
    finally:
        for node in ("node-1", "node-2"):
            lab_cmd("gpu-memory", node, "--clear")
        lab.set("vllmArgs", args)
