"""The staging helper (components/scripts/model_manifest.py) run as the nodes run it: the real
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

from spark_vllm.components.render.commands import script_text

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


# rsync as push-rsync drives it, without rsync or ssh: it copies the --files-from list (stdin)
# from SRC/ to DEST:SRC/ (there FAKE_DST: another directory here), printing progress2-shaped
# updates and --stats' "Total bytes sent".
FAKE_RSYNC = r"""#!{python}
import os, shutil, sys, time
args = sys.argv[1:]
src, dst = args[-2], os.environ["FAKE_DST"]  # the node's hfCache (here another dir)
assert args[-1].endswith(":" + src), args
files = [ln for ln in sys.stdin.read().splitlines() if ln]
with open(os.environ["RSYNC_CALLS"], "a") as log:
    log.write(" ".join(f for f in files) + "\n")
done = 0
for f in files:
    s, d = os.path.join(src, f), os.path.join(dst, f)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    if os.path.islink(s):
        if not os.path.lexists(d):
            os.symlink(os.readlink(s), d)
        continue
    shutil.copyfile(s, d)
    done += os.path.getsize(s)
    sys.stdout.write(f"\r  {done:,}  50%  1.00MB/s    0:00:01")
    sys.stdout.flush()
    time.sleep(0.2)
print(f"\n\nNumber of files: {len(files)}\nTotal bytes sent: {done + 7:,}\nTotal bytes received: 9")
"""


def test_push_rsync_spreads_the_blobs_over_n_transfers_then_sends_the_rest(
        tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_repo(src, shards=4)
    assert helper("build", str(src), REPO, "main").returncode == 0
    files = helper("files", str(src), REPO, COMMIT).stdout.split()
    listing = tmp_path / "files"
    listing.write_text("\n".join(files) + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rsync").write_text(FAKE_RSYNC.replace("{python}", sys.executable))
    (bin_dir / "rsync").chmod(0o755)
    calls = tmp_path / "calls"
    program = script_text("model_manifest.py").replace("PROGRESS_EVERY_S = 10",
                                                       "PROGRESS_EVERY_S = 0.1")
    proc = subprocess.run(
        [sys.executable, "-c", program, "push-rsync", str(src), str(listing), "2",
         "u@h", "-o X", "copying to node-2"],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RSYNC_CALLS": str(calls),
             "SPARK_VLLM_NODE": "node-1", "FAKE_DST": str(dst)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    batches = [ln.split() for ln in calls.read_text().splitlines()]
    # two parallel batches of blobs (4 shards + 2 small blobs, balanced), then everything else
    assert len(batches) == 3
    assert all("/blobs/" in f for b in batches[:2] for f in b)
    assert not any("/blobs/" in f for f in batches[2])
    sizes = [sum((src / f).stat().st_size for f in b) for b in batches[:2]]
    assert abs(sizes[0] - sizes[1]) <= 200_000  # LPT: within one shard of each other
    rest = sum((src / f).stat().st_size for f in batches[2] if not (src / f).is_symlink())
    assert int(proc.stdout.strip()) == sum(sizes) + rest + 3 * 7  # their --stats, summed
    assert re.search(r"copying to node-2: [\d.]+ GB of [\d.]+ GB \(\d+ %\), \d+ MB/s over 2 "
                     r"stream\(s\), ETA \d+ s", proc.stderr), proc.stderr
    for f in files:
        assert (dst / f).exists() or (dst / f).is_symlink()


def _tcp_copy(src: Path, dst: Path, streams: int = 2) -> tuple[int, str]:
    """recv on the 'node' (dst), push-tcp from the 'head' (src), over loopback."""
    program = script_text("model_manifest.py")
    recv = subprocess.Popen([sys.executable, "-c", program, "recv", str(dst), REPO, COMMIT,
                             "127.0.0.1", str(streams)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert recv.stdout is not None
    word, port, token = recv.stdout.readline().split()
    assert word == "listening"
    push = subprocess.run([sys.executable, "-c", program, "push-tcp", str(src), REPO, COMMIT,
                           "127.0.0.1", port, token, str(streams), "copying to node-2"],
                          capture_output=True, text=True, timeout=60)
    _, err = recv.communicate(timeout=60)
    assert push.returncode == 0 and recv.returncode == 0, (push.stderr, err)
    for f in helper("files", str(src), REPO, COMMIT).stdout.split():  # the links' rsync
        if (src / f).is_symlink() and not (dst / f).is_symlink():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src / f), dst / f)
    return int(push.stdout.strip()), err


def _head_and_node(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A staged head (its manifest built) and a node that has only the manifest."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    rd = make_repo(src)
    assert helper("build", str(src), REPO, "main").returncode == 0
    _node_with_manifest(src, dst)
    return src, dst, rd


def _node_with_manifest(src: Path, dst: Path) -> None:
    manifest = next((src / "spark-vllm" / "manifests").iterdir())
    (dst / "spark-vllm" / "manifests").mkdir(parents=True)
    (dst / "spark-vllm" / "manifests" / manifest.name).write_bytes(manifest.read_bytes())


def test_tcp_copy_moves_every_blob_hashed_on_arrival_and_resumes_a_partial_one(
        tmp_path: Path) -> None:
    src, dst, rd = _head_and_node(tmp_path)
    blobs = sorted((rd / "blobs").iterdir())
    total = sum(b.stat().st_size for b in blobs)
    # an earlier copy stopped half-way through the first shard
    first = shard(rd, 1)
    part = dst / first.relative_to(src)
    part.parent.mkdir(parents=True)
    Path(str(part) + ".spark-vllm-partial").write_bytes(first.read_bytes()[:120_000])
    sent, _ = _tcp_copy(src, dst)
    assert sent == total - 120_000  # only what was missing crossed the link
    for b in blobs:
        assert (dst / b.relative_to(src)).read_bytes() == b.read_bytes()
    assert not list(dst.rglob("*.spark-vllm-partial"))
    # recorded as verified: a second copy sends nothing, and check reads it complete
    assert helper("need", str(dst), REPO, COMMIT).returncode == 0
    assert _tcp_copy(src, dst)[0] == 0


def test_a_damaged_partial_is_dropped_and_sent_again_whole(tmp_path: Path) -> None:
    src, dst, rd = _head_and_node(tmp_path)
    first = shard(rd, 1)
    part = dst / first.relative_to(src)
    part.parent.mkdir(parents=True)
    Path(str(part) + ".spark-vllm-partial").write_bytes(b"\xff" * 50_000)  # wrong bytes
    sent, err = _tcp_copy(src, dst, streams=1)
    assert "arrived damaged" in err
    assert part.read_bytes() == first.read_bytes()
    total = sum(b.stat().st_size for b in (rd / "blobs").iterdir())
    assert sent == total - 50_000 + 200_000  # the rest, then the whole shard again


def test_need_hashes_a_whole_blob_written_since_it_was_verified_and_drops_a_corrupt_one(
        tmp_path: Path) -> None:
    src, dst, rd = _head_and_node(tmp_path)
    _tcp_copy(src, dst)
    assert helper("check", str(dst), REPO, COMMIT).stdout.strip() == "complete"
    victim = dst / shard(rd, 2).relative_to(src)
    data = bytearray(victim.read_bytes())
    data[1000] ^= 0xFF  # one byte flipped, the size unchanged
    victim.write_bytes(bytes(data))
    # the read-time check (stat only) sees it written since it was verified
    assert "was written since it was verified" in helper("check", str(dst), REPO, COMMIT).stdout
    need = helper("need", str(dst), REPO, COMMIT)
    assert json.loads(need.stdout)["need"] == 200_000 and "does not match its hash" in need.stderr
    assert not victim.exists()
    assert _tcp_copy(src, dst)[0] == 200_000
    assert victim.read_bytes() == shard(rd, 2).read_bytes()
    assert helper("check", str(dst), REPO, COMMIT).stdout.strip() == "complete"

