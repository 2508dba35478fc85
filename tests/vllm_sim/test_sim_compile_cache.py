"""vllm-sim's torch.compile cache (vllm_sim/compile_cache.py), called directly: no Ray, no server.

Each test points VLLM_CACHE_ROOT (or XDG_CACHE_HOME / HOME) at a temporary dir."""

import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm_sim import compile_cache
from vllm_sim.compile_cache import INDEX_FILE, artifact_name

COMPILE_S = 0.2
FACTORS = {"vllm_version": "0.26.0", "model": "/hf/hub/models--Org--Tiny/snapshots/" + "a" * 40,
           "revision": None, "tensor_parallel_size": 2, "pipeline_parallel_size": 1,
           "max_model_len": "32768"}
RANGE = "(1, 8192)"
LOAD_LINE = re.compile(
    r"^Directly load the compiled graph\(s\) for compile range \(1, 8192\) from the cache, "
    r"took \d+\.\d{3} s$"
)
COMPILE_LINE = re.compile(r"^Compiling a graph for compile range \(1, 8192\) takes \d+\.\d{2} s$")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
    return tmp_path / "vllm"


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    # vllm_sim's logger may not propagate (configure_logging): listen on it directly
    logger = logging.getLogger("vllm_sim.compile_cache")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="vllm_sim")
    yield caplog
    logger.removeHandler(caplog.handler)


def messages(log: pytest.LogCaptureFixture) -> list[str]:
    msgs = [r.getMessage() for r in log.records]
    log.clear()
    return msgs


def timed(rank: int, factors: dict, seconds: float = COMPILE_S) -> tuple[float, float, bool]:
    t0 = time.perf_counter()
    spent, hit = compile_cache.compile(rank, factors, seconds)
    return time.perf_counter() - t0, spent, hit


def local_dir(root: Path, factors: dict, rank: int = 0) -> Path:
    return root / "torch_compile_cache" / compile_cache.hash_key(factors) / f"rank_{rank}_0" / \
        "backbone"


def test_cold_compiles_and_stores_then_warm_loads(root: Path, log: pytest.LogCaptureFixture):
    wall, spent, hit = timed(0, FACTORS)
    assert not hit
    assert wall >= COMPILE_S and spent >= COMPILE_S
    key = compile_cache.hash_key(FACTORS)
    assert re.fullmatch(r"[0-9a-f]{10}", key)
    rank_dir = local_dir(root, FACTORS)
    assert (rank_dir / INDEX_FILE).is_file()
    assert (rank_dir / artifact_name((1, 8192))).is_file()
    for sub in ("inductor_cache", "triton_cache"):
        files = [p for p in (root / "torch_compile_cache" / key / sub).rglob("*") if p.is_file()]
        assert files, sub
    assert not list(root.rglob("*.tmp"))
    cold = messages(log)
    assert f"Using cache directory: {rank_dir} for vLLM's torch.compile" in cold
    assert f"Cache the graph of compile range {RANGE} for later use" in cold
    assert any(COMPILE_LINE.match(m) for m in cold), cold
    assert not any(m.startswith("Directly load") for m in cold)

    wall, spent, hit = timed(0, dict(FACTORS))
    assert hit
    assert wall < COMPILE_S / 4 and spent <= wall
    warm = messages(log)
    assert any(LOAD_LINE.match(m) for m in warm), warm
    assert not any(m.startswith("Compiling a graph") for m in warm)


def test_ranks_have_their_own_dirs(root: Path):
    assert not timed(0, FACTORS)[2]
    assert not timed(1, FACTORS)[2]  # rank 0's cache is not rank 1's
    assert local_dir(root, FACTORS, 1).is_dir()
    assert timed(1, FACTORS)[2]


@pytest.mark.parametrize("change", [{"model": "Org/Other"}, {"tensor_parallel_size": 4},
                                    {"vllm_version": "0.33.0"}, {"kv_cache_dtype": "fp8"},
                                    {"revision": "main"}])
def test_other_factors_compile_into_another_dir(root: Path, change: dict):
    assert not timed(0, FACTORS)[2]
    other = {**FACTORS, **change}
    assert compile_cache.hash_key(other) != compile_cache.hash_key(FACTORS)
    wall, _, hit = timed(0, other)
    assert not hit and wall >= COMPILE_S
    assert local_dir(root, other).is_dir() and local_dir(root, FACTORS).is_dir()
    assert len(list((root / "torch_compile_cache").iterdir())) == 2


def test_key_ignores_dict_order():
    assert compile_cache.hash_key(dict(reversed(FACTORS.items()))) == \
        compile_cache.hash_key(FACTORS)


def test_max_num_batched_tokens_sets_the_range(root: Path, log: pytest.LogCaptureFixture):
    factors = {**FACTORS, "max_num_batched_tokens": "2048"}
    timed(0, factors)
    assert (local_dir(root, factors) / artifact_name((1, 2048))).is_file()
    assert any("compile range (1, 2048) takes" in m for m in messages(log))


@pytest.mark.parametrize(("flag", "end"), [(None, 8192), (4096, 4096), ("2048", 2048),
                                           ("2k", 2000), ("2K", 2048), ("auto", 8192)])
def test_compile_range(flag: object, end: int):
    assert compile_cache.compile_range({"max_num_batched_tokens": flag}) == (1, end)


def test_leftovers_of_a_killed_compile_are_not_trusted(root: Path, log: pytest.LogCaptureFixture):
    """A rank killed before its index was os.replace'd: temporary files, or an artefact
    without an index. Neither is a cache."""
    timed(0, FACTORS)
    rank_dir = local_dir(root, FACTORS)
    index = rank_dir / INDEX_FILE
    os.replace(index, rank_dir / f"{INDEX_FILE}.4242.tmp")
    wall, _, hit = timed(0, FACTORS)
    assert not hit and wall >= COMPILE_S
    assert index.is_file()  # compiled again and stored
    assert timed(0, FACTORS)[2]

    (rank_dir / artifact_name((1, 8192))).unlink()
    index.unlink()
    (rank_dir / f"{artifact_name((1, 8192))}.99.tmp").write_text("half")
    messages(log)
    assert not timed(0, FACTORS)[2]
    assert not any(m.startswith("Compiling model again") for m in messages(log))


@pytest.mark.parametrize("damage", ["truncate", "remove", "garble_index"])
def test_a_damaged_cache_compiles_again(root: Path, log: pytest.LogCaptureFixture, damage: str):
    timed(0, FACTORS)
    rank_dir = local_dir(root, FACTORS)
    artifact = rank_dir / artifact_name((1, 8192))
    if damage == "truncate":
        artifact.write_bytes(artifact.read_bytes()[:5])
    elif damage == "remove":
        artifact.unlink()
    else:
        (rank_dir / INDEX_FILE).write_text("{(1, 8192): ")
    messages(log)
    wall, _, hit = timed(0, FACTORS)
    assert not hit and wall >= COMPILE_S
    assert any(m.startswith("Compiling model again due to a load failure from")
               for m in messages(log))
    assert timed(0, FACTORS)[2]  # stored whole again


def test_disabled_cache_always_compiles_and_stores_nothing(
    root: Path, monkeypatch: pytest.MonkeyPatch, log: pytest.LogCaptureFixture
):
    timed(0, FACTORS)  # a cache that would hit
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    for _ in range(2):
        wall, _, hit = timed(0, FACTORS)
        assert not hit and wall >= COMPILE_S
    msgs = messages(log)
    assert "vLLM's torch.compile cache is disabled." in msgs
    assert not any(m.startswith("Directly load") for m in msgs)

    other = {**FACTORS, "model": "Org/Fresh"}
    timed(0, other)
    key_dir = root / "torch_compile_cache" / compile_cache.hash_key(other)
    assert not (local_dir(root, other) / INDEX_FILE).exists()
    assert not (local_dir(root, other) / artifact_name((1, 8192))).exists()
    assert not (key_dir / "inductor_cache").exists() and not (key_dir / "triton_cache").exists()
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "0")
    assert not timed(0, other)[2]  # nothing was stored while disabled


def test_cache_root_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.cache_root() == str(tmp_path / "home" / ".cache" / "vllm")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.cache_root() == str(tmp_path / "xdg" / "vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "~/vc")
    assert compile_cache.cache_root() == str(tmp_path / "home" / "vc")


def test_compile_goes_under_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    timed(0, FACTORS, 0.0)
    assert local_dir(tmp_path / "xdg" / "vllm", FACTORS).is_dir()
    assert timed(0, FACTORS, 0.0)[2]


def test_compile_seconds_knob(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("VLLM_SIM_COMPILE_S", raising=False)
    assert compile_cache.compile_seconds() == 2.0
    monkeypatch.setenv("VLLM_SIM_COMPILE_S", "0.25")
    assert compile_cache.compile_seconds() == 0.25


def test_engine_factors_from_the_command_line(monkeypatch: pytest.MonkeyPatch):
    args = SimpleNamespace(revision=None, tensor_parallel_size=2, pipeline_parallel_size=1,
                           max_model_len="32768", kv_cache_dtype="fp8", dtype=None,
                           port=8000, host="0.0.0.0", served_model_name=["qwen"])
    f = compile_cache.engine_factors(args, "Org/M")
    assert f == {"model": "Org/M", "revision": None, "tensor_parallel_size": 2,
                 "pipeline_parallel_size": 1, "max_model_len": "32768", "kv_cache_dtype": "fp8"}
    legacy = compile_cache.engine_factors(args, "Org/M", ["--gpu-memory-utilization", "0.9"])
    assert legacy["other_flags"] == ["--gpu-memory-utilization", "0.9"]
    assert compile_cache.torch_compiles(f)
    assert not compile_cache.torch_compiles({**f, "enforce_eager": True})
    assert not compile_cache.torch_compiles({**f, "other_flags": ["--enforce-eager"]})
    monkeypatch.setenv("VLLM_SIM_VLLM_VERSION", "0.26.0")
    assert compile_cache.rank_factors(f)["vllm_version"] == "0.26.0"
    monkeypatch.setenv("VLLM_SIM_VLLM_VERSION", "0.17.1")
    assert compile_cache.hash_key(compile_cache.rank_factors(f)) != \
        compile_cache.hash_key({**f, "vllm_version": "0.26.0"})
