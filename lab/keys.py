"""SSH material of the lab, under <repo>/.lab/ssh/ (gitignored).

- id_ed25519{,.pub}      the operator's key (root on every node)
- nodes/<name>/          per node: ssh_host_ed25519_key{,.pub} and authorized_keys, copied
                         into the node at /lab/ssh before its first start
- known_hosts            pinned host keys of every node (mgmt, fabric and spare addresses)
- config                 `ssh -F .lab/ssh/config node-1` works for humans and rsync

Keys are kept across `down`/`up`, so pinned host keys (and Pulumi state) stay valid.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from lab import config
from lab.config import NodeAddrs
from lab.run import run

USER = "root"


def client_key() -> Path:
    return config.SSH_DIR / "id_ed25519"


def known_hosts() -> Path:
    return config.SSH_DIR / "known_hosts"


def ssh_config() -> Path:
    return config.SSH_DIR / "config"


def node_dir(name: str) -> Path:
    return config.SSH_DIR / "nodes" / name


def _keygen(path: Path, comment: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], timeout=30)


def public_key(path: Path) -> str:
    """`type base64` of a .pub file (no comment), as the stack's hostKey wants it."""
    parts = Path(f"{path}.pub").read_text().split()
    return f"{parts[0]} {parts[1]}"


def ensure_client_key() -> Path:
    key = client_key()
    if not key.exists():
        config.SSH_DIR.mkdir(parents=True, exist_ok=True)
        config.SSH_DIR.chmod(0o700)
        _keygen(key, "spark-vllm-lab")
    return key


def ensure_node_keys(name: str) -> str:
    """Host key and authorized_keys for one node; returns its public host key."""
    d = node_dir(name)
    host_key = d / "ssh_host_ed25519_key"
    if not host_key.exists():
        _keygen(host_key, name)
    auth = d / "authorized_keys"
    want = Path(f"{ensure_client_key()}.pub").read_text()
    if not auth.exists() or auth.read_text() != want:
        auth.write_text(want)
    return public_key(host_key)


def fingerprint(name: str) -> str:
    """Short hash of what a node trusts and presents: a node made with other keys (another
    clone of the repo, a deleted .lab/) is recreated rather than left unreachable."""
    d = node_dir(name)
    data = (d / "authorized_keys").read_bytes() + Path(f"{d / 'ssh_host_ed25519_key'}.pub").read_bytes()
    return hashlib.sha256(data).hexdigest()[:12]


def write_client_files(nodes: Iterable[NodeAddrs]) -> None:
    kh_lines, cfg = [], []
    for n in nodes:
        hk = public_key(node_dir(n.name) / "ssh_host_ed25519_key")
        kh_lines.append(f"{n.mgmt_ip},{n.fabric_ip},{n.spare_ip},{n.name} {hk}\n")
        cfg.append(
            f"Host {n.name}\n  HostName {n.mgmt_ip}\n  User {USER}\n"
            f"  HostKeyAlias {n.name}\n"
        )
    common = (
        "Host *\n"
        f"  IdentityFile {client_key()}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts()}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n"
        f"  ConnectTimeout {config.SSH_CONNECT_TIMEOUT_S}\n"
    )
    known_hosts().write_text("".join(kh_lines))
    ssh_config().write_text("".join(cfg) + common)


def ssh_argv(host: str, remote: Sequence[str] | str = (), *, tty: bool | None = False,
             connect_timeout: int = config.SSH_CONNECT_TIMEOUT_S) -> list[str]:
    """ssh to a node's address with the lab key and pinned host keys.

    `remote` as a list is quoted with shlex (one argv on the node); as a str it is passed
    verbatim to the remote shell, like ssh itself does.
    """
    argv = [
        "ssh", "-i", str(client_key()),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={known_hosts()}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", "LogLevel=ERROR",
        "-o", f"ConnectTimeout={connect_timeout}",
    ]
    if tty is not None:  # None: let ssh decide (pty for an interactive login)
        argv.append("-t" if tty else "-T")
    argv.append(f"{USER}@{host}")
    if isinstance(remote, str):
        if remote:
            argv.append(remote)
    elif remote:
        argv.append(shlex.join(remote))
    return argv
