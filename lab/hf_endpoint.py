"""A lab-local Hugging Face Hub: serves model repos from a directory in HF *cache* layout, so
`huggingface_hub.snapshot_download(repo_id, revision=...)` with `HF_ENDPOINT=http://HOST:PORT`
downloads them exactly as it would from huggingface.co, without the internet.

Stdlib only, one file: it runs inside a lab node (plain python3 3.11, no pip packages) and is
importable from the host (tests, `start_in_node`).

What it serves, from ``ROOT/hub/models--<org>--<name>/`` (what `snapshot_download` leaves)::

    refs/<rev>                     40-hex commit (a branch or tag; `refs/pr/1` nests)
    snapshots/<commit>/<path>  ->  ../../blobs/<blob>
    blobs/<blob>                   named by the sha256 of the content for LFS files (64 hex),
                                   by the git blob sha1 for the others (40 hex)

Nothing is hashed at request time: the blob names are the hashes. Directories are scanned on
every request, so repos written while the server runs are served at once.

Endpoints (the subset huggingface_hub 1.33.0 calls for snapshot_download and hf_hub_download;
verified by tests/unit/test_hf_endpoint.py against that release):

- ``GET /api/models/{repo}[/revision/{rev}]`` model_info / repo_info: id, sha, siblings
  (with size, blobId and lfs when ``?blobs=true``). Without a revision: ``main``.
- ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=true`` list_repo_tree. 1.33.0's
  snapshot_download lists files here, not from `siblings`, and caches the listing in
  ``trees/<commit>.json``. Entries as the Hub's: ``{type, oid, size, path, lfs: {oid, size,
  pointerSize}}``, directories with their git tree id. One page: the Hub pages long listings
  with a ``Link: <…>; rel="next"`` header the client follows; a lab repo has a few dozen files.
- ``HEAD|GET /{repo}/resolve/{rev}/{path}`` the file: ``X-Repo-Commit``, ``ETag`` (git sha1,
  or the sha256 for LFS files, also in ``X-Linked-Etag`` with ``X-Linked-Size``),
  ``Content-Length``, ``Accept-Ranges: bytes``; ``Range: bytes=N-`` answers 206. The client
  names the blob after ``X-Linked-Etag or ETag``. When a body stops short it retries the same
  GET (same process; a new process starts over) with ``Range: bytes=N-``, N the bytes it wrote:
  whole 10 MiB chunks (``DOWNLOAD_CHUNK_SIZE``), so a cut in the first 10 MiB retries without a
  Range. No redirect (the Hub sends LFS files to a CDN).
- ``GET /api/agent-harnesses`` an empty registry: every client process fetches it once a day
  from ``HF_ENDPOINT`` to detect AI agents for its user-agent.
- Errors as the Hub sends them: 404 with ``X-Error-Code`` ``RepoNotFound`` /
  ``RevisionNotFound`` / ``EntryNotFound`` (with ``X-Repo-Commit``, so the client records the
  miss in ``.no_exist/``), ``X-Error-Message`` and ``{"error": ...}``.

Xet is never advertised (no ``X-Xet-Hash``, no ``Link: <...>; rel="xet-auth"``, no
``xetHash`` in the tree), so the client takes the plain HTTP path even with hf_xet installed.
Any token is accepted and none is required. Models only: no datasets, spaces, uploads.

Run it in a node, in the foreground (one line per request on stderr)::

    ssh root@node-1 python3 - --root /lab/hf --port 8088 < lab/hf_endpoint.py

or in the background, as `start_in_node` does: the script is copied to
``/tmp/hf-endpoint/hf_endpoint.py``, started with ``setsid nohup`` (log and pid file
``/tmp/hf-endpoint/<port>.{log,pid}``, the log appended across restarts) and polled until it
answers::

    from lab import hf_endpoint, keys
    hf_endpoint.start_in_node(keys.ssh_argv("10.0.0.11"), "/lab/hf", 8088)
    # in the node: HF_ENDPOINT=http://127.0.0.1:8088 python3 -c 'snapshot_download(...)'
    hf_endpoint.stop_in_node(keys.ssh_argv("10.0.0.11"), 8088)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_BIND = "127.0.0.1"
DEFAULT_REVISION = "main"  # huggingface_hub's constants.DEFAULT_REVISION
NODE_DIR = "/tmp/hf-endpoint"  # in a node: the script, <port>.pid and <port>.log
READY_TIMEOUT_S = 10.0  # start_in_node: how long the new server may take to answer
SSH_TIMEOUT_S = 60.0
CHUNK_BYTES = 1 << 20
SERVER_VERSION = "spark-vllm-hf-endpoint/1"  # the probe checks it: another server on the port is no answer

# Every client process asks for it once a day (user-agent agent detection, utils/_detect_agent.py);
# empty: no agent is ever detected, as when the Hub cannot be reached, but without the error.
AGENT_HARNESSES: dict[str, object] = {"standardEnvVars": [], "harnesses": {}}

_COMMIT = re.compile(r"[0-9a-f]{40}")
_LFS_BLOB = re.compile(r"[0-9a-f]{64}")  # sha256: LFS; a 40-hex name is a git blob sha1


class HubError(Exception):
    """An error answer as the Hub gives it (status, X-Error-Code, message)."""

    def __init__(self, status: int, code: str, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclass(frozen=True)
class RepoFile:
    path: str  # in the repo, "/"-separated
    blob: Path  # ROOT/hub/models--…/blobs/<name>
    size: int
    lfs_sha256: str | None  # None: a plain git file, whose blob name is its git sha1

    @property
    def etag(self) -> str:
        return self.lfs_sha256 or self.blob.name

    @property
    def git_oid(self) -> str:
        """The blob git stores: for an LFS file, its pointer."""
        if self.lfs_sha256 is None:
            return self.blob.name
        return _git_sha1(b"blob", lfs_pointer(self.lfs_sha256, self.size))


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _git_sha1(kind: bytes, body: bytes) -> str:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body).hexdigest()


def repo_dir(root: Path, repo_id: str) -> Path:
    return root / "hub" / ("models--" + repo_id.replace("/", "--"))


def resolve_revision(repo: Path, revision: str) -> str:
    """A branch, tag or commit → the commit whose snapshot exists."""
    if _COMMIT.fullmatch(revision) and (repo / "snapshots" / revision).is_dir():
        return revision
    refs = (repo / "refs").resolve()
    ref = (refs / revision).resolve()
    if ref.is_relative_to(refs) and ref.is_file():
        commit = ref.read_text().strip()
        if (repo / "snapshots" / commit).is_dir():
            return commit
    raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")


def list_files(repo: Path, commit: str) -> dict[str, RepoFile]:
    """path → file of one snapshot, from its symlinks into blobs/."""
    snapshot = repo / "snapshots" / commit
    files = {}
    for link in sorted(snapshot.rglob("*")):
        if link.is_dir() and not link.is_symlink():
            continue
        rel = link.relative_to(snapshot).as_posix()
        if not link.is_symlink():
            raise HubError(500, "BadCache", f"{rel}: not a symlink into blobs/ (HF cache layout)")
        blob = repo / "blobs" / Path(link.readlink()).name
        if not blob.is_file():
            raise HubError(500, "BadCache", f"{rel}: blob {blob.name} missing")
        lfs = blob.name if _LFS_BLOB.fullmatch(blob.name) else None
        if lfs is None and not _COMMIT.fullmatch(blob.name):
            raise HubError(500, "BadCache", f"{rel}: blob name {blob.name} is no sha1/sha256")
        files[rel] = RepoFile(rel, blob, blob.stat().st_size, lfs)
    return files


def _tree_oid(files: dict[str, RepoFile], prefix: str) -> str:
    """Git tree id of the directory `prefix` ("" for the root), as the Hub reports it."""
    entries: dict[str, tuple[bytes, str]] = {}
    for path, f in files.items():
        if not path.startswith(prefix):
            continue
        name, sep, _ = path[len(prefix):].partition("/")
        if name in entries:  # a subdirectory seen before
            continue
        entries[name] = (b"40000", _tree_oid(files, prefix + name + "/")) if sep else (b"100644", f.git_oid)
    # git sorts a directory as if its name ended with "/"
    order = sorted(entries, key=lambda n: n + "/" if entries[n][0] == b"40000" else n)
    body = b"".join(entries[n][0] + b" " + n.encode() + b"\0" + bytes.fromhex(entries[n][1])
                    for n in order)
    return _git_sha1(b"tree", body)


def tree_entries(files: dict[str, RepoFile], path: str, recursive: bool) -> list[dict[str, object]]:
    """The /tree answer for `path` ("" for the root): files and directories below it."""
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    out: dict[str, dict[str, object]] = {}
    for rel, f in files.items():
        if not rel.startswith(prefix):
            continue
        parts = rel[len(prefix):].split("/")
        for depth in range(1, len(parts)):  # directories on the way
            d = prefix + "/".join(parts[:depth])
            if (recursive or depth == 1) and d not in out:
                out[d] = {"type": "directory", "oid": _tree_oid(files, d + "/"), "size": 0, "path": d}
        if recursive or len(parts) == 1:
            entry: dict[str, object] = {"type": "file", "oid": f.git_oid, "size": f.size, "path": rel}
            if f.lfs_sha256:
                entry["lfs"] = {"oid": f.lfs_sha256, "size": f.size,
                                "pointerSize": len(lfs_pointer(f.lfs_sha256, f.size))}
            out[rel] = entry
    if prefix and not out:
        raise HubError(404, "EntryNotFound", f"{path} does not exist on this revision")
    return [out[k] for k in sorted(out)]


def model_info(repo_id: str, repo: Path, commit: str, blobs: bool) -> dict[str, object]:
    files = list_files(repo, commit)
    siblings: list[dict[str, object]] = []
    for f in files.values():
        s: dict[str, object] = {"rfilename": f.path}
        if blobs:  # files_metadata=True
            s.update(size=f.size, blobId=f.git_oid)
            if f.lfs_sha256:
                s["lfs"] = {"sha256": f.lfs_sha256, "size": f.size,
                            "pointerSize": len(lfs_pointer(f.lfs_sha256, f.size))}
        siblings.append(s)
    modified = time.gmtime((repo / "snapshots" / commit).stat().st_mtime)
    return {
        "_id": commit[:24], "id": repo_id, "modelId": repo_id, "author": repo_id.partition("/")[0],
        "sha": commit, "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", modified),
        "private": False, "disabled": False, "gated": False, "tags": [], "siblings": siblings,
    }


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """`bytes=A-B` / `bytes=A-` / `bytes=-N` → (start, end inclusive); None: send it all."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not m or not (m[1] or m[2]):
        return None  # absent, or several ranges: a 200 with the whole file is a valid answer
    if not m[1]:
        start, end = max(size - int(m[2]), 0), size - 1
    else:
        start, end = int(m[1]), min(int(m[2]), size - 1) if m[2] else size - 1
    if start > end:
        raise HubError(416, "RangeNotSatisfiable", f"{header} of {size} bytes")
    return start, end


@dataclass(frozen=True)
class Request:
    """One answered request, kept by the server (tests count them)."""

    method: str
    path: str
    range: str | None
    status: int


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, address: tuple[str, int],
                 handler: type[BaseHTTPRequestHandler] | None = None):
        super().__init__(address, handler or Handler)
        self.root = root
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    server_version = SERVER_VERSION
    server: HubServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._dispatch()

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.log_message('"%s" %s range=%s', self.requestline, code, self.headers.get("Range", "-"))

    def copy_body(self, src: BinaryIO, length: int) -> None:
        """Send `length` bytes of `src` (tests override it to cut a download short)."""
        while length > 0:
            chunk = src.read(min(CHUNK_BYTES, length))
            if not chunk:
                break
            self.wfile.write(chunk)
            length -= len(chunk)

    def _dispatch(self) -> None:
        status = 500
        try:
            status = self._route()
        except HubError as e:
            status = e.status
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        self.server.record(Request(self.command, self.path, self.headers.get("Range"), status))

    def _route(self) -> int:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if parts == ["api", "agent-harnesses"]:
            return self._send_json(AGENT_HARNESSES)
        if parts[:2] == ["api", "models"] and len(parts) > 2:
            repo_id, repo, rest = self._repo(parts[2:], ("revision", "tree"))
            if not rest:
                return self._model_info(repo_id, repo, DEFAULT_REVISION, query)
            if rest[0] == "revision" and len(rest) == 2:
                return self._model_info(repo_id, repo, rest[1], query)
            if rest[0] == "tree" and len(rest) >= 2:
                files = list_files(repo, resolve_revision(repo, rest[1]))
                recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
                return self._send_json(tree_entries(files, "/".join(rest[2:]), recursive))
        elif len(parts) >= 3 and "resolve" in parts[1:3]:
            repo_id, repo, rest = self._repo(parts, ("resolve",))
            if len(rest) >= 3:
                return self._resolve(repo, rest[1], "/".join(rest[2:]))
        raise HubError(404, "NotFound", f"no route for {url.path}")

    def _repo(self, parts: list[str], keywords: tuple[str, ...]) -> tuple[str, Path, list[str]]:
        """Split `org/name/<keyword>/…` or `name/<keyword>/…`; the repo must exist."""
        candidates = [n for n in (2, 1) if n <= len(parts)
                      and (n == len(parts) or parts[n] in keywords)]
        for n in candidates:
            repo_id = "/".join(parts[:n])
            repo = repo_dir(self.server.root, repo_id)
            if repo.is_dir():
                return repo_id, repo, parts[n:]
        raise HubError(404, "RepoNotFound", "Repository not found")

    def _model_info(self, repo_id: str, repo: Path, revision: str,
                    query: dict[str, list[str]]) -> int:
        blobs = query.get("blobs", ["false"])[0].lower() in ("true", "1")
        return self._send_json(model_info(repo_id, repo, resolve_revision(repo, revision), blobs))

    def _resolve(self, repo: Path, revision: str, path: str) -> int:
        commit = resolve_revision(repo, revision)
        f = list_files(repo, commit).get(path)
        if f is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {revision}", commit)
        span = parse_range(self.headers.get("Range"), f.size)
        start, end = span or (0, f.size - 1)
        status = 206 if span else 200
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{f.etag}"')
        self.send_header("X-Repo-Commit", commit)
        if f.lfs_sha256:
            self.send_header("X-Linked-Etag", f'"{f.lfs_sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
        if span:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if self.command == "GET":
            with f.blob.open("rb") as src:
                src.seek(start)
                self.copy_body(src, end - start + 1)
        return status

    def _send_json(self, data: object) -> int:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)
        return 200

    def _send_error(self, e: HubError) -> None:
        body = json.dumps({"error": e.message}).encode()
        self.send_response(e.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Error-Code", e.code)
        self.send_header("X-Error-Message", e.message)
        if e.commit:
            self.send_header("X-Repo-Commit", e.commit)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)


def serve_in_thread(root: Path, bind: str = DEFAULT_BIND, port: int = 0,
                    handler: type[Handler] = Handler) -> HubServer:
    """A running server (port 0: any free one, see `.url`); end it with `.shutdown()` and
    `.server_close()`."""
    server = HubServer(root, (bind, port), handler)
    # a short poll: shutdown() waits for it (0.5 s by default, per test)
    threading.Thread(target=server.serve_forever, args=(0.05,), name="hf-endpoint",
                     daemon=True).start()
    return server


def probe(bind: str, port: int, timeout_s: float) -> bool:
    """Whether this server (not any other) answers on bind:port within timeout_s."""
    host = "127.0.0.1" if bind in ("", "0.0.0.0") else bind
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/api/models", timeout=1) as r:
                server = r.headers.get("Server", "")
        except urllib.error.HTTPError as e:  # the 404 of an unknown route is an answer
            server = e.headers.get("Server", "")
        except OSError:
            server = ""
        if server.startswith(SERVER_VERSION):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# Shell run in the node; Python writes only the quoted variables above it.
_STOP_SH = """\
pid=$(cat "$pidfile" 2>/dev/null || true)
if [ -n "$pid" ] && grep -qa hf_endpoint.py "/proc/$pid/cmdline" 2>/dev/null; then
  kill "$pid" || true
  i=0  # a zombie's cmdline is empty: the loop does not wait for its reaping
  while grep -qa hf_endpoint.py "/proc/$pid/cmdline" 2>/dev/null && [ $i -lt 50 ]; do
    sleep 0.1; i=$((i + 1))
  done
fi
rm -f "$pidfile"
"""
_START_SH = """\
set -e
mkdir -p "$dir"
cat > "$script"
""" + _STOP_SH + """\
setsid nohup python3 "$script" --root "$root" --port "$port" --bind "$bind" \
  >> "$log" 2>&1 < /dev/null &
echo $! > "$pidfile"
python3 "$script" --probe --port "$port" --bind "$bind" --timeout-s "$timeout_s" \
  || { tail -n 20 "$log" >&2; exit 1; }
"""


def _node_script(body: str, node_dir: str, port: int, **values: str) -> str:
    values = {"dir": node_dir, "script": f"{node_dir}/hf_endpoint.py",
              "pidfile": f"{node_dir}/{port}.pid", "log": f"{node_dir}/{port}.log",
              "port": str(port), **values}
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()) + body


def start_in_node(node_ssh_argv_prefix: list[str], root: str, port: int,
                  bind: str = DEFAULT_BIND, node_dir: str = NODE_DIR) -> None:
    """Start the server in a node (replacing one already on `port`) and wait until it answers.

    `node_ssh_argv_prefix` runs its last argument as a shell command in the node, e.g.
    `keys.ssh_argv(addr)`. `root` is the node's directory holding `hub/models--…`.
    """
    from lab.run import run  # here, not on top: in a node this file runs alone

    script = _node_script(_START_SH, node_dir, port, root=root, bind=bind,
                          timeout_s=str(READY_TIMEOUT_S))
    run([*node_ssh_argv_prefix, script], input=Path(__file__).read_text(),
        timeout=SSH_TIMEOUT_S + READY_TIMEOUT_S)


def stop_in_node(node_ssh_argv_prefix: list[str], port: int, node_dir: str = NODE_DIR) -> None:
    """Stop the server `start_in_node` started on `port`; nothing to do when none runs."""
    from lab.run import run

    run([*node_ssh_argv_prefix, _node_script(_STOP_SH, node_dir, port)], input="",
        timeout=SSH_TIMEOUT_S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--root", type=Path, help="directory holding hub/models--<org>--<name>/")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", default=DEFAULT_BIND)
    p.add_argument("--probe", action="store_true",
                   help="do not serve: exit 0 once a server of this kind answers on bind:port")
    p.add_argument("--timeout-s", type=float, default=READY_TIMEOUT_S, help="with --probe")
    args = p.parse_args(argv)
    if args.probe:
        return 0 if probe(args.bind, args.port, args.timeout_s) else 1
    if args.root is None or not (args.root / "hub").is_dir():
        p.error(f"--root {args.root}: no hub/ directory in it")
    server = HubServer(args.root.resolve(), (args.bind, args.port))
    print(f"hf_endpoint: serving {args.root}/hub on {server.url}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
