"""spark-vllm's model staging helper, run with the node's own python3 (stdlib only), or with the
image's for `download`. The program sends it on stdin: `python3 - MODE ARGS…`.

A model lives in the node's hfCache in huggingface_hub's layout,
`HF/hub/models--ORG--NAME/{refs/REV, snapshots/COMMIT/FILE -> ../../blobs/BLOB, blobs/BLOB}`,
where an LFS file's blob is named by the sha256 of its content and a small file's by its git
blob sha1: the snapshot carries its own hashes. The manifest of one commit (every snapshot file,
its blob and size) is kept in `HF/spark-vllm/manifests/`, outside the hub cache, and travels
with the copy; a worker's copy is verified against it.

  build HF REPO REV          (head) resolve REV, check the snapshot is complete (config.json,
                             every shard of the safetensors index), hash every blob that was not
                             hashed at its current size and mtime (no re-hash of 120 GB when
                             nothing changed), write the manifest; prints a summary JSON.
                             Exit 4: not in the cache, or incomplete (the caller may download).
  need HF REPO COMMIT        (worker, manifest copied) first hashes every whole blob not yet
                             verified at its size and mtime and deletes one that does not match
                             its name (re-sent then); prints bytes still to copy, bytes free on
                             hfCache's filesystem and the node's cores, as JSON.
  mark HF REPO COMMIT        (worker, after rsync, which checks each transfer with its own
                             checksum) record every whole blob as verified at its size and mtime.
  check HF REPO REV          (any node) one line: "complete", "incomplete: …" or "gone". Sizes,
                             and size and mtime against the verified record where there is one
                             (a blob written since it was verified): stat only, cheap at read time.
  recv HF REPO COMMIT IP N   (worker, copyTransport tcp) listen on IP for N streams from the head;
                             prints "listening PORT TOKEN"; each blob is written beside its name,
                             hashed as it arrives and renamed only when it matches its name.
  push-tcp HF REPO COMMIT HOST PORT TOKEN N WHAT    (head) send the blobs over N connections.
  push-rsync HF FILES N DEST SSH_OPTS WHAT          (head) N rsync-over-SSH transfers of FILES.
  files HF REPO COMMIT       rsync's --files-from list (relative to HF) for that commit.
  commit HF REPO REV         the commit REV stands for in this cache (exit 4: not there).
  download HF REPO REV       (in the image) snapshot_download; prints "total BYTES" first.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

PROGRESS_EVERY_S = 10
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class IncompleteModelError(Exception):
    """The model is not (wholly) in the cache; exit 4."""


def log(msg: str) -> None:
    print(f"[spark-vllm] {os.environ.get('SPARK_VLLM_NODE', 'node')}: model: {msg}",
          file=sys.stderr, flush=True)


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def repo_dir(hf: str, repo: str) -> str:
    return os.path.join(hf, "hub", "models--" + repo.replace("/", "--"))


def manifest_path(hf: str, repo: str, commit: str) -> str:
    return os.path.join(hf, "spark-vllm", "manifests",
                        f"models--{repo.replace('/', '--')}@{commit}.json")


def resolve(hf: str, repo: str, rev: str) -> str:
    rd = repo_dir(hf, repo)
    if not os.path.isdir(rd):
        raise IncompleteModelError(f"{repo} is not in {hf}/hub")
    if _HEX40.match(rev) and os.path.isdir(os.path.join(rd, "snapshots", rev)):
        return rev
    try:
        with open(os.path.join(rd, "refs", rev)) as f:
            commit = f.read().strip()
    except OSError:
        raise IncompleteModelError(f"{repo} has no revision {rev!r} in {hf}/hub (refs/{rev})") from None
    if not _HEX40.match(commit):
        raise IncompleteModelError(f"{repo} refs/{rev} holds {commit!r}, not a commit")
    return commit


def snapshot_files(hf: str, repo: str, commit: str) -> list[dict[str, Any]]:
    """Every file of the snapshot: {path, blob, size}, paths relative to HF."""
    rd = repo_dir(hf, repo)
    snap = os.path.join(rd, "snapshots", commit)
    if not os.path.isdir(snap):
        raise IncompleteModelError(f"{repo} snapshot {commit} is missing")
    out: list[dict[str, Any]] = []
    for root, _dirs, names in os.walk(snap):
        for name in sorted(names):
            p = os.path.join(root, name)
            rel = os.path.relpath(p, hf)
            if os.path.islink(p):
                target = os.path.realpath(p)
                if not os.path.exists(target):
                    raise IncompleteModelError(f"{os.path.relpath(p, snap)}: its blob is missing")
                blob = os.path.relpath(target, hf)
            else:  # a plain file in the snapshot (not huggingface_hub's layout, but readable)
                blob = rel
            out.append({"path": rel, "blob": blob, "size": os.stat(p).st_size})
    out.sort(key=lambda e: str(e["path"]))
    present = {os.path.relpath(os.path.join(hf, e["path"]), snap) for e in out}
    if "config.json" not in present:
        raise IncompleteModelError(f"{repo}@{commit[:12]} has no config.json")
    if "model.safetensors.index.json" in present:
        with open(os.path.join(snap, "model.safetensors.index.json")) as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        missing = [s for s in shards if s not in present]
        if missing:
            raise IncompleteModelError(f"{repo}@{commit[:12]} lacks {len(missing)} of {len(shards)} shards "
                             f"of its index: {', '.join(missing[:5])}")
    elif not any(n.endswith((".safetensors", ".bin", ".pt", ".gguf")) for n in present):
        raise IncompleteModelError(f"{repo}@{commit[:12]} has no weight files")
    return out


class Progress:
    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done = what, total, 0
        self.start = self.last = time.monotonic()

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate else 0
            log(f"{self.what}: {gb(self.done)} of {gb(self.total)} "
                f"({100 * self.done / max(self.total, 1):.0f} %), {rate / 1e6:.0f} MB/s, "
                f"ETA {eta:.0f} s")


def blob_hash(name: str, size: int) -> Any:
    """The hash a blob's name is: git's blob sha1 (40 hex, size-prefixed) or sha256 (LFS)."""
    if _HEX40.match(name):
        h = hashlib.sha1()
        h.update(b"blob %d\0" % size)
        return h
    return hashlib.sha256()


def _hash_blob(path: str, name: str, progress: Progress) -> str:
    h = blob_hash(name, os.stat(path).st_size)
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            progress.add(len(chunk))
    return h.hexdigest()


def build(hf: str, repo: str, rev: str) -> dict[str, Any]:
    commit = resolve(hf, repo, rev)
    files = snapshot_files(hf, repo, commit)
    seen = read_verified(hf, repo) or {}
    todo = []
    for e in {e["blob"]: e for e in files}.values():
        st = os.stat(os.path.join(hf, e["blob"]))
        if seen.get(e["blob"]) != [st.st_size, st.st_mtime_ns]:
            todo.append((e["blob"], st))
    progress = Progress("verifying hashes", sum(st.st_size for _, st in todo))
    for blob, st in todo:
        name = os.path.basename(blob)
        if _HEX40.match(name) or _HEX64.match(name):
            got = _hash_blob(os.path.join(hf, blob), name, progress)
            if got != name:
                raise SystemExit(f"{blob} is corrupt: its content hashes to {got}; delete it "
                                 "and let spark-vllm fetch the model again")
        seen[blob] = [st.st_size, st.st_mtime_ns]
    _write_json(verified_path(hf, repo), seen)
    manifest = {"repo": repo, "revision": rev, "commit": commit, "files": files,
                "bytes": sum(e["size"] for e in files)}
    text = json.dumps(manifest, sort_keys=True, indent=1) + "\n"
    _write_text(manifest_path(hf, repo, commit), text)
    return {"model": repo, "revision": rev, "commit": commit, "files": len(files),
            "bytes": manifest["bytes"], "hashed": progress.done,
            "manifest": hashlib.sha256(text.encode()).hexdigest()}


def _write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _write_json(path: str, data: object) -> None:
    _write_text(path, json.dumps(data, sort_keys=True))


def load_manifest(hf: str, repo: str, commit: str) -> dict[str, Any]:
    with open(manifest_path(hf, repo, commit)) as f:
        return json.load(f)


def problems(hf: str, manifest: dict[str, Any]) -> list[str]:
    """What differs from the manifest, by file size and link target, and by size and mtime
    from the verified record where the node keeps one (no hashing)."""
    out = []
    seen = read_verified(hf, manifest["repo"])
    for e in manifest["files"]:
        p = os.path.join(hf, e["path"])
        name = e["path"].split("/", 4)[-1]
        try:
            size = os.stat(p).st_size
        except OSError:
            out.append(f"{name} is missing")
            continue
        if size != e["size"]:
            out.append(f"{name} is {size} bytes, not {e['size']}")
        elif seen and e["blob"] in seen and seen[e["blob"]][1] != os.stat(p).st_mtime_ns:
            out.append(f"{name} was written since it was verified")
        elif e["blob"] != e["path"] and os.path.realpath(p) != os.path.join(
                os.path.realpath(hf), e["blob"]):
            out.append(f"{name} points elsewhere than its blob")
    return out


def verified_path(hf: str, repo: str) -> str:
    """{blob: [size, mtime_ns]} of the blobs hashed (head) or verified (nodes) at that state."""
    return os.path.join(hf, "spark-vllm", "hashes", f"models--{repo.replace('/', '--')}.json")


def read_verified(hf: str, repo: str) -> dict[str, list[int]] | None:
    try:
        with open(verified_path(hf, repo)) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def blob_ok(path: str, name: str) -> bool | None:
    """Whether the blob's content hashes to its name (None: the name is no hash)."""
    if not (_HEX40.match(name) or _HEX64.match(name)):
        return None
    return _hash_blob(path, name, Progress("", 0)) == name


def unique_blobs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return list({e["blob"]: e for e in manifest["files"]}.values())


def need(hf: str, manifest: dict[str, Any]) -> dict[str, Any]:
    seen = read_verified(hf, manifest["repo"]) or {}
    missing = 0
    for e in unique_blobs(manifest):
        path = os.path.join(hf, e["blob"])
        try:
            st = os.stat(path)
            have = st.st_size
        except OSError:
            have = 0
        if have == e["size"] and seen.get(e["blob"]) != [st.st_size, st.st_mtime_ns]:
            # whole but not verified as it is now: written since, or copied by an older copy
            if blob_ok(path, os.path.basename(e["blob"])) is False:
                log(f"{e['path'].split('/', 4)[-1]} does not match its hash: sending it again")
                os.unlink(path)
                seen.pop(e["blob"], None)
                have = 0
            else:
                seen[e["blob"]] = [st.st_size, st.st_mtime_ns]
        missing += max(e["size"] - have, 0) if have <= e["size"] else e["size"]
    _write_json(verified_path(hf, manifest["repo"]), seen)
    probe = hf
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe) or "/"
    return {"need": missing, "free": shutil.disk_usage(probe).free, "path": probe,
            "cpus": os.cpu_count() or 1}


def mark(hf: str, manifest: dict[str, Any]) -> None:
    seen = read_verified(hf, manifest["repo"]) or {}
    for e in unique_blobs(manifest):
        try:
            st = os.stat(os.path.join(hf, e["blob"]))
        except OSError:
            continue
        if st.st_size == e["size"]:
            seen[e["blob"]] = [st.st_size, st.st_mtime_ns]
    _write_json(verified_path(hf, manifest["repo"]), seen)


def rsync_files(manifest: dict[str, Any], hf: str) -> list[str]:
    repo, commit, rev = manifest["repo"], manifest["commit"], manifest["revision"]
    rd = os.path.relpath(repo_dir(hf, repo), hf)
    out = [] if rev == commit else [f"{rd}/refs/{rev}"]
    for e in manifest["files"]:
        out += [e["path"], e["blob"]] if e["blob"] != e["path"] else [e["path"]]
    out.append(os.path.relpath(manifest_path(hf, repo, commit), hf))
    return sorted(set(out))


# --- the copy's transfers ------------------------------------------------------------------

CHUNK = 4 << 20
PARTIAL = ".spark-vllm-partial"  # a blob being received: renamed to its name once it matches
ACCEPT_TIMEOUT_S = 60


def _plan(items: list[tuple[str, int]], n: int) -> list[list[tuple[str, int]]]:
    """Largest first onto the least-loaded of n bins (LPT): balanced transfers."""
    bins: list[list[tuple[str, int]]] = [[] for _ in range(max(n, 1))]
    load = [0] * len(bins)
    for item in sorted(items, key=lambda it: -it[1]):
        i = load.index(min(load))
        bins[i].append(item)
        load[i] += item[1]
    return [b for b in bins if b]


class Meter:
    """Bytes moved by all streams; one progress line every PROGRESS_EVERY_S with rate and ETA."""

    def __init__(self, what: str, total: int, streams: int) -> None:
        self.what, self.total, self.streams = what, total, streams
        self.done, self.lock = 0, threading.Lock()
        self.start = time.monotonic()
        self.stop = threading.Event()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n

    def report(self) -> None:
        while not self.stop.wait(PROGRESS_EVERY_S):
            now = time.monotonic()
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate else 0
            log(f"{self.what}: {gb(self.done)} of {gb(self.total)} "
                f"({100 * self.done / max(self.total, 1):.0f} %), {rate / 1e6:.0f} MB/s over "
                f"{self.streams} stream(s), ETA {eta:.0f} s")


def _readline(f: Any) -> str:
    line = f.readline()
    if not line:
        raise ConnectionError("the other end closed the connection")
    return str(line.decode() if isinstance(line, bytes) else line).rstrip("\n")


def recv(hf: str, manifest: dict[str, Any], ip: str, streams: int) -> None:
    """The node's end of copyTransport tcp. Only the manifest's blobs can be written, each to
    its partial name first: appended (a resumed transfer), hashed as it arrives (the prefix
    read back first), renamed when it matches its name, deleted when it does not."""
    blobs = {e["blob"]: e["size"] for e in unique_blobs(manifest)}
    seen = read_verified(hf, manifest["repo"]) or {}
    seen_lock = threading.Lock()
    token = secrets.token_hex(16)
    srv = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    srv.bind((ip, 0))
    srv.listen(streams)
    srv.settimeout(ACCEPT_TIMEOUT_S)
    print(f"listening {srv.getsockname()[1]} {token}", flush=True)
    errors: list[str] = []

    def serve(conn: socket.socket) -> None:
        # unbuffered: a line is read byte by byte (they are short) and a blob's bytes go from
        # the socket straight into the buffer that is written and hashed (no copy in between)
        rf = conn.makefile("rb", buffering=0)
        if not hmac.compare_digest(_readline(rf), token):
            raise PermissionError("a connection without the copy's token")
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while (line := _readline(rf)) != "DONE":
            blob, size = line.rsplit(" ", 1)
            if blob not in blobs or blobs[blob] != int(size):
                raise PermissionError(f"{blob} is not a blob of the manifest")
            path = os.path.join(hf, blob)
            part = path + PARTIAL
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.exists(path):
                if os.path.getsize(path) == blobs[blob]:  # whole: `need` verified it
                    conn.sendall(b"%d\n" % blobs[blob])
                    continue
                if os.path.getsize(path) < blobs[blob] and not os.path.exists(part):
                    os.replace(path, part)  # a short blob (rsync's --partial): resumed
                else:
                    os.unlink(path)
            have = os.path.getsize(part) if os.path.exists(part) else 0
            if have > blobs[blob]:
                os.unlink(part)
                have = 0
            conn.sendall(b"%d\n" % have)
            name = os.path.basename(blob)
            h = blob_hash(name, blobs[blob])
            with open(part, "ab+") as f:
                f.seek(0)
                while chunk := f.read(CHUNK):
                    h.update(chunk)
                left = blobs[blob] - have
                while left:
                    n = rf.readinto(view[:min(left, CHUNK)])
                    if not n:
                        raise ConnectionError(f"the head stopped sending {name}")
                    f.write(view[:n])
                    h.update(view[:n])
                    left -= n
            if (_HEX40.match(name) or _HEX64.match(name)) and h.hexdigest() != name:
                os.unlink(part)
                log(f"{name} arrived damaged (hash {h.hexdigest()[:12]}): dropped, resent")
                conn.sendall(b"bad\n")
                continue
            os.replace(part, path)
            st = os.stat(path)
            with seen_lock:
                seen[blob] = [st.st_size, st.st_mtime_ns]
            conn.sendall(b"ok\n")

    def guarded(conn: socket.socket) -> None:
        try:
            with conn:
                serve(conn)
        except (OSError, ValueError, ConnectionError) as err:
            errors.append(str(err))

    threads = []
    try:
        for _ in range(streams):
            conn, _addr = srv.accept()
            conn.settimeout(None)
            t = threading.Thread(target=guarded, args=(conn,), daemon=True)
            t.start()
            threads.append(t)
    except TimeoutError:
        errors.append(f"the head did not connect within {ACCEPT_TIMEOUT_S} s")
    for t in threads:
        t.join()
    _write_json(verified_path(hf, manifest["repo"]), seen)
    if errors:
        raise SystemExit("receiving: " + "; ".join(errors[:3]))


def push_tcp(hf: str, manifest: dict[str, Any], host: str, port: int, token: str, n: int,
             what: str) -> int:
    """The head's end: a queue of blobs, largest first, drained by n connections; each blob
    is sent from where the node has it (sendfile: no copy through this process)."""
    work: queue.Queue[tuple[str, int]] = queue.Queue()
    items = [(e["blob"], e["size"]) for e in unique_blobs(manifest)]
    for item in sorted(items, key=lambda it: -it[1]):
        work.put(item)
    meter = Meter(what, sum(size for _, size in items), n)
    sent = [0]
    errors: list[str] = []

    def stream() -> None:
        try:
            with socket.create_connection((host, port), timeout=30) as conn:
                conn.settimeout(None)
                rf = conn.makefile("rb")
                conn.sendall(token.encode() + b"\n")
                while True:
                    try:
                        blob, size = work.get_nowait()
                    except queue.Empty:
                        break
                    for attempt in (1, 2):
                        conn.sendall(f"{blob} {size}\n".encode())
                        have = int(_readline(rf))
                        meter.add(have if attempt == 1 else 0)
                        if have < size:
                            with open(os.path.join(hf, blob), "rb") as f:
                                done = 0
                                while done < size - have:
                                    k = conn.sendfile(f, have + done, size - have - done)
                                    if not k:
                                        raise ConnectionError(f"sending {blob} stopped")
                                    done += k
                                    meter.add(k)
                            sent[0] += size - have
                            answer = _readline(rf)
                        else:
                            answer = "ok"
                        if answer == "ok":
                            break
                        if attempt == 2:
                            raise ConnectionError(f"{os.path.basename(blob)} arrived damaged "
                                                  "twice")
                conn.sendall(b"DONE\n")
        except (OSError, ValueError, ConnectionError) as err:
            errors.append(str(err))

    reporter = threading.Thread(target=meter.report, daemon=True)
    reporter.start()
    threads = [threading.Thread(target=stream) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    meter.stop.set()
    if errors:
        raise SystemExit("sending: " + "; ".join(errors[:3]))
    return sent[0]


def push_rsync(hf: str, files: list[str], n: int, dest: str, ssh_opts: str, what: str) -> int:
    """n rsync-over-SSH transfers of `files` (relative to hf), balanced by size; progress summed
    over their --info=progress2 lines; returns the bytes sent (their --stats)."""
    sized = [(f, os.lstat(os.path.join(hf, f)).st_size) for f in files]
    # the blobs in parallel (their directory exists on the node), then the rest in one: refs,
    # snapshot links and the directories they imply, which parallel transfers would race on
    blobs = [it for it in sized if "/blobs/" in it[0]]
    rest = [it for it in sized if "/blobs/" not in it[0]]
    bins = _plan(blobs, n)
    meter = Meter(what, sum(size for _, size in sized), len(bins))
    moved = [0] * len(bins)
    sent = [0] * len(bins)
    errors: list[str] = []

    def one(i: int, batch: list[tuple[str, int]]) -> None:
        listing = "".join(f + "\n" for f, _ in batch).encode()
        proc = subprocess.Popen(
            ["rsync", "-a", "-s", "--partial", "--append-verify", "--no-inc-recursive",
             "--info=progress2", "--stats", "--outbuf=N", "-e", f"ssh {ssh_opts}",
             "--files-from=-", hf + "/", f"{dest}:{hf}/"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin and proc.stdout and proc.stderr
        proc.stdin.write(listing)
        proc.stdin.close()
        pending = b""
        while chunk := os.read(proc.stdout.fileno(), 65536):
            pending += chunk
            *records, pending = re.split(rb"[\r\n]", pending)
            for rec in records:
                fields = rec.decode(errors="replace").split()
                if len(fields) >= 4 and fields[1].endswith("%"):
                    now = int(fields[0].replace(",", ""))
                    meter.add(now - moved[i])
                    moved[i] = now
                elif rec.startswith(b"Total bytes sent:"):
                    sent[i] = int(fields[3].replace(",", ""))
        err = proc.stderr.read().decode(errors="replace")
        if proc.wait() != 0:
            errors.append(f"rsync exit {proc.returncode}: {err.strip()[-400:]}")

    reporter = threading.Thread(target=meter.report, daemon=True)
    reporter.start()
    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(bins)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if rest and not errors:
        moved.append(0)
        sent.append(0)
        one(len(moved) - 1, rest)
    meter.stop.set()
    if errors:
        raise SystemExit("\n".join(errors))
    return sum(sent)


def download(hf: str, repo: str, rev: str) -> None:  # pragma: no cover - runs in the image
    from huggingface_hub import HfApi, snapshot_download

    info = HfApi().model_info(repo, revision=rev, files_metadata=True)
    total = sum((s.size or 0) for s in info.siblings or [])
    print(f"total {total} {info.sha}", flush=True)
    probe = hf
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe) or "/"
    free = shutil.disk_usage(probe).free
    if free < total:
        raise SystemExit(f"{repo} needs {gb(total)} and {probe} has {gb(free)} free")
    snapshot_download(repo, revision=rev)
    print("done", flush=True)


def main(argv: list[str]) -> int:
    if argv[1] == "push-rsync":  # HF FILES N DEST SSH_OPTS WHAT
        with open(argv[3]) as f:
            files = [ln for ln in f.read().splitlines() if ln]
        print(push_rsync(argv[2], files, int(argv[4]), argv[5], argv[6], argv[7]))
        return 0
    if argv[1] == "push-tcp":  # HF REPO COMMIT HOST PORT TOKEN N WHAT
        manifest = load_manifest(argv[2], argv[3], argv[4])
        print(push_tcp(argv[2], manifest, argv[5], int(argv[6]), argv[7], int(argv[8]),
                       argv[9]))
        return 0
    if argv[1] == "recv":  # HF REPO COMMIT IP N
        recv(argv[2], load_manifest(argv[2], argv[3], argv[4]), argv[5], int(argv[6]))
        return 0
    mode, hf, repo, rev = argv[1], argv[2], argv[3], argv[4]
    try:
        if mode == "build":
            print(json.dumps(build(hf, repo, rev), sort_keys=True))
        elif mode == "commit":  # the commit REV stands for here
            print(resolve(hf, repo, rev))
        elif mode == "check":  # REV: the commit, or a branch/tag read from refs/
            try:
                commit = rev if _HEX40.match(rev) else resolve(hf, repo, rev)
                found = problems(hf, load_manifest(hf, repo, commit))
            except (OSError, IncompleteModelError):
                print("gone")
                return 0
            print("complete" if not found else
                  f"incomplete: {'; '.join(found[:3])}"
                  + (f" (+{len(found) - 3} more)" if len(found) > 3 else ""))
        elif mode == "need":
            print(json.dumps(need(hf, load_manifest(hf, repo, rev))))
        elif mode == "mark":
            mark(hf, load_manifest(hf, repo, rev))
        elif mode == "files":
            print("\n".join(rsync_files(load_manifest(hf, repo, rev), hf)))
        elif mode == "download":
            download(hf, repo, rev)
        else:
            raise SystemExit(f"unknown mode {mode}")
    except IncompleteModelError as err:
        log(str(err))
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
