"""Fixtures the unit tests of more than one module share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.harness import MOE_MODEL

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An hfCache holding MOE_MODEL in huggingface_hub's layout, made by lab/model_gen.py (a
    Qwen3-MoE config with valid safetensors headers): what the memory checks read."""
    hf = tmp_path_factory.mktemp("hf")
    subprocess.run([sys.executable, str(REPO / "lab/model_gen.py"), "--hf-home", str(hf),
                    "--repo", MOE_MODEL, "--size", "2000000", "--shards", "2"],
                   check=True, capture_output=True)
    return hf
