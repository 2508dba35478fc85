"""A generated model in a lab node's Hugging Face cache, so vllm-sim has weights to check.

The generator is lab/model_gen.py (stdlib only); it runs on the node with the node's own
python3, sent over SSH on stdin, as an operator would run a script. It writes huggingface_hub's
cache layout (refs/main, blobs/ named by sha256 or git sha1, snapshots/COMMIT/* relative
symlinks) with valid safetensors shards of deterministic pseudo-random bytes: NOT real weights
(config.json says so in "_spark_vllm_lab"). The same parameters give the same commit and the
same blobs on every node, so copies can be compared; a second run with the same parameters
writes nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any

from lab import config, keys
from lab.config import NodeAddrs
from lab.run import LabError, run

GENERATOR = config.LAB_DIR / "model_gen.py"
DEFAULT_HF_HOME = "/root/.cache/huggingface"
# 3 GiB took ≈10 s locally (2 cores): ample for a node's disk, and for SSH.
GENERATE_TIMEOUT_S = 600

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def generate_script() -> str:
    """The generator's source, as sent to a node (`python3 - ARGS` with this on stdin)."""
    return GENERATOR.read_text()


def generator_args(repo: str, size: int, shards: int, hf_home: str,
                   owner: str | None = None) -> list[str]:
    argv = ["--hf-home", hf_home, "--repo", repo, "--size", str(size), "--shards", str(shards)]
    return argv + (["--owner", owner] if owner else [])


def parse_size(text: str) -> int:
    """`3G`, `512M`, `3GiB`, `1000`: binary units, as the lab's sizes are meant."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 3G, 512M, 1048576)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def ensure(node: NodeAddrs, repo: str = config.LAB_MODEL, size: int = config.LAB_MODEL_BYTES,
           shards: int = config.LAB_MODEL_SHARDS, hf_home: str = DEFAULT_HF_HOME,
           owner: str | None = None) -> dict[str, Any]:
    """Generate (or confirm) the model in `hf_home` on `node`, over SSH as root.

    Returns the generator's summary: repo, commit, files, bytes, seconds, generated (False when
    it was already there), rewritten (files written this time), path (the snapshot dir)."""
    remote = ["python3", "-", *generator_args(repo, size, shards, hf_home, owner)]
    with GENERATOR.open("rb") as script:
        proc = run(keys.ssh_argv(node.mgmt_ip, remote), stdin=script, check=False,
                   timeout=GENERATE_TIMEOUT_S)
    if proc.returncode != 0:
        raise LabError(f"{node.name}: generating {repo} failed (exit {proc.returncode}):\n"
                       f"{proc.stderr.strip()}")
    return _summary(proc.stdout, node.name)


def _summary(stdout: str, where: str) -> dict[str, Any]:
    lines = stdout.strip().splitlines()
    try:
        summary: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError) as e:
        raise LabError(f"{where}: the model generator printed no summary: {stdout!r}") from e
    return summary


def describe(summary: dict[str, Any]) -> str:
    """One line for progress output."""
    what = "generated" if summary["generated"] else "already there"
    return (f"{summary['repo']}@{summary['commit'][:12]}: {summary['files']} files, "
            f"{summary['bytes'] / 2**30:.2f} GiB, {what} ({summary['seconds']:.1f}s)")

