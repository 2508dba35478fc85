"""The memory admission (components/memory_check.py, scripts/memory_check.py) run for real on
a one-node stack: its rendered script with its stdin (the key, the program, its helpers), a
PATH where `nvidia-smi` and `docker` say what the test wants, and a model in huggingface_hub's
layout made by lab/model_gen.py (a Qwen3-MoE config with valid safetensors headers)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from spark_vllm.components import memory_check
from spark_vllm.components.render.backends import ray as ray_backend
from tests.unit.harness import MOE_MODEL, spec_from

REPO = Path(__file__).resolve().parents[2]
MODEL = MOE_MODEL  # in tests/unit/conftest.py's `hf`
GIB = 1 << 30


def run_check(tmp: Path, hf: Path, vllm_args: list[str], smi: str | None,
              running_args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    spec = spec_from([{"name": "spark-a", "host": "127.0.0.1"}], hfCache=str(hf), model=MODEL,
                     modelStaging="copy", vllmArgs=vllm_args)
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{smi}'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    state = f"true {json.dumps(running_args)}" if running_args is not None else ""
    (bin_dir / "docker").write_text(f"#!/bin/sh\necho '{state}'\n[ -n '{state}' ]\n")
    (bin_dir / "docker").chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    return subprocess.run(["sh", "-c", memory_check.script(spec)],
                          input=memory_check.stdin(spec, "KEY"), capture_output=True, text=True,
                          env={"PATH": path, "HOME": str(tmp)}, timeout=60)


def test_a_context_that_does_not_fit_is_refused_with_the_table_and_the_longest_that_fits(
        tmp_path: Path, hf: Path) -> None:
    # 48 full-attention layers x 2 x 4 KV heads x 128 x 2 B = 96 KiB per token at TP 1:
    # 262144 tokens (the config's default) need 24 GiB, a 24 GiB GPU at 0.9 cannot hold it
    proc = run_check(tmp_path, hf, ["--gpu-memory-utilization", "0.9"], "24576, 24000")
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert "vLLM would not fit at --gpu-memory-utilization 0.9 with --max-model-len 262144" in err
    assert re.search(r"node +\| +free \| weights \| KV needed \| +left", err), err
    row = next(line for line in err.splitlines() if line.strip().startswith("spark-a |"))
    assert "24.00" in row  # the KV for 262144 tokens, in GiB
    longest = int(err.rsplit("fits on every node: ", 1)[1].split(".")[0])
    assert 100_000 < longest < 262144 and longest % 16 == 0
    # and that length does fit
    ok = run_check(tmp_path, hf, ["--gpu-memory-utilization", "0.9", "--max-model-len",
                                  str(longest)], "24576, 24000")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout.strip().splitlines()[-1])
    assert summary["checked"] and summary["maxModelLen"] == longest
    assert summary["kvPerToken"] == 48 * 2 * 4 * 128 * 2
    assert summary["nodes"]["spark-a"]["left"] >= 0


def test_free_memory_below_the_utilization_is_refused_as_vllm_would(
        tmp_path: Path, hf: Path) -> None:
    proc = run_check(tmp_path, hf, ["--gpu-memory-utilization", "0.9", "--max-model-len", "4k"],
                     "24576, 12000")
    assert proc.returncode == 1
    assert "is less than desired GPU memory utilization (0.9" in proc.stderr


def test_the_stacks_own_running_vllm_is_counted_as_free(tmp_path: Path, hf: Path) -> None:
    """Its memory comes back when the replacement stops it (before the new one starts)."""
    args = ["--gpu-memory-utilization", "0.5", "--max-model-len", "4096"]
    assert run_check(tmp_path, hf, args, "24576, 8000").returncode == 1
    held = run_check(tmp_path, hf, args, "24576, 8000",
                     running_args=["serve", "m", "--gpu-memory-utilization", "0.5"])
    assert held.returncode == 0, held.stderr
    assert json.loads(held.stdout.splitlines()[-1])["nodes"]["spark-a"]["free"] == \
        (8000 << 20) + int(0.5 * (24576 << 20))


def test_a_node_without_nvidia_smi_is_not_checked(tmp_path: Path, hf: Path) -> None:
    proc = run_check(tmp_path, hf, [], None)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["checked"] is False and "no nvidia-smi" in summary["nodes"]["spark-a"]


def test_a_model_the_head_cannot_read_is_not_checked_and_says_why(tmp_path: Path) -> None:
    proc = run_check(tmp_path, tmp_path / "empty", [], "24576, 24000")
    assert proc.returncode == 0
    assert "memory: not checked: cannot read lab/moe-like" in proc.stderr


def test_vllms_size_suffixes_are_read_as_vllm_reads_them() -> None:
    spec = spec_from([{"name": "a", "host": "10.0.0.1"}],
                     vllmArgs=["--max-model-len=32k", "--max-num-batched-tokens", "2K",
                               "--kv-cache-dtype", "fp8"])
    assert memory_check.estimate_flags(spec) == {
        "max_model_len": 32000, "max_num_batched_tokens": 2048, "kv_cache_dtype": "fp8"}


def test_max_model_len_auto_leaves_the_fit_to_vllm_and_shows_the_estimate(
        tmp_path: Path, hf: Path) -> None:
    spec = spec_from([{"name": "a", "host": "10.0.0.1"}], maxModelLen="auto")
    from spark_vllm.components.render import commands
    args = commands.vllm_serve_args(spec, ray_backend.EXECUTOR)
    assert args[args.index("--max-model-len") + 1] == "auto"  # vLLM >= 0.26 fits it at load
    with pytest.raises(ValueError, match=r"vllmArgs\[0\]: --max-model-len is set by the program"):
        spec_from([{"name": "a", "host": "10.0.0.1"}], maxModelLen=4096,
                  vllmArgs=["--max_model_len=8192"])
    # the 262144 default does not fit 24 GiB at 0.9; auto does, and says about how much
    tmp = tmp_path / "auto"
    tmp.mkdir()
    spec_auto = spec_from([{"name": "spark-a", "host": "127.0.0.1"}], hfCache=str(hf),
                          model=MODEL, modelStaging="copy", maxModelLen="auto")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho '24576, 24000'\n")
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    proc = subprocess.run(["sh", "-c", memory_check.script(spec_auto)],
                          input=memory_check.stdin(spec_auto, "KEY"), capture_output=True,
                          text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp)})
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"--max-model-len auto: about \d+ tokens fit", proc.stderr)
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert 100_000 < summary["maxModelLen"] < 262144


def test_the_switches_that_change_vllms_profile_reach_the_estimate() -> None:
    """--enforce-eager (no CUDA graphs: no estimate, no temporary KV cache, no Mamba-block
    check) and --language-model-only (no encoder profile), in either spelling; absent, the
    payload has no such key, so a stack without them keeps its check's triggers."""
    def flags(args: list[str]) -> dict[str, object]:
        return memory_check.estimate_flags(spec_from([{"name": "a", "host": "10.0.0.1"}],
                                                     vllmArgs=args))
    assert flags(["--enforce-eager", "--language_model_only"]) == {
        "enforce_eager": True, "language_model_only": True}
    assert flags(["--max-num-seqs", "64"]) == {"max_num_seqs": 64}
