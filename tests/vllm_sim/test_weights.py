"""vllm-sim finds and checks the weights as vLLM 0.33.0 does (vllm_sim/weights.py).

The model is lab/model_gen.py's (the lab's generated model), tiny, in a temporary HF_HOME.
huggingface_hub reads HF_HOME and HF_HUB_OFFLINE at import, as in vLLM's processes, so the
in-process tests set its constants; the `vllm serve` tests set the environment."""

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import LocalEntryNotFoundError
from vllm_sim import weights
from vllm_sim.weights import ModelSource, SafetensorError
from vsim_harness import HEAD_IP, V2, WORKER_IP, start_cluster, start_serve

GENERATOR = Path(__file__).resolve().parents[2] / "lab" / "model_gen.py"
REPO = "Org/Tiny-MoE"
SHARDS = 3
TRUNCATED = "Error while deserializing header: incomplete metadata, file not fully covered"
OFFLINE_ABSENT = (
    "Cannot find an appropriate cached snapshot folder for the specified revision on the local "
    "disk and outgoing traffic has been disabled. To enable repo look-ups and downloads online, "
    "pass 'local_files_only=False' as input."
)


def generate(hf_home: Path, repo: str = REPO, size: int = 3_000_000) -> Path:
    """The lab's generator, run as on a node; returns the snapshot directory."""
    argv = [sys.executable, "-", "--hf-home", str(hf_home), "--repo", repo,
            "--size", str(size), "--shards", str(SHARDS)]
    with GENERATOR.open() as script:
        out = subprocess.run(argv, stdin=script, capture_output=True, text=True, check=True,
                             timeout=120).stdout
    return Path(json.loads(out)["path"])


def shard(snapshot: Path, i: int) -> Path:
    return snapshot / f"model-{i:05d}-of-{SHARDS:05d}.safetensors"


def truncate(path: Path, by: int) -> None:
    blob = path.resolve()
    os.truncate(blob, blob.stat().st_size - by)


@pytest.fixture
def hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(HF_HOME, snapshot dir) of a fresh tiny model; huggingface_hub pointed at it, online."""
    home = tmp_path / "hf"
    snapshot = generate(home)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(weights, "CONFIG_RETRY_DELAY_S", 0)
    return home, snapshot


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture):  # type: ignore[no-untyped-def]
    # vllm_sim's logger stops propagating once configure_logging ran (another test's main())
    logger = logging.getLogger("vllm_sim")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="vllm_sim")
    yield caplog
    logger.removeHandler(caplog.handler)


def load(model: str = REPO, **kw: str) -> weights.Loaded | None:
    return weights.load_weights(ModelSource(model, **kw), progress=True, where="rank 0 on here")


def test_the_generated_model_loads(hf: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                   log: pytest.LogCaptureFixture) -> None:
    home, snapshot = hf
    assert weights.resolve_model(REPO, None) == REPO  # online: the repo id stays
    assert weights.check_config(REPO, None)["_spark_vllm_lab"].startswith("generated")
    loaded = load()
    assert loaded is not None
    assert (loaded.folder, loaded.files) == (str(snapshot), SHARDS)
    assert loaded.bytes == sum(shard(snapshot, i).stat().st_size for i in (1, 2, 3))
    assert loaded.tensors == 6 * SHARDS
    bars = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("Loading safetensors")]
    assert bars[0].startswith("Loading safetensors checkpoint shards:   0% Completed | 0/3 [")
    assert bars[-1].startswith("Loading safetensors checkpoint shards: 100% Completed | 3/3 [")
    assert "Checkpoint size: 0.00 GiB" in log.text and "Loading weights took" in log.text


def test_huggingface_hub_reads_the_generated_cache(hf: tuple[Path, Path]) -> None:
    home, snapshot = hf
    info = scan_cache_dir(home / "hub")
    assert not info.warnings
    (repo,) = info.repos
    (rev,) = repo.revisions
    assert (repo.repo_id, rev.commit_hash, rev.refs) == (REPO, snapshot.name, frozenset({"main"}))
    assert len(rev.files) == 5 + SHARDS


def test_a_truncated_shard_fails_with_safetensors_error(hf: tuple[Path, Path]) -> None:
    _, snapshot = hf
    truncate(shard(snapshot, 2), 100)
    with pytest.raises(SafetensorError) as err:
        load()
    assert str(err.value) == TRUNCATED
    assert err.value.__notes__ == [
        f"vllm-sim: rank 0 on here failed to load {REPO} at {shard(snapshot, 2)}"]


@pytest.mark.parametrize("keep,message", [
    (5, "header too small"),
    (20, "invalid header length"),
])
def test_a_shard_cut_in_its_header(hf: tuple[Path, Path], keep: int, message: str) -> None:
    _, snapshot = hf
    os.truncate(shard(snapshot, 1).resolve(), keep)
    with pytest.raises(SafetensorError) as err:
        load()
    assert str(err.value) == f"Error while deserializing header: {message}"


def test_safetensors_itself_says_the_same(hf: tuple[Path, Path], tmp_path: Path) -> None:
    """The messages are safetensors 0.8.0's own (requirements-dev pins it for this check)."""
    import safetensors
    good = shard(hf[1], 1).read_bytes()
    (n,) = struct.unpack("<Q", good[:8])
    header = json.loads(good[8:8 + n])
    header[sorted(k for k in header if k != "__metadata__")[1]]["data_offsets"][0] += 1
    bad_offset = json.dumps(header).encode()
    bad_offset += b" " * (-len(bad_offset) % 8)
    cases = {
        "short data": good[:-1], "extra byte": good + b"\0", "cut header": good[:n // 2],
        "seven bytes": good[:7], "empty": b"", "huge header": struct.pack("<Q", 10**9) + good[8:],
        "bad offset": struct.pack("<Q", len(bad_offset)) + bad_offset + good[8 + n:],
    }
    for name, data in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.safetensors"
        path.write_bytes(data)
        with pytest.raises(Exception) as real:
            safetensors.safe_open(str(path), framework="numpy")
        with pytest.raises(SafetensorError) as ours:
            weights.read_safetensors_header(str(path))
        assert str(ours.value) == str(real.value), name


def test_a_missing_shard_fails_as_vllm_does(hf: tuple[Path, Path]) -> None:
    _, snapshot = hf
    shard(snapshot, 3).unlink()  # the snapshot's link: the index names a file that is not there
    with pytest.raises(FileNotFoundError) as err:
        load()
    assert str(err.value) == f"Weight files referenced in index but missing: {{'{shard(snapshot, 3)}'}}"


def test_a_shard_whose_blob_is_gone(hf: tuple[Path, Path]) -> None:
    _, snapshot = hf
    shard(snapshot, 1).resolve().unlink()  # dangling link: os.path.getsize fails in vLLM
    with pytest.raises(FileNotFoundError, match=r"\[Errno 2\] No such file or directory: '.*model-00001"):
        load()


def test_offline_and_absent_fails_with_huggingface_hubs_error(
        hf: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(LocalEntryNotFoundError) as err:
        weights.resolve_model("Org/Absent", None)  # the driver, before the engine
    assert str(err.value) == OFFLINE_ABSENT
    with pytest.raises(LocalEntryNotFoundError):
        load("Org/Absent")  # a rank whose node lacks it


def test_offline_and_present_serves_the_snapshot_dir(
        hf: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, log: pytest.LogCaptureFixture) -> None:
    _, snapshot = hf
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert weights.resolve_model(REPO, None) == str(snapshot)
    assert f"HF_HUB_OFFLINE is True, replace model_id [{REPO}] to model_path [{snapshot}]" in log.text
    loaded = load(str(snapshot))
    assert loaded is not None and loaded.files == SHARDS
    assert weights.resolve_model(REPO, snapshot.name) == str(snapshot)  # --revision COMMIT
    with pytest.raises(LocalEntryNotFoundError):
        weights.resolve_model(REPO, "v2")  # no refs/v2


def test_online_and_absent_goes_on_without_weights(hf: tuple[Path, Path],
                                                    log: pytest.LogCaptureFixture) -> None:
    assert weights.resolve_model("Org/Absent", None) == "Org/Absent"
    assert weights.check_config("Org/Absent", None) is None
    assert load("Org/Absent") is None
    assert "a real vLLM would download its weights from the Hub now" in log.text


def test_a_local_directory_is_used_as_it_is(hf: tuple[Path, Path], tmp_path: Path) -> None:
    plain = tmp_path / "plain-dir"
    shutil.copytree(hf[1], plain)  # links followed: real files
    loaded = load(str(plain))
    assert loaded is not None and loaded.folder == str(plain)
    (plain / "config.json").unlink()
    with pytest.raises(ValueError, match="Invalid repository ID or local directory specified"):
        weights.check_config(str(plain), None)


def test_a_broken_config_json(hf: tuple[Path, Path], log: pytest.LogCaptureFixture) -> None:
    config = hf[1] / "config.json"
    config.resolve().write_text("{not json")
    with pytest.raises(OSError) as err:
        weights.check_config(REPO, None)
    assert str(err.value) == f"It looks like the config file at '{config}' is not a valid JSON file."
    assert "retrying 1 of 2" in log.text


# --- `vllm serve`: the failure ends the server with the error in its log --------------------

def serve_env(home: Path, **extra: str) -> dict[str, str]:
    return {**V2, "HF_HOME": str(home), **extra}


def test_serve_exits_on_a_truncated_shard(tmp_path: Path) -> None:
    snapshot = generate(tmp_path / "hf")
    truncate(shard(snapshot, 2), 1)
    s = start_serve(None, REPO, [], serve_env(tmp_path / "hf"), tmp_path)
    try:
        assert s.wait_exit(60) == 1
        out = s.output()
        assert "EngineCore failed to start." in out and TRUNCATED in out
        assert str(shard(snapshot, 2)) in out
    finally:
        s.stop()


def test_serve_exits_when_offline_and_absent(tmp_path: Path) -> None:
    s = start_serve(None, "Org/Absent", [], serve_env(tmp_path / "hf", HF_HUB_OFFLINE="1"), tmp_path)
    try:
        assert s.wait_exit(60) == 1
        assert f"huggingface_hub.errors.LocalEntryNotFoundError: {OFFLINE_ABSENT}" in s.output()
    finally:
        s.stop()


@pytest.mark.slow
def test_the_rank_on_the_worker_finds_its_truncated_copy(tmp_path: Path) -> None:
    """tp=2 over two Ray nodes, each with its own HF_HOME (its container's disk): both copies
    whole, the server starts; the worker's copy truncated, rank 1 fails on the worker's node."""
    head_hf, worker_hf = tmp_path / "head-hf", tmp_path / "worker-hf"
    generate(head_hf)
    shutil.copytree(head_hf, worker_hf, symlinks=True)
    worker_snapshot = next((worker_hf / "hub").glob("models--*/snapshots/*"))
    tp2 = ["-tp", "2", "--distributed-executor-backend", "ray"]
    env = serve_env(head_hf, VLLM_HOST_IP=HEAD_IP)
    cluster = start_cluster(head_vllm_host_ip=HEAD_IP, env={"HF_HOME": str(head_hf)})
    try:
        cluster.add_node(WORKER_IP, vllm_host_ip=WORKER_IP, env={"HF_HOME": str(worker_hf)})
        s = start_serve(cluster, REPO, tp2, env, tmp_path)
        try:
            s.wait_ready()
            assert "Weights checked on rank(s) [0, 1]: 3 files, 18 tensors" in s.output()
        finally:
            s.stop()
        truncate(shard(worker_snapshot, 3), 4096)
        s = start_serve(cluster, REPO, tp2, env, tmp_path)
        try:
            assert s.wait_exit(90) == 1
            out = s.output()
        finally:
            s.stop()
    finally:
        cluster.stop()
    assert "EngineCore failed to start." in out and TRUNCATED in out
    assert f"ip={WORKER_IP}" in out  # Ray's own header of the failed task
    assert f"rank 1 on {WORKER_IP}" in out and str(shard(worker_snapshot, 3)) in out
