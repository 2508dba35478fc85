"""The lab's Hugging Face Hub endpoint (lab/hf_endpoint.py) against the real client,
huggingface_hub 1.33.0: what snapshot_download leaves in its cache is the source cache,
byte for byte; a cached snapshot costs one request; errors raise the client's own
exceptions; a download cut short resumes with a Range request."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from huggingface_hub import (
    HfApi,
    RepoFile,
    RepoFolder,
    constants,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from lab import hf_endpoint
from lab.hf_endpoint import Handler, HubError, HubServer, Request, parse_range

REPO = "lab-org/tiny-model"
SHARD = "model-00001-of-00002.safetensors"
FILES = {
    "config.json": b'{"architectures": ["TinyForCausalLM"]}\n',
    "tokenizer.json": b'{"version": "1.0"}\n',
    "model.safetensors.index.json": b'{"weight_map": {}}\n',
    SHARD: os.urandom(constants.DOWNLOAD_CHUNK_SIZE + (2 << 20)),  # long enough to resume
    "model-00002-of-00002.safetensors": os.urandom(1 << 20),
    "extra/notes.txt": b"a nested file: the tree lists its directory\n",
}
COMMIT = hashlib.sha1(b"tiny-model commit").hexdigest()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_repo(root: Path, repo_id: str = REPO, files: dict[str, bytes] = FILES,
              commit: str = COMMIT, ref: str = "main") -> Path:
    """A repo in HF cache layout: LFS blobs by sha256, the others by git blob sha1."""
    repo = root / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    for path, data in files.items():
        lfs = path.endswith(".safetensors")
        blob = repo / "blobs" / (hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data))
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / ref).write_text(commit)
    return repo


def cache_tree(repo: Path) -> dict[str, str | bytes]:
    """refs, blobs and snapshot links of a cached repo: what must match the source."""
    out: dict[str, str | bytes] = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo).as_posix()
        if rel.split("/")[0] not in ("refs", "blobs", "snapshots") or p.is_dir() and not p.is_symlink():
            continue
        out[rel] = os.readlink(p) if p.is_symlink() else p.read_bytes()
    return out


@pytest.fixture
def source(tmp_path: Path) -> Path:
    make_repo(tmp_path / "src")
    return tmp_path / "src"


def as_hf_endpoint(server: HubServer, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What HF_ENDPOINT and HF_HOME do when huggingface_hub is imported, for this process: no
    request of the tests leaves the machine, nothing is written to ~/.cache/huggingface."""
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    harnesses = tmp / "agent_harnesses.json"  # fresh: the client does not fetch it again
    harnesses.write_text(json.dumps(hf_endpoint.AGENT_HARNESSES))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(harnesses))


@pytest.fixture
def hub(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    server = hf_endpoint.serve_in_thread(source)
    as_hf_endpoint(server, tmp_path, monkeypatch)
    yield server
    server.shutdown()
    server.server_close()


def download(cache: Path, revision: str | None = None) -> str:
    return snapshot_download(REPO, cache_dir=cache, revision=revision)


def test_snapshot_download_with_hf_endpoint_reproduces_the_source_cache(
        hub: HubServer, source: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "home"),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        env.pop(var, None)
    code = f"from huggingface_hub import snapshot_download; print(snapshot_download({REPO!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    got = tmp_path / "home" / "hub" / "models--lab-org--tiny-model"
    assert out == str(got / "snapshots" / COMMIT)
    assert cache_tree(got) == cache_tree(source / "hub" / "models--lab-org--tiny-model")
    assert Request("GET", "/api/agent-harnesses", None, 200) in hub.requests
    assert not any(r.status >= 400 for r in hub.requests), hub.requests


def test_every_file_is_one_head_and_one_get_after_the_listing(hub: HubServer, tmp_path: Path) -> None:
    download(tmp_path / "cache")
    calls = sorted((r.method, r.path.split("?")[0]) for r in hub.requests)
    api = [("GET", f"/api/models/{REPO}/revision/main"), ("GET", f"/api/models/{REPO}/tree/{COMMIT}")]
    files = [(m, f"/{REPO}/resolve/{COMMIT}/{p}") for p in FILES for m in ("GET", "HEAD")]
    assert calls == sorted(api + files)


def test_a_commit_as_revision_needs_no_ref(hub: HubServer, tmp_path: Path) -> None:
    path = download(tmp_path / "cache", revision=COMMIT)
    assert Path(path, SHARD).read_bytes() == FILES[SHARD]
    assert not any("/revision/" in r.path for r in hub.requests)
    assert not (tmp_path / "cache" / "models--lab-org--tiny-model" / "refs").exists()


def test_a_second_download_is_one_request_and_fetches_no_file(hub: HubServer, tmp_path: Path) -> None:
    first = download(tmp_path / "cache")
    hub.requests.clear()
    assert download(tmp_path / "cache") == first
    assert hub.requests == [Request("GET", f"/api/models/{REPO}/revision/main", None, 200)]


def test_errors_raise_the_clients_own_exceptions(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("lab-org/absent", cache_dir=tmp_path / "c")
    with pytest.raises(RevisionNotFoundError):
        download(tmp_path / "c", revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.json", cache_dir=tmp_path / "c")
    # the miss is cached per commit, as with the Hub (it answered with X-Repo-Commit)
    assert (tmp_path / "c" / "models--lab-org--tiny-model" / ".no_exist" / COMMIT / "absent.json").exists()


class CutOnce(Handler):
    """Sends the shard's first chunk and 1 MiB more once, then closes the connection: the
    client resumes from the whole chunks it wrote (httpx hands them over chunk by chunk)."""

    cut = threading.Event()

    def copy_body(self, src: BinaryIO, length: int) -> None:
        if self.path.endswith(SHARD) and not CutOnce.cut.is_set():
            CutOnce.cut.set()
            self.wfile.write(src.read(constants.DOWNLOAD_CHUNK_SIZE + (1 << 20)))
            self.close_connection = True
            return
        super().copy_body(src, length)


def test_a_download_cut_short_resumes_with_a_range_request(
        source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    CutOnce.cut.clear()
    server = hf_endpoint.serve_in_thread(source, handler=CutOnce)
    as_hf_endpoint(server, tmp_path, monkeypatch)
    try:
        path = download(tmp_path / "cache")
    finally:
        server.shutdown()
        server.server_close()
    assert Path(path, SHARD).read_bytes() == FILES[SHARD]
    shard_gets = [(r.range, r.status) for r in server.requests
                  if r.method == "GET" and r.path.endswith(SHARD)]
    assert shard_gets == [(None, 200), (f"bytes={constants.DOWNLOAD_CHUNK_SIZE}-", 206)]


def test_model_info_and_tree_are_the_hubs(hub: HubServer, tmp_path: Path) -> None:
    api = HfApi()
    info = api.model_info(REPO, files_metadata=True)  # no revision: /api/models/{repo}
    assert info.sha == COMMIT
    lfs = {s.rfilename: s.lfs.sha256 for s in info.siblings or [] if s.lfs}
    assert lfs == {p: hashlib.sha256(d).hexdigest() for p, d in FILES.items()
                   if p.endswith(".safetensors")}
    # oids as git computes them: a git repo holding the same files, LFS ones as pointers
    work = tmp_path / "git"
    for p, d in FILES.items():
        (work / p).parent.mkdir(parents=True, exist_ok=True)
        lfs_file = p.endswith(".safetensors")
        pointer = hf_endpoint.lfs_pointer(hashlib.sha256(d).hexdigest(), len(d))
        (work / p).write_bytes(pointer if lfs_file else d)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t",
           "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)

    def git_oid(p: str) -> str:
        return subprocess.run([*git, "rev-parse", f"HEAD:{p}"], capture_output=True, text=True,
                              check=True).stdout.strip()

    def oids(entries: Iterable[RepoFile | RepoFolder]) -> dict[str, str]:
        return {e.path: e.blob_id if isinstance(e, RepoFile) else e.tree_id for e in entries}

    top = oids(api.list_repo_tree(REPO))
    assert top == {p.split("/")[0]: git_oid(p.split("/")[0]) for p in FILES}
    everything = oids(api.list_repo_tree(REPO, recursive=True, revision=COMMIT))
    assert everything == {p: git_oid(p) for p in [*FILES, "extra"]}


def test_routes_outside_the_subset_are_plain_404s(hub: HubServer) -> None:
    for path in ("/api/models", "/api/datasets/x/y", f"/{REPO}/blob/main/config.json"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(hub.url + path)
        assert e.value.code == 404, path
        assert json.loads(e.value.read())["error"]


@pytest.mark.parametrize(("header", "want"), [
    (None, None),
    ("bytes=0-", (0, 99)),
    ("bytes=10-19", (10, 19)),
    ("bytes=90-500", (90, 99)),
    ("bytes=-10", (90, 99)),
    ("bytes=0-1,5-6", None),  # several ranges: the whole file
])
def test_range(header: str | None, want: tuple[int, int] | None) -> None:
    assert parse_range(header, 100) == want


def test_a_range_past_the_end_is_416() -> None:
    with pytest.raises(HubError) as e:
        parse_range("bytes=100-", 100)
    assert e.value.status == 416


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(pid: int) -> bool:
    cmdline = Path(f"/proc/{pid}/cmdline")
    return cmdline.exists() and b"hf_endpoint.py" in cmdline.read_bytes()


def test_start_and_stop_in_node(source: Path, tmp_path: Path) -> None:
    """`sh -c` stands for the ssh prefix: ssh too runs its last argument with the remote shell."""
    node_dir, port = str(tmp_path / "node"), free_port()
    info_url = f"http://127.0.0.1:{port}/api/models/{REPO}/revision/main"
    try:
        hf_endpoint.start_in_node(["sh", "-c"], str(source), port, node_dir=node_dir)
        pid = int(Path(node_dir, f"{port}.pid").read_text())
        with urllib.request.urlopen(info_url) as r:
            assert json.load(r)["sha"] == COMMIT
        hf_endpoint.start_in_node(["sh", "-c"], str(source), port, node_dir=node_dir)  # a restart
        assert not serving(pid)
        pid = int(Path(node_dir, f"{port}.pid").read_text())
        assert serving(pid)
    finally:
        hf_endpoint.stop_in_node(["sh", "-c"], port, node_dir=node_dir)
    assert not Path(node_dir, f"{port}.pid").exists()
    assert not serving(pid)
    assert "GET /api/models/" in Path(node_dir, f"{port}.log").read_text()  # one line per request
    with pytest.raises(OSError):
        urllib.request.urlopen(info_url, timeout=2)
