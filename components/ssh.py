"""Run a script on a node with the system's OpenSSH client, as the stack reaches it.

For what runs outside pulumi-command: the containers' refresh-time check (`liveness`) and
`status`. Same address, user, key and pinned host key as the stack's `remote.Command`s, and
the same bounds: a node that does not answer is named within seconds, never waited on.
The private key lives only in a 0600 file inside a 0700 temporary directory, removed when the
call returns; it never appears on a command line. No ~/.ssh/config or agent is consulted, so
what works here works in the engine.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass

CONNECT_TIMEOUT_S = 10


class NodeUnreachableError(RuntimeError):
    """SSH itself failed (dial, auth, host key): the node is named, the command never ran."""


@dataclass(frozen=True)
class Target:
    node: str  # the node's name in the spec, for messages
    host: str
    port: int
    user: str
    private_key: str
    host_key: str | None = None  # "ssh-ed25519 AAAA…"; None accepts any key, as pulumi-command

    def where(self) -> str:
        return f"{self.node} ({self.user}@{self.host}:{self.port})"


def options(key: str, port: int, host_key: str | None, known_hosts: str) -> list[str]:
    """OpenSSH's options for a node: this key only, no agent or config, bounded dial,
    keepalives, and the pinned host key (in `known_hosts`) or none. Also what the head uses to
    reach the other nodes (staging_commands.copy_script), with paths of the node's shell."""
    opts = [
        "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
        "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
        "-p", str(port),
    ]
    if host_key:
        return opts + ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
                       "-o", f"HostKeyAlgorithms={host_key.split()[0]}"]
    return opts + ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    return f"{host if port == 22 else f'[{host}]:{port}'} {host_key.strip()}"


def _argv(t: Target, tmp: str, remote: str) -> list[str]:
    key = os.path.join(tmp, "key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(t.private_key if t.private_key.endswith("\n") else t.private_key + "\n")
    known = os.path.join(tmp, "known_hosts")
    if t.host_key:
        with open(known, "w") as f:
            f.write(known_hosts_line(t.host, t.port, t.host_key) + "\n")
    return ["ssh", *options(key, t.port, t.host_key, known), f"{t.user}@{t.host}", remote]


def run(t: Target, script: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `script` with sh on the node; its stdin is `stdin`. Raises NodeUnreachableError when SSH
    fails (exit 255 before the script ran) or the whole call outlives `timeout`."""
    with tempfile.TemporaryDirectory(prefix="spark-vllm-ssh-") as tmp:
        argv = _argv(t, tmp, "sh -c " + shlex.quote(script))
        try:
            proc = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise NodeUnreachableError(f"{t.where()}: no answer within {timeout:.0f} s") from None
    if proc.returncode == 255:
        why = proc.stderr.strip().splitlines()[-1:] or ["ssh exited 255"]
        raise NodeUnreachableError(f"{t.where()}: {why[0]}")
    return proc
