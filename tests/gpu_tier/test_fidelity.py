"""vllm-sim held to real vLLM: the GPU tier's runner, run here against vllm-sim playing the
recorded version, must show every fact the program depends on as real vLLM showed it on the
GPU machine (tests/fixtures/real-vllm/vllm-<version>.json, lab/gpu/facts.py).

The runner is the same program both times: the program's own rendered head, gate, staging,
vLLM, probe, liveness and remove scripts, through lab/gpu/docker_shim.py (one mount namespace
per container; needs root, as CI has). Here the "image" is this machine's .venv, whose `vllm`
is vllm-sim. The runner's parts run one by one, as on the GPU machine (serve, restart, cache),
so that each scenario is compared with the real one of the same part, in the same vLLM
configuration; the facts are reported by group (one test each)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "gpu"))
import facts  # noqa: E402
import merge  # noqa: E402

# the fidelity recordings: vllm-<version>.json (other recordings there, such as the memory
# lines of vllm-0.26.0-qwen35.json, are not played against the simulator)
RECORDED = sorted(p for p in (REPO / "tests" / "fixtures" / "real-vllm").glob("vllm-*.json")
                  if re.fullmatch(r"vllm-\d+\.\d+\.\d+", p.stem))
# the runner's parts this machine runs, in the GPU machine's order, each with its deadline
# (seconds; a part that runs past it fails the test with what the runner printed)
PARTS = {"serve": 420, "restart": 360, "cache": 300}
# Machine paths the runner uses as it does on the GPU machine (runner.py, lab/gpu/envprobe):
# the env probe's output, and the cache part's compileCache. Each run starts them empty.
ENVPROBE_DIR = Path("/root/obs/envprobe")
NODE_COMPILE_CACHE = Path("/root/node-compile-cache/gpu")


def group(fact: str) -> str:
    """A fact's group: "compile cache, cache_first_start: torch.compile" -> "compile cache"."""
    return fact.split(":", 1)[0].split(",", 1)[0]


GROUPS = sorted({group(k) for path in RECORDED for k in facts.facts(facts.load(path))})


def install_envprobe(site: Path) -> None:
    """The env probe as lab/gpu/device.sh installs it: a vLLM general plugin in the image's
    site dir, found through its entry point."""
    probe = REPO / "lab" / "gpu" / "envprobe"
    site.mkdir(parents=True, exist_ok=True)
    shutil.copy(probe / "spark_vllm_envprobe.py", site)
    dist = site / "spark_vllm_envprobe-0.0.0.dist-info"
    dist.mkdir(exist_ok=True)
    shutil.copy(probe / "entry_points.txt", dist)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spark-vllm-envprobe\n"
                                   "Version: 0.0.0\n")


def reset_machine_dirs() -> None:
    """Nothing a previous run left: the probe's files name processes, and the cache part's
    first start must find the node's compile cache empty (as the GPU machine's was)."""
    if ENVPROBE_DIR.is_dir():
        for f in ENVPROBE_DIR.glob("*.json"):
            f.unlink()
    shutil.rmtree(NODE_COMPILE_CACHE, ignore_errors=True)


def remove_containers(tmp: Path) -> None:
    """What a part that failed midway left running (its containers' processes: Ray, vLLM)."""
    state = tmp / "state"
    names = [d.name for d in state.iterdir()] if state.is_dir() else []
    if names:
        subprocess.run([sys.executable, str(REPO / "lab/gpu/docker_shim.py"), "rm", "--force",
                        *names], env={**os.environ, "SHIM_STATE": str(state),
                                      "SHIM_VOLUMES": str(tmp / "vols")},
                       capture_output=True, timeout=120)


def run_part(tmp: Path, part: str, version: str, hf: Path, work: Path) -> Path:
    env = {**os.environ, "SHIM_STATE": str(tmp / "state"), "SHIM_VOLUMES": str(tmp / "vols"),
           "PYTHONUNBUFFERED": "1"}
    out = tmp / f"out-{part}"
    out.mkdir()
    # the simulator's load and compile sleeps short: start times are the hardware's, never
    # compared (facts.timings); what a compile or a cache load is, is
    image_env = {"VLLM_SIM_VLLM_VERSION": version, "VLLM_SIM_LOAD_SECONDS": "0.2",
                 "VLLM_SIM_COMPILE_S": "0.3"}
    try:
        proc = subprocess.run(
            [sys.executable, str(REPO / "lab/gpu/runner.py"), "--out", str(out), "--part", part,
             "--site", str(work / "site"), "--hf", str(hf),
             "--vllm-cache", str(work / "vllm-cache"), "--shim-dir", str(tmp / "shim"),
             "--image-env", json.dumps(image_env)],
            env=env, capture_output=True, text=True, timeout=PARTS[part])
    except subprocess.TimeoutExpired as err:
        text = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (
            err.stdout or "")
        pytest.fail(f"runner part {part} ran past {PARTS[part]} s:\n{text[-3000:]}")
    (tmp / f"runner-{part}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / f"observations-{version}-{part}.json"


@pytest.fixture(scope="module", params=RECORDED, ids=lambda p: p.stem)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    real = facts.facts(facts.load(request.param))
    version = request.param.stem.split("-", 1)[1]
    tmp = tmp_path_factory.mktemp(f"tier-{version}")
    # the runner's machine dirs outside /tmp, as on the GPU machine (/root/site,
    # /root/vllm-cache): a container's /tmp is its own, so what is under the host's /tmp is
    # not in a container
    work = Path(tempfile.mkdtemp(prefix="spark-vllm-tier-", dir="/var/tmp"))
    try:
        install_envprobe(work / "site")
        hf = tmp / "hf"
        subprocess.run([sys.executable, str(REPO / "lab/model_gen.py"), "--hf-home", str(hf),
                        "--repo", "spark-vllm/tiny-dense", "--size", "1000000", "--shards", "2"],
                       check=True, capture_output=True, timeout=120)
        reset_machine_dirs()
        parts = [(part, run_part(tmp, part, version, hf, work)) for part in PARTS]
        sim = merge.merge(parts)
        (tmp / f"observations-{version}.json").write_text(json.dumps(sim, indent=1))
        yield real, facts.facts(sim, site=str(work / "site"),
                                vllm_cache=str(work / "vllm-cache"))
    finally:
        remove_containers(tmp)
        shutil.rmtree(work, ignore_errors=True)
        reset_machine_dirs()


def test_there_is_a_recorded_real_vllm() -> None:
    assert RECORDED, "no tests/fixtures/real-vllm/vllm-*.json"
    header = facts.load(RECORDED[0])["header"]
    assert "H200" in header["gpu"] and header["vllm"] == RECORDED[0].stem.split("-", 1)[1]


def test_every_part_a_fact_reads_was_recorded() -> None:
    """The parts the facts read were run on the GPU (the sim runs the same parts)."""
    for path in RECORDED:
        parts = {r["part"] for r in facts.load(path)["header"]["runs"].values()}
        assert {"serve", "restart", "cache"} <= parts, parts


@pytest.mark.parametrize("name", GROUPS)
def test_vllm_sim_shows_every_fact_as_real_vllm_did(pair: tuple[dict, dict], name: str) -> None:
    want, got = pair
    diff = {k: {"real": want[k], "sim": got.get(k, "(not seen)")}
            for k in want if group(k) == name and got.get(k, "(not seen)") != want[k]}
    extra = sorted(k for k in got if group(k) == name and k not in want)
    assert not diff and not extra, json.dumps({"differ": diff, "only in the sim": extra},
                                              indent=1)
