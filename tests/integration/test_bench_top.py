"""`spark-vllm bench` and `spark-vllm top` on a 2-node lab, as a user runs them.

bench: the first run is the stack's baseline (JSON, Markdown, PNG written; the tokenizer read
from the head's staged model); an image change to a build whose vllm-sim was told to play a
slower engine (VLLM_SIM_STEP_S baked into the image, built on the head and copied by
imageStaging copy) is named by the second run as a regression, with both figures and the image
change. The API key never shows in what it prints.

top: the live view in a real terminal (tmux: the pane captured as the user sees it) says
serving, then wedged while node-2's rank is frozen, serving once it is thawed, then names
node-2 unreachable while it is cut (powered off); q quits it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import cluster, config
from tests.integration.conftest import API_KEY, _teardown, start_lab
from tests.integration.engine import REPO, STACK, Lab, engine_env, node_sh
from tests.integration.test_day2 import status
from tests.integration.test_lifecycle import assert_serving, lab_identities, ok

pytestmark = pytest.mark.integration

SLOW = "spark-vllm-sim:lab-slow"
TMUX = "spark-vllm-top-test"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = None
    try:
        lab = start_lab(2)
        ok(lab.up())
        assert_serving(lab, lab_identities())
        # a healthy stack's status names no image mismatch and reads the compile cache (it
        # once read the image's id with the cache's section after it: a mismatch on every node)
        code, report = status()
        assert code == 0 and report["image"]["mismatch"] == {}, report
        yield lab
    finally:
        subprocess.run(["tmux", "kill-session", "-t", TMUX], capture_output=True)
        _teardown(lab)


def bench(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_vllm.cli", "bench", "--stack", STACK, "--profile",
         "quick", "--corpus", str(REPO / "README.md"), "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, **engine_env()},
        timeout=600)


def test_bench_keeps_a_baseline_and_names_a_slower_image(lab: Lab, tmp_path: Path) -> None:
    first = bench(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "this run is the baseline of stack" in first.stdout, first.stdout
    runs = sorted(tmp_path.glob("2*.json"))
    assert len(runs) == 1 and (tmp_path / "baseline.json").exists()
    assert runs[0].with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    base = json.loads((tmp_path / "baseline.json").read_text())
    assert set(base["figures"]) == {"1", "2", "4"}
    assert all(f["errors"] == 0 and f["outputTokensPerS"] > 0 for f in base["figures"].values())
    assert base["deployment"]["image"]["name"] == config.INNER_IMAGE
    assert API_KEY not in first.stdout + first.stderr + runs[0].read_text()

    # an image change: the same image with vllm-sim told to play an engine 4x slower, built on
    # the head and copied to node-2 by the program (only what node-2 lacks: the config)
    node_sh("node-1", f"printf 'FROM {config.INNER_IMAGE}\\nENV VLLM_SIM_STEP_S=0.08\\n' | "
                      f"DOCKER_BUILDKIT=0 docker build -q -t {SLOW} -", timeout=120)
    lab.set_all({"image": SLOW, "imageStaging": "copy"})
    ok(lab.up())
    second = bench(tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    regressions = [ln for ln in second.stdout.splitlines() if ln.startswith("REGRESSION ")]
    assert any("output" in ln and "tok/s" in ln for ln in regressions), second.stdout
    assert f"- image {config.INNER_IMAGE} (" in second.stdout and f"→ {SLOW} (" in second.stdout
    assert "- imageStaging: unset → copy" in second.stdout, second.stdout
    # with --strict a regression is exit 1 (for a script after `pulumi up`)
    strict = subprocess.run(
        [sys.executable, "-m", "spark_vllm.cli", "bench", "--stack", STACK, "--profile",
         "quick", "--corpus", str(REPO / "README.md"), "--out", str(tmp_path), "--strict"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, **engine_env()},
        timeout=600)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    lab.set_all({"image": config.INNER_IMAGE, "imageStaging": "pull"})
    ok(lab.up())


def lab_cmd(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "lab", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def pane() -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", TMUX], capture_output=True,
                          text=True, timeout=10).stdout


def wait_screen(says: str, deadline_s: float) -> str:
    end = time.monotonic() + deadline_s
    while True:
        screen = pane()
        if says in screen:
            return screen
        if time.monotonic() > end:
            raise AssertionError(f"the screen never said {says!r} in {deadline_s:.0f} s:\n"
                                 f"{screen}")
        time.sleep(1)


def test_top_shows_serving_a_cut_node_and_a_frozen_rank(lab: Lab) -> None:
    env = {**engine_env(), "TERM": "xterm-256color", "PYTHONPATH": str(REPO)}
    command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                        shlex.quote(sys.executable), "-m", "spark_vllm.cli", "top", "--stack",
                        STACK, "--interval", "2"])
    subprocess.run(["tmux", "new-session", "-d", "-s", TMUX, "-x", "150", "-y", "45",
                    f"cd {shlex.quote(str(REPO))} && {command}"], check=True, timeout=30)
    screen = wait_screen("vLLM SERVING", 90)
    assert "node-1  " in screen and "node-2  " in screen and "tokens/s:" in screen, screen
    assert API_KEY not in screen

    lab_cmd("wedge", "node-2")  # every vLLM rank process on node-2 stopped (SIGSTOP)
    try:
        screen = wait_screen("vLLM WEDGED", 120)
        assert "Traceback" not in screen
    finally:
        lab_cmd("wedge", "node-2", "--thaw")
    wait_screen("vLLM SERVING", 120)

    cluster.power_off(["node-2"])
    try:
        screen = wait_screen("node-2  UNREACHABLE", 120)
        assert "Traceback" not in screen
    finally:
        cluster.power_on(["node-2"])
    subprocess.run(["tmux", "send-keys", "-t", TMUX, "q"], check=True, timeout=10)
    end = time.monotonic() + 20
    while subprocess.run(["tmux", "has-session", "-t", TMUX],
                         capture_output=True).returncode == 0:
        assert time.monotonic() < end, "q did not quit top:\n" + pane()
        time.sleep(0.5)
