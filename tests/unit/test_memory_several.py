"""The memory admission of several models (`models:`), run for real on a one-node stack as
tests/unit/test_memory_check.py runs it: every model placed on a node, in start order, each
seeing the memory the ones before it took; the refusal's per-node table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from spark_vllm.components import memory_check, node_memory
from spark_vllm.components.spec import parse_spec
from tests.unit.harness import MOE_MODEL as MODEL  # in tests/unit/conftest.py's `hf`
from tests.unit.harness import pinned

GIB = 1 << 30


def spec(hf: Path, utils: list[float]) -> Any:
    return parse_spec({
        "nodes": pinned([{"name": "spark-a", "host": "127.0.0.1"}]), "image": "vllm/image:1",
        "backend": "native", "hfCache": str(hf), "modelStaging": "copy",
        "gateway": {"image": "litellm:1"},
        "models": [{"name": f"m{i}", "model": MODEL, "servedModelName": f"m{i}",
                    "tensorParallelSize": 1,
                    "vllmArgs": ["--gpu-memory-utilization", str(u), "--max-model-len", "4096"]}
                   for i, u in enumerate(utils)]}, "t", frozenset({"sshPrivateKey"}))


def run_check(tmp: Path, hf: Path, utils: list[float], smi: str,
              running: dict[str, float] | None = None) -> subprocess.CompletedProcess[str]:
    s = spec(hf, utils)
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{smi}'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    # `docker inspect NAME`: running, with its args, for the containers in `running`
    cases = "".join(
        f"  *{name}*) echo 'true {json.dumps(['serve', 'm', '--gpu-memory-utilization', str(u)])}';"
        " exit 0 ;;\n" for name, u in (running or {}).items())
    (bin_dir / "docker").write_text(f'#!/bin/sh\ncase "$*" in\n{cases}esac\nexit 1\n')
    (bin_dir / "docker").chmod(0o755)
    return subprocess.run(["sh", "-c", memory_check.script(s)],
                          input=memory_check.stdin(s, "KEY"), capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp)}, timeout=60)


def test_models_that_fit_together_pass_and_each_sees_what_the_ones_before_left(
        tmp_path: Path, hf: Path) -> None:
    proc = run_check(tmp_path, hf, [0.5, 0.3], "24576, 24000")
    assert proc.returncode == 0, proc.stderr
    node = json.loads(proc.stdout.splitlines()[-1])["nodes"]["spark-a"]
    total = 24576 << 20
    assert node["models"]["m0"]["freeAtStart"] == 24000 << 20
    assert node["models"]["m1"]["freeAtStart"] == (24000 << 20) - int(0.5 * total)
    assert all(m["fits"] for m in node["models"].values())


def test_a_set_that_does_not_fit_is_refused_with_every_models_share_and_the_total(
        tmp_path: Path, hf: Path) -> None:
    proc = run_check(tmp_path, hf, [0.5, 0.3, 0.4], "24576, 24000")
    assert proc.returncode == 1
    err = proc.stderr
    assert "The models do not fit together" in err
    assert "spark-a: total 24.0 GiB, free now 23.4 GiB" in err
    for line in ("m0: 0.5 × 24.0 = 12.0 GiB", "m1: 0.3 × 24.0 = 7.2 GiB",
                 "m2: 0.4 × 24.0 = 9.6 GiB",
                 "together: 1.2 × total = 28.8 GiB of 23.4 GiB free — does not fit"):
        assert line in err, err
    # the third is the one that cannot start: vLLM's own words for it
    assert "spark-a m2:" in err and "is less than desired GPU memory utilization (0.4" in err


def test_the_stacks_own_running_models_count_as_theirs(tmp_path: Path, hf: Path) -> None:
    """Both running (their memory is used now), unchanged or replaced by this up: the set is
    checked as it will run, not refused for the memory it already holds."""
    used = 24000 - int(0.8 * 24576)
    refused = run_check(tmp_path, hf, [0.5, 0.3], f"24576, {used}")
    assert refused.returncode == 1
    held = run_check(tmp_path, hf, [0.5, 0.3], f"24576, {used}",
                     running={"t.m0-vllm-leader": 0.5, "t.m1-vllm-leader": 0.3})
    assert held.returncode == 0, held.stderr


def test_start_order_free_is_the_free_memory_less_the_earlier_shares() -> None:
    assert node_memory.start_order_free(100, 90, 0.0, [("a", 0.5), ("b", 0.3)]) == [
        ("a", 90), ("b", 40)]
    # what the stack's running models hold comes back, never above the total
    assert node_memory.start_order_free(100, 10, 0.8, [("a", 0.5), ("b", 0.3)]) == [
        ("a", 90), ("b", 40)]
    assert node_memory.start_order_free(100, 50, 0.8, [("a", 0.5)]) == [("a", 100)]
