"""spark-vllm's image check, run on the head with its python3 (stdlib only) before any
container starts: `python3 PROGRAM KEYFILE`, the program preceded by a line
`PAYLOAD = {…}` (the tag, imageDigest, and how the head reaches each node).

Asks every node, now, which image it holds under the stack's tag (the head locally, the others
over SSH to their identity IP, with the operator's key and pinned host keys), then prints the
image id when all agree (and match imageDigest, when set) or the per-node table and exits 1.
Asked at check time rather than taken from the preflights' reports: a refused run is retried
after the operator fixed a node, and the preflights, which succeeded, do not run again.
(No `from __future__` import: the PAYLOAD line comes first.)
"""

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

# (docker 20.10's `join` refuses an empty RepoDigests: "wrong type for value")
INSPECT = "docker image inspect --format '{{.Id}} {{range .RepoDigests}}{{.}} {{end}}' "


def ssh_argv(key: str, tmp: str, node: dict[str, Any], remote: str) -> list[str]:
    opts = ["-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
            "-p", str(node["port"])]
    if node.get("hostKey"):
        known = os.path.join(tmp, f"known_hosts.{node['name']}")
        host = node["ip"] if node["port"] == 22 else f"[{node['ip']}]:{node['port']}"
        with open(known, "w") as f:
            f.write(f"{host} {node['hostKey']}\n")
        opts += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
                 "-o", f"HostKeyAlgorithms={node['hostKey'].split()[0]}"]
    else:
        opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return ["ssh", *opts, f"{node['user']}@{node['ip']}", remote]


def run_on(key: str, tmp: str, node: dict[str, Any], remote: str,
           local: bool) -> subprocess.CompletedProcess[str] | None:
    """`remote` (sh) on the head itself, or on `node` over SSH; None: no answer within 60 s.
    (scripts/memory_check.py runs this too.)"""
    argv = ["sh", "-c", remote] if local else ssh_argv(key, tmp, node, remote)
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None


def ask(key: str, tmp: str, node: dict[str, Any], image: str, local: bool) -> tuple[str, str]:
    """(image id, registry digests) on `node`; ("missing", why) or ("unreachable", why)."""
    proc = run_on(key, tmp, node, INSPECT + "'" + image.replace("'", "'\\''") + "'", local)
    if proc is None:
        return "unreachable", "no answer within 60 s"
    if proc.returncode == 255 and not local:
        return "unreachable", proc.stderr.strip().splitlines()[-1:][0] if proc.stderr else ""
    if proc.returncode != 0 or not proc.stdout.strip():
        return "missing", proc.stderr.strip()
    image_id, _, digests = proc.stdout.strip().partition(" ")
    return image_id, digests.strip()


def main(key: str, payload: dict[str, Any]) -> int:
    image, digest = payload["image"], payload.get("imageDigest")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, node in enumerate(payload["nodes"]):
            image_id, digests = ask(key, tmp, node, image, local=i == 0)
            rows.append((node["name"], image_id, digests))
    problems = [f"the head cannot reach {node['name']} at {node['ip']}:{node['port']} (its "
                "identity: the fabric) to ask which image it holds; check the link, routes and "
                f"firewall: {why}"
                for node, (_, image_id, why) in zip(payload["nodes"], rows, strict=True)
                if image_id == "unreachable"]
    ids = {r[1] for r in rows} - {"unreachable"}
    if len(ids) > 1 or "missing" in ids:
        problems.append(f"image {image} is not the same on every node (same tag, different "
                        "content):")
    if digest:
        # a copied image (imageStaging copy) has no registry digests (docker load keeps none):
        # one id is one content, so a node holding the id another node's digests name passes
        pinned = {image_id for _, image_id, digests in rows
                  if digest == image_id or digest in [d.rsplit("@", 1)[-1]
                                                      for d in digests.split()]}
        off = [name for name, image_id, _ in rows if image_id not in pinned]
        if off:
            problems.append(f"imageDigest {digest} is not what {', '.join(off)} "
                            f"hold{'s' if len(off) == 1 else ''} as {image}:")
    if not problems:
        print(rows[0][1])
        return 0
    width = max(len(r[0]) for r in rows)
    lines = [*problems,
             f"  {'node'.ljust(width)}  image id{'  registry digests' if digest else ''}"]
    for name, image_id, digests in rows:
        extra = "  " + (digests or "-") if digest and image_id not in ("missing", "unreachable") \
            else ("  " + digests if image_id in ("missing", "unreachable") and digests else "")
        lines.append(f"  {name.ljust(width)}  {image_id}{extra}")
    if payload.get("staging") == "copy":
        lines.append("The image copy brought the head's image to the other nodes: a node that "
                     "differs now changed since; run pulumi up --refresh to copy it again.")
    else:
        lines.append(f"Put one image on every node: set imageStaging: copy to have the head's "
                     f"copied to the others over the fabric (only the layers they lack), or "
                     f"docker pull {image} on each, then run pulumi up again.")
    print("\n".join(lines), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(globals()["PAYLOAD"])))
