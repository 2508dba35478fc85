"""Which layers of the head's image a node lacks (imageStaging copy), pure and stdlib only:
scripts/image_copy.py runs it on the head (sent beside it, as its helper), the tests import it.

A layer is on the node when an image there has the same chain of layers below it and it: the
layer store's chain ID (moby layer.CreateChainID), which is what `docker load` looks up before
it opens a layer's file (moby image/tarexport/load.go)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from typing import Any

MB = 1_000_000
# `docker load` holds the stream unpacked in Docker's temp directory while it registers each
# layer in the store: the missing layers take this many times their size at the peak
LOAD_FACTOR = 2


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Docker's layer chain IDs (moby layer.CreateChainID) of a stack of diff IDs."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else
                   "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def probe_script(image: str) -> str:
    """What the node says: the tag's id, every image's layers, Docker's storage and its free
    KiB (df reads a directory its user cannot enter)."""
    tag = shlex.quote(image)
    return "\n".join([
        f"echo \"id $(docker image inspect --format '{{{{.Id}}}}' {tag} 2>/dev/null)\"",
        "root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null) || root=",
        "[ -n \"$root\" ] || root=/var/lib/docker",
        "echo \"free $(df -Pk \"$root\" 2>/dev/null | awk 'NR == 2 {print $4}') $root\"",
        "ids=$(docker image ls -aq --no-trunc | sort -u)",
        "[ -z \"$ids\" ] || docker image inspect --format "
        "'layers {{range .RootFS.Layers}}{{.}} {{end}}' $ids",
    ])


def parse_probe(text: str) -> dict[str, Any]:
    """{"id": the tag's image id or "", "chains": the chain IDs present, "free": bytes or None,
    "root": Docker's storage}."""
    out: dict[str, Any] = {"id": "", "chains": set(), "free": None, "root": "/var/lib/docker"}
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "id":
            out["id"] = rest.strip()
        elif word == "free":
            kib, _, root = rest.partition(" ")  # df may have said nothing: "free  ROOT"
            out["free"] = int(kib) * 1024 if kib.isdigit() else None
            out["root"] = root.strip() or out["root"]
        elif word == "layers":
            out["chains"].update(chain_ids(rest.split()))
    return out


def plan(spool: str, have_chains: set[str]) -> tuple[list[str], int, int, int, int]:
    """(the spool's files to send, their bytes, the image's bytes, layers sent, layers in all):
    every file of the save but the layers whose chain the node has."""
    with open(os.path.join(spool, "manifest.json")) as f:
        manifest = json.load(f)[0]
    with open(os.path.join(spool, manifest["Config"])) as f:
        diff_ids = json.load(f)["rootfs"]["diff_ids"]
    layers = manifest["Layers"]
    needed: set[str] = set()
    for path, chain in zip(layers, chain_ids(diff_ids), strict=True):
        if chain not in have_chains:
            needed.add(os.path.normpath(path))
            real = os.path.realpath(os.path.join(spool, path))  # a save links repeated layers
            needed.add(os.path.relpath(real, spool))
    skip = {os.path.normpath(p) for p in layers} - needed
    files, sent, whole = [], 0, 0
    for top, dirs, names in os.walk(spool):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(top, name), spool)
            if rel.startswith("."):  # the spool's own marker
                continue
            size = os.lstat(os.path.join(spool, rel)).st_size
            whole += size
            if rel not in skip:
                files.append(rel)
                sent += size
    return files, sent, whole, len(needed & {os.path.normpath(p) for p in layers}), len(layers)


def space_problem(node: str, free: int | None, root: str, send: int) -> str | None:
    if free is None or send * LOAD_FACTOR <= free:
        return None
    return (f"{node} has {free // MB} MB free on {root} (Docker's storage), the image's "
            f"missing layers need {send * LOAD_FACTOR // MB} MB there ({send // MB} MB to "
            f"receive, held {LOAD_FACTOR} times while docker load unpacks them): free space "
            f"there (docker system prune), then run pulumi up again")
