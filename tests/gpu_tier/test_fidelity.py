"""vllm-sim held to real vLLM: the GPU tier's runner, run here against vllm-sim playing the
recorded version, must show every fact the program depends on as real vLLM showed it on the
GPU machine (tests/fixtures/real-vllm/vllm-<version>.json, lab/gpu/facts.py).

The runner is the same program both times: the program's own rendered head, gate, staging,
vLLM, probe, liveness and remove scripts, through lab/gpu/docker_shim.py (one mount namespace
per container; needs root, as CI has). Here the "image" is this machine's .venv, whose `vllm`
is vllm-sim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "gpu"))
import facts  # noqa: E402
import merge  # noqa: E402

RECORDED = sorted((REPO / "tests" / "fixtures" / "real-vllm").glob("vllm-*.json"))


def run_tier(tmp: Path, version: str, hf: Path) -> dict[str, Any]:
    env = {**os.environ, "SHIM_STATE": str(tmp / "state"), "SHIM_VOLUMES": str(tmp / "vols"),
           "PYTHONUNBUFFERED": "1"}
    out = tmp / "out"
    out.mkdir()
    image_env = {"VLLM_SIM_VLLM_VERSION": version, "VLLM_SIM_LOAD_SECONDS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "lab/gpu/runner.py"), "--out", str(out), "--part", "all",
         "--site", str(tmp / "site"), "--hf", str(hf), "--vllm-cache", str(tmp / "vcache"),
         "--shim-dir", str(tmp / "shim"), "--image-env", json.dumps(image_env)],
        env=env, capture_output=True, text=True, timeout=900)
    (tmp / "runner.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    part = out / f"observations-{version}-all.json"
    return merge.merge([("sim", part)])


@pytest.fixture(scope="module", params=RECORDED, ids=lambda p: p.stem)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    real = facts.load(request.param)
    version = real["header"]["runs"] and real["runs"] and request.param.stem.split("-", 1)[1]
    tmp = tmp_path_factory.mktemp(f"tier-{version}")
    hf = tmp / "hf"
    subprocess.run([sys.executable, str(REPO / "lab/model_gen.py"), "--hf-home", str(hf),
                    "--repo", "spark-vllm/tiny-dense", "--size", "1000000", "--shards", "2"],
                   check=True, capture_output=True)
    return real, run_tier(tmp, version, hf)


def test_there_is_a_recorded_real_vllm() -> None:
    assert RECORDED, "no tests/fixtures/real-vllm/vllm-*.json"
    header = facts.load(RECORDED[0])["header"]
    assert "H200" in header["gpu"] and header["vllm"] == RECORDED[0].stem.split("-", 1)[1]


def test_vllm_sim_shows_every_fact_as_real_vllm_did(pair: tuple[dict, dict]) -> None:
    real, sim = pair
    want, got = facts.facts(real), facts.facts(sim)
    diff = {k: {"real": want[k], "sim": got.get(k)} for k in want if got.get(k) != want[k]}
    assert not diff, json.dumps(diff, indent=1)
