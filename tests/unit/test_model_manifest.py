"""The staging helper (spark_vllm/scripts/model_manifest.py) run as the nodes run it: the real
script, `python3 - MODE …` with its program on stdin, against a Hugging Face cache laid out as
huggingface_hub lays it out (blobs named by their sha256 / git sha1, relative symlinks)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_vllm.commands import script_text

REPO = "org/tiny"
COMMIT = "1234567890abcdef1234567890abcdef12345678"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_repo(hf: Path, shards: int = 3, shard_bytes: int = 200_000) -> Path:
    """A small model in HF cache layout; returns its repo dir."""
    rd = hf / "hub" / f"models--{REPO.replace('/', '--')}"
    (rd / "refs").mkdir(parents=True)
    (rd / "refs" / "main").write_text(COMMIT)
    snap = rd / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (rd / "blobs").mkdir()
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    files = {"config.json": b'{"architectures": ["Tiny"]}',
             "model.safetensors.index.json": json.dumps(
                 {"weight_map": {f"t{i}": n for i, n in enumerate(names)}}).encode()}
    for i, n in enumerate(names):
        files[n] = bytes([i + 1]) * shard_bytes
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_sha1(data)
        (rd / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / name)
    return rd


def helper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-", *args], input=script_text("model_manifest.py"),
                          capture_output=True, text=True, timeout=60)


def shard(rd: Path, i: int) -> Path:
    return (rd / "snapshots" / COMMIT / f"model-{i:05d}-of-00003.safetensors").resolve()


def test_build_writes_a_manifest_and_hashes_each_blob_once(tmp_path: Path) -> None:
    rd = make_repo(tmp_path)
    first = helper("build", str(tmp_path), REPO, "main")
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert (summary["commit"], summary["files"]) == (COMMIT, 5)
    assert summary["bytes"] == summary["hashed"] == sum(
        p.stat().st_size for p in (rd / "blobs").iterdir())
    manifest = tmp_path / "spark-vllm" / "manifests" / f"models--org--tiny@{COMMIT}.json"
    assert hashlib.sha256(manifest.read_bytes()).hexdigest() == summary["manifest"]
    # nothing changed: nothing hashed again, the same manifest
    again = json.loads(helper("build", str(tmp_path), REPO, "main").stdout)
    assert again["hashed"] == 0 and again["manifest"] == summary["manifest"]
    # one blob touched: only it is hashed again
    os.utime(shard(rd, 2), ns=(1, 1))
    assert json.loads(helper("build", str(tmp_path), REPO, COMMIT).stdout)["hashed"] == 200_000


def test_a_blob_whose_content_is_not_its_name_is_refused(tmp_path: Path) -> None:
    rd = make_repo(tmp_path)
    blob = shard(rd, 3)
    blob.write_bytes(b"\0" * 200_000)  # same size, other bytes, new mtime
    out = helper("build", str(tmp_path), REPO, "main")
    assert out.returncode == 1 and f"{blob.relative_to(tmp_path)} is corrupt" in out.stderr


@pytest.mark.parametrize("damage, says", [
    ("no-repo", "org/tiny is not in"),
    ("no-ref", "has no revision 'main'"),
    ("missing-shard", "lacks 1 of 3 shards of its index: model-00002-of-00003.safetensors"),
    ("dangling-link", "model-00001-of-00003.safetensors: its blob is missing"),
])
def test_an_incomplete_model_exits_4_naming_what_lacks(tmp_path: Path, damage: str,
                                                        says: str) -> None:
    rd = make_repo(tmp_path)
    if damage == "no-repo":
        os.rename(rd, tmp_path / "elsewhere")
    elif damage == "no-ref":
        (rd / "refs" / "main").unlink()
    elif damage == "missing-shard":
        (rd / "snapshots" / COMMIT / "model-00002-of-00003.safetensors").unlink()
    else:
        shard(rd, 1).unlink()
    out = helper("build", str(tmp_path), REPO, "main")
    assert out.returncode == 4 and says in out.stderr, out.stderr


def test_check_and_need_see_a_short_or_missing_copy_by_size(tmp_path: Path) -> None:
    rd = make_repo(tmp_path)
    assert helper("build", str(tmp_path), REPO, "main").returncode == 0
    assert helper("check", str(tmp_path), REPO, "main").stdout.strip() == "complete"
    assert json.loads(helper("need", str(tmp_path), REPO, COMMIT).stdout)["need"] == 0
    with open(shard(rd, 2), "r+b") as f:
        f.truncate(150_000)
    shard(rd, 3).unlink()
    check = helper("check", str(tmp_path), REPO, COMMIT).stdout.strip()
    assert check == ("incomplete: model-00002-of-00003.safetensors is 150000 bytes, not 200000; "
                     "model-00003-of-00003.safetensors is missing")
    need = json.loads(helper("need", str(tmp_path), REPO, COMMIT).stdout)
    assert need["need"] == 50_000 + 200_000 and need["free"] > 0
    # no manifest on the node (never staged, or the cache was wiped): gone
    assert helper("check", str(tmp_path), "org/other", "main").stdout.strip() == "gone"


def test_files_lists_what_rsync_copies_relative_to_the_cache(tmp_path: Path) -> None:
    rd = make_repo(tmp_path)
    assert helper("build", str(tmp_path), REPO, "main").returncode == 0
    files = helper("files", str(tmp_path), REPO, COMMIT).stdout.split()
    rel = "hub/models--org--tiny"
    assert f"{rel}/refs/main" in files
    assert f"spark-vllm/manifests/models--org--tiny@{COMMIT}.json" in files
    assert sorted(f for f in files if "/blobs/" in f) == sorted(
        f"{rel}/blobs/{p.name}" for p in (rd / "blobs").iterdir())
    assert len([f for f in files if "/snapshots/" in f]) == 5
    # every listed path exists: rsync --files-from would fail on one that does not
    assert all((tmp_path / f).exists() for f in files)


def test_progress_reads_rsync_unbuffered_and_keeps_the_bytes_sent(tmp_path: Path) -> None:
    """rsync's --info=progress2 updates end in \\r: the filter must see each as it comes (a
    pipe through awk or tr held them all until rsync ended: no progress during a 120 GB copy)."""
    sent = tmp_path / "sent"
    feeder = ("import sys, time\n"
              "for i in range(1, 5):\n"
              "    sys.stdout.write(f'\\r  {i},000,000  {25 * i}%  1.00MB/s    0:00:0{4 - i}')\n"
              "    sys.stdout.flush(); time.sleep(0.4)\n"
              "print('\\n\\nNumber of files: 9\\nTotal bytes sent: 4,000,123\\nTotal bytes received: 9')\n")
    program = script_text("model_manifest.py").replace("PROGRESS_EVERY_S = 10",
                                                       "PROGRESS_EVERY_S = 0.3")
    proc = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$FEED" | {sys.executable} -c "$PROG" progress '
                     f'"copying to node-2" {sent} 2>&1 | while IFS= read -r l; do '
                     'echo "$(date +%s.%N) $l"; done'],
        env={"FEED": feeder, "PROG": program, "SPARK_VLLM_NODE": "node-1", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=30)
    lines = proc.stdout.splitlines()
    assert len(lines) >= 2, proc
    assert re.fullmatch(r"\[spark-vllm\] node-1: model: copying to node-2: \d,000,000 bytes "
                        r"\(\d+%\), 1.00MB/s, 0:00:0\d left", lines[0].split(" ", 1)[1])
    stamps = [float(ln.split()[0]) for ln in lines]
    assert stamps[-1] - stamps[0] > 0.3  # they came while the copy ran, not all at its end
    assert sent.read_text() == "4000123\n"
