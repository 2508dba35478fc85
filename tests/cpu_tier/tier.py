"""What the CPU tier's tests share: its venv (lab/cpu_tier/install.sh) and a run of its runner
(lab/cpu_tier/runner.py) that leaves nothing behind however it ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.config import REPO_DIR
from lab.cpu_tier.nodes import Nodes

INSTALL_DEADLINE_S = 1200  # a cold install (~6 min) when CI did not install first


def installed(script: str) -> str:
    """A venv the tier's install script makes (cached: ~0 s): the script's last line."""
    inst = subprocess.run(["bash", str(REPO_DIR / "lab/cpu_tier" / script)],
                          capture_output=True, text=True, timeout=INSTALL_DEADLINE_S)
    assert inst.returncode == 0, inst.stdout[-2000:] + inst.stderr[-3000:]
    return inst.stdout.strip().splitlines()[-1]


def cpu_venv() -> str:
    """The tier's venv: real vLLM for CPUs (install.sh)."""
    return installed("install.sh")


def gateway_venv() -> str:
    """LiteLLM's venv, the several part's gateway image (gateway_venv.sh)."""
    return installed("gateway_venv.sh")


def run_runner(argv: list[str], deadline_s: float, what: str) -> subprocess.CompletedProcess[str]:
    """The runner under a deadline. It takes its nodes down itself; when subprocess.run kills it
    first (at the deadline, or on Ctrl-C: make test's INT), its teardown never runs, so this
    takes them down."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s)
    except KeyboardInterrupt:
        Nodes().down()
        raise
    except subprocess.TimeoutExpired as err:
        Nodes().down()
        pytest.fail(f"{what} ran past {deadline_s} s:\n{str(err.stdout)[-4000:]}")


def run_against_sim(out: Path, parts: tuple[str, ...], version: str, deadline_s: float,
                    what: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The runner's `parts` with vllm-sim playing `version` as the image (this checkout's
    .venv), on a generated tiny-dense model: its observations, after checking it left nothing
    behind on the machine."""
    hf = out / "hf"  # the simulator reads the files' names and sizes, not their weights
    subprocess.run([sys.executable, str(REPO_DIR / "lab/model_gen.py"), "--hf-home", str(hf),
                    "--repo", "spark-vllm/tiny-dense", "--size", "1000000", "--shards", "2"],
                   check=True, capture_output=True, timeout=120)
    argv = [sys.executable, str(REPO_DIR / "lab/cpu_tier/runner.py"), "--out", str(out),
            "--venv", sys.prefix, "--hf", str(hf), "--sim", version, *extra]
    for part in parts:
        argv += ["--part", part]
    proc = run_runner(argv, deadline_s, what)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert json.loads((out / "leftovers.json").read_text()) == []
    observed: dict[str, Any] = json.loads((out / "observations-cpu.json").read_text())
    return observed
