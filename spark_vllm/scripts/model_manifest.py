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
  need HF REPO COMMIT        (worker, manifest copied) bytes still to copy and bytes free on
                             hfCache's filesystem, as JSON.
  check HF REPO REV          (any node) one line: "complete", "incomplete: …" or "gone". Sizes
                             only: a read-time check must stay cheap.
  files HF REPO COMMIT       rsync's --files-from list (relative to HF) for that commit.
  commit HF REPO REV         the commit REV stands for in this cache (exit 4: not there).
  download HF REPO REV       (in the image) snapshot_download; prints "total BYTES" first.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
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


def _hash_blob(path: str, name: str, progress: Progress) -> str:
    git = _HEX40.match(name) is not None
    h = hashlib.sha1() if git else hashlib.sha256()
    if git:
        h.update(b"blob %d\0" % os.stat(path).st_size)
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            progress.add(len(chunk))
    return h.hexdigest()


def build(hf: str, repo: str, rev: str) -> dict[str, Any]:
    commit = resolve(hf, repo, rev)
    files = snapshot_files(hf, repo, commit)
    cache_file = os.path.join(hf, "spark-vllm", "hashes",
                              f"models--{repo.replace('/', '--')}.json")
    try:
        with open(cache_file) as f:
            seen = json.load(f)
    except (OSError, ValueError):
        seen = {}
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
    _write_json(cache_file, seen)
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
    """What differs from the manifest, by file size and link target (no hashing)."""
    out = []
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
        elif e["blob"] != e["path"] and os.path.realpath(p) != os.path.join(
                os.path.realpath(hf), e["blob"]):
            out.append(f"{name} points elsewhere than its blob")
    return out


def need(hf: str, manifest: dict[str, Any]) -> dict[str, Any]:
    missing = 0
    for e in {e["blob"]: e for e in manifest["files"]}.values():
        try:
            have = os.stat(os.path.join(hf, e["blob"])).st_size
        except OSError:
            have = 0
        missing += max(e["size"] - have, 0) if have <= e["size"] else e["size"]
    probe = hf
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe) or "/"
    return {"need": missing, "free": shutil.disk_usage(probe).free, "path": probe}


def rsync_files(manifest: dict[str, Any], hf: str) -> list[str]:
    repo, commit, rev = manifest["repo"], manifest["commit"], manifest["revision"]
    rd = os.path.relpath(repo_dir(hf, repo), hf)
    out = [] if rev == commit else [f"{rd}/refs/{rev}"]
    for e in manifest["files"]:
        out += [e["path"], e["blob"]] if e["blob"] != e["path"] else [e["path"]]
    out.append(os.path.relpath(manifest_path(hf, repo, commit), hf))
    return sorted(set(out))


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


def progress(what: str, sent_file: str) -> None:
    """Filter rsync's --info=progress2 --stats output (stdin): one line every PROGRESS_EVERY_S
    on stderr, "copied 1,234,567 bytes (45%) …", and the bytes that crossed the link into
    `sent_file`. Read unbuffered: the updates end in \r, and awk or tr would hold them back."""
    last = time.monotonic()
    pending = b""
    while chunk := os.read(0, 65536):
        pending += chunk
        *records, pending = re.split(rb"[\r\n]", pending)
        for rec in records:
            fields = rec.decode(errors="replace").split()
            if len(fields) >= 4 and fields[1].endswith("%"):
                now = time.monotonic()
                if now - last >= PROGRESS_EVERY_S:
                    last = now
                    log(f"{what}: {fields[0]} bytes ({fields[1]}), {fields[2]}, {fields[3]} left")
            elif rec.startswith(b"Total bytes sent:"):
                _write_text(sent_file, fields[3].replace(",", "") + "\n")


def main(argv: list[str]) -> int:
    if argv[1] == "progress":
        progress(argv[2], argv[3])
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
