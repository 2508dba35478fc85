"""``command:remote:Command``'s connection, done with the OpenSSH client, to the inputs pulumi-command
1.2.1 documents (pulumi_command/remote/_inputs.py: ConnectionArgs and ProxyConnectionArgs).

One ``ssh`` per run, configured only by a private ``-F`` file written to a 0700 temp dir (so no
~/.ssh/config, /etc/ssh/ssh_config or ~/.ssh/known_hosts takes part, as with the real provider),
with the private key in a 0600 file there; the dir is removed after the run.

What matches the real provider:
- ``user`` (default root), ``port`` (22), ``privateKey`` (+ ``privateKeyPassword``),
  ``password`` (also answers keyboard-interactive), ``agentSocketPath`` (else SSH_AUTH_SOCK).
- ``hostKey`` unset: any host key is accepted (StrictHostKeyChecking=no, no known_hosts).
  Set: only that key is accepted (a one-line known_hosts under a HostKeyAlias, host key algorithms
  limited to the key's type); a mismatch fails like ``ssh: handshake failed: ssh: host key
  mismatch``.
- ``perDialTimeout`` ("Max number of seconds for each dial attempt. 0 implies no maximum. Default
  value is 15 seconds") -> ConnectTimeout. A failed dial (TCP, handshake, host key,
  authentication: ssh exit 255 before "Authenticated to") is retried until ``dialErrorLimit``
  ("Max allowed errors on trying to dial the remote host. -1 set count to unlimited. Default value
  is 10") failures, each logged as "Dial i/N failed: retrying"; then "after N failed attempts:
  <error>". The pause between dials (100 ms, x1.5 each time, at most 5 s) is not documented: the
  stand-in's own choice, short beside a dial.
- The command is one argument to ssh, so the remote user's login shell runs it (``$SHELL -c``),
  as with session.Run; no pty. ``stdin`` is written to the command's stdin, else it reads EOF.
- ``environment`` and PULUMI_COMMAND_STDOUT/STDERR travel as SSH "env" requests (the same
  mechanism as session.Setenv, so sshd's AcceptEnv applies): SendEnv of the ssh process's own
  environment (any value, newlines included); names that would change ssh itself (LD_*, SSH_*,
  HOME, PATH, ...) go as SetEnv in the config file instead.

What differs (see README.md): OpenSSH sends "env" requests without asking for a reply, so a
variable sshd refuses is dropped silently, where the real provider fails with "could not set
environment variable" (for ``environment``) or warns (previous outputs).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import process

DEFAULT_DIAL_ERROR_LIMIT = 10
DEFAULT_PER_DIAL_TIMEOUT = 15
TARGET_ALIAS = "svl-target"
PROXY_ALIAS = "svl-proxy"

# the pause between failed dials (not documented by pulumi-command: this stand-in's choice)
RETRY_DELAY = 0.1
RETRY_BACKOFF = 1.5
RETRY_MAX_DELAY = 5.0

# Environment names that configure the local ssh process itself: never exported to it.
_LOCAL_SENSITIVE = re.compile(r"^(LD_.*|SSH_.*|HOME|PATH|DISPLAY|XAUTHORITY|TMPDIR|LOGNAME|USER"
                              r"|SHELL|TERM|LANG|LC_.*|MALLOC_.*|GLIBC_.*|OPENSSL_.*)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class InputError(Exception):
    """A connection the stand-in cannot use (reported immediately, never retried)."""


class DialError(Exception):
    """The dial (TCP, SSH handshake, authentication) failed for good."""


class CommandError(Exception):
    """The command ran and failed (non-zero exit)."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str
    password: str | None
    private_key: str | None
    private_key_password: str | None
    agent_socket_path: str | None
    dial_error_limit: int
    per_dial_timeout: int
    host_key: str | None


@dataclass(frozen=True)
class Connection:
    target: Endpoint
    proxy: Endpoint | None


def _opt_str(d: Mapping[str, Any], k: str) -> str | None:
    v = d.get(k)
    if v is None:
        return None
    if not isinstance(v, str):
        raise InputError(f"connection.{k} must be a string")
    return v


def _opt_int(d: Mapping[str, Any], k: str, default: int) -> int:
    v = d.get(k)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InputError(f"connection.{k} must be a number")
    return int(v)


def _endpoint(d: Mapping[str, Any], where: str) -> Endpoint:
    host = d.get("host")
    if not isinstance(host, str) or not host:
        raise InputError(f"{where}.host is required")
    return Endpoint(
        host=host,
        port=_opt_int(d, "port", 22),
        user=_opt_str(d, "user") or "root",
        password=_opt_str(d, "password"),
        private_key=_opt_str(d, "privateKey"),
        private_key_password=_opt_str(d, "privateKeyPassword"),
        agent_socket_path=_opt_str(d, "agentSocketPath"),
        dial_error_limit=_opt_int(d, "dialErrorLimit", DEFAULT_DIAL_ERROR_LIMIT),
        per_dial_timeout=_opt_int(d, "perDialTimeout", DEFAULT_PER_DIAL_TIMEOUT),
        host_key=_opt_str(d, "hostKey"),
    )


def parse_connection(d: Any) -> Connection:
    """From the (revealed) ``connection`` input."""
    if not isinstance(d, dict):
        raise InputError("connection is required")
    proxy = d.get("proxy")
    return Connection(_endpoint(d, "connection"),
                      _endpoint(proxy, "connection.proxy") if isinstance(proxy, dict) else None)


# --- config file -------------------------------------------------------------------------------
def _q(v: str | int) -> str:
    """A ssh_config argument (double-quoted; ssh_config has no escape for '"' or newlines)."""
    s = str(v)
    if '"' in s or "\n" in s or "\r" in s:
        raise InputError("a connection value contains a quote or a newline: not supported by "
                         "the pulumi-command stand-in (OpenSSH config)")
    return f'"{s}"'


_KEY_TYPES = {
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
}


def _parse_host_key(text: str) -> tuple[str, str]:
    """ssh.ParseAuthorizedKey, enough for a pin: '<type> <base64> [comment]' (options before
    the type are skipped as authorized_keys allows). Error text as Go's."""
    for line in text.splitlines():
        fields = line.split()
        for i, f in enumerate(fields):
            if f in _KEY_TYPES and i + 1 < len(fields):
                blob = fields[i + 1]
                try:
                    raw = base64.b64decode(blob, validate=True)
                except ValueError:
                    continue
                n = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else -1
                if raw[4:4 + n].decode("ascii", "replace") == f:
                    return f, blob
    raise InputError("ssh: no key found (connection.hostKey)")


def _host_key_algorithms(key_type: str) -> str:
    if key_type == "ssh-rsa":
        return "rsa-sha2-512,rsa-sha2-256,ssh-rsa"
    return key_type


def _check_private_key(path: Path, passphrase: str | None, wd: _Workdir) -> None:
    """ssh.ParsePrivateKey(WithPassphrase)'s failures, before any dial (the real provider fails
    in SShConfig, without retrying). A passphrase goes through the askpass helper, not argv."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = ["ssh-keygen", "-y", "-f", str(path)]
    if passphrase is None:
        argv[2:2] = ["-P", ""]
    else:
        env.update(SSH_ASKPASS=str(_askpass(wd)), SSH_ASKPASS_REQUIRE="force",
                   SVL_COMMAND_KEY_PASSPHRASE=passphrase)
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env,
                       check=False)
    if r.returncode != 0:
        if passphrase is not None and "passphrase" in r.stderr:
            raise InputError("x509: decryption password incorrect")
        if "passphrase" in r.stderr:
            raise InputError("ssh: this private key is passphrase protected")
        raise InputError("ssh: no key found")


@dataclass
class _Setup:
    argv: list[str]
    env: dict[str, str]
    log_path: Path


_WORKDIR_PREFIX = "svl-command-"


def remove_stale_workdirs() -> None:
    """Remove the temp dirs (private keys) of stand-in processes that died mid-run (the engine
    SIGKILLs plugins, so their `finally` never ran). Dirs are named svl-command-<pid>-*."""
    for d in Path(tempfile.gettempdir()).glob(_WORKDIR_PREFIX + "*-*"):
        pid = d.name[len(_WORKDIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path("/proc", pid).exists() and d.owner() == _me():
            shutil.rmtree(d, ignore_errors=True)


def _me() -> str:
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name


class _Workdir:
    def __init__(self) -> None:
        # 0700; <pid> lets a later provider remove it if this one is killed mid-run
        self.path = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-"))

    def write(self, name: str, text: str, mode: int = 0o600) -> Path:
        p = self.path / name
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return p

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _askpass(wd: _Workdir) -> Path:
    p = wd.path / "askpass"
    if not p.exists():
        wd.write("askpass", _ASKPASS, 0o700)
    return p


_ASKPASS = """#!/bin/sh
case "$1" in
  *assphrase*) printf '%s\\n' "$SVL_COMMAND_KEY_PASSPHRASE" ;;
  *) printf '%s\\n' "$SVL_COMMAND_PASSWORD" ;;
esac
"""


def _host_block(alias: str, ep: Endpoint, wd: _Workdir, env: dict[str, str]) -> list[str]:
    lines = [f"Host {alias}", f"  HostName {_q(ep.host)}", f"  Port {ep.port}",
             f"  User {_q(ep.user)}", f"  HostKeyAlias {alias}"]
    if ep.per_dial_timeout > 0:
        lines.append(f"  ConnectTimeout {ep.per_dial_timeout}")
    if ep.host_key is not None:
        ktype, blob = _parse_host_key(ep.host_key)
        kh = wd.write(f"known_hosts-{alias}", f"{alias} {ktype} {blob}\n")
        lines += ["  StrictHostKeyChecking yes", f"  UserKnownHostsFile {_q(str(kh))}",
                  f"  HostKeyAlgorithms {_host_key_algorithms(ktype)}"]
    else:
        lines += ["  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null"]
    agent = ep.agent_socket_path or os.environ.get("SSH_AUTH_SOCK") or None
    methods = []
    if ep.private_key is not None:
        key = ep.private_key if ep.private_key.endswith("\n") else ep.private_key + "\n"
        kp = wd.write(f"id-{alias}", key)
        _check_private_key(kp, ep.private_key_password, wd)
        lines.append(f"  IdentityFile {_q(str(kp))}")
        methods.append("publickey")
    else:
        # a path that does not exist: keeps OpenSSH from trying ~/.ssh/id_* (the real one
        # only knows the keys it is given)
        lines.append(f"  IdentityFile {_q(str(wd.path / 'no-identity'))}")
    if agent:
        lines.append(f"  IdentityAgent {_q(agent)}")
        lines.append("  IdentitiesOnly no")
        methods.append("publickey")
    else:
        lines += ["  IdentityAgent none", "  IdentitiesOnly yes"]
    lines.append(f"  PubkeyAuthentication {'yes' if methods else 'no'}")
    interactive = False
    if ep.password is not None:
        lines += ["  PasswordAuthentication yes", "  KbdInteractiveAuthentication yes",
                  "  NumberOfPasswordPrompts 1"]
        env["SVL_COMMAND_PASSWORD"] = ep.password
        interactive = True
    else:
        lines += ["  PasswordAuthentication no", "  KbdInteractiveAuthentication no"]
    if ep.private_key_password is not None:
        env["SVL_COMMAND_KEY_PASSPHRASE"] = ep.private_key_password
        interactive = True
    if interactive:  # answered by the askpass helper, never by a terminal
        lines.append("  BatchMode no")
    else:
        lines.append("  BatchMode yes")
    if not methods and ep.password is None:
        lines.append("  PreferredAuthentications none")
    return lines


def prepare(conn: Connection, command: str, env_vars: Mapping[str, str], wd: _Workdir) -> _Setup:
    proc_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("SSH_ASKPASS", "SVL_COMMAND_"))}
    blocks: list[str] = []
    if conn.proxy is not None:
        blocks += _host_block(PROXY_ALIAS, conn.proxy, wd, proc_env)
        if conn.proxy.password is not None or conn.proxy.private_key_password is not None:
            raise InputError("connection.proxy with a password or an encrypted key is not "
                             "supported by the pulumi-command stand-in (use an unencrypted "
                             "privateKey or an agent for the proxy)")
    target = _host_block(TARGET_ALIAS, conn.target, wd, proc_env)
    if conn.proxy is not None:
        target.append(f"  ProxyJump {PROXY_ALIAS}")
    send, set_lines = [], []
    for k, v in env_vars.items():
        if not _ENV_NAME.match(k):
            raise InputError(f"environment variable name {k!r} is not supported by the "
                             "pulumi-command stand-in")
        if _LOCAL_SENSITIVE.match(k):
            set_lines.append(f"  SetEnv {k}={_q(v)}")
        else:
            send.append(k)
            proc_env[k] = v
    for k in list(proc_env):  # only the variables asked for are sent
        if k not in send and k not in ("PATH", "HOME", "SSH_AUTH_SOCK", "SVL_COMMAND_PASSWORD",
                                       "SVL_COMMAND_KEY_PASSPHRASE", "LANG", "TMPDIR"):
            proc_env.pop(k)
    common = ["Host *", "  GlobalKnownHostsFile /dev/null", "  LogLevel VERBOSE",
              "  CheckHostIP no", "  UpdateHostKeys no", "  ControlMaster no",
              "  ControlPath none", "  ForwardAgent no", "  ForwardX11 no",
              "  ClearAllForwardings yes", "  AddKeysToAgent no", "  RequestTTY no",
              "  VerifyHostKeyDNS no", "  ServerAliveInterval 0"]
    if send:
        common.append("  SendEnv " + " ".join(send))
    common += set_lines
    cfg = wd.write("ssh_config", "\n".join([*blocks, *target, *common]) + "\n")
    if "SVL_COMMAND_PASSWORD" in proc_env or "SVL_COMMAND_KEY_PASSPHRASE" in proc_env:
        proc_env.update(SSH_ASKPASS=str(_askpass(wd)), SSH_ASKPASS_REQUIRE="force")
    log = wd.path / "ssh.log"
    # An empty command would make ssh open a shell reading stdin; the real session.Run("")
    # asks sshd to run "" (the login shell exits 0). " " does that.
    argv = ["ssh", "-F", str(cfg), "-E", str(log), "-T", "--", TARGET_ALIAS, command or " "]
    return _Setup(argv, proc_env, log)


# --- dial errors ---------------------------------------------------------------------------------
def _dial_error_text(log: str, conn: Connection) -> str:
    """A Go-like message (what x/crypto/ssh or net would say) + OpenSSH's own words."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and not ln.startswith("@")]
    last = next((ln for ln in reversed(lines) if not ln.startswith(("Transferred:", "Bytes per"))),
                "ssh exited 255 before the session started")
    t = conn.target
    hp = f"{t.host}:{t.port}" if ":" not in t.host else f"[{t.host}]:{t.port}"
    low = log.lower()
    if "host key verification failed" in low or "host key for" in low:
        go = "ssh: handshake failed: ssh: host key mismatch"
    elif "permission denied" in low or "too many authentication failures" in low:
        m = re.search(r"Permission denied \(([^)]*)\)", log)
        tried = " ".join(["none", *(m.group(1).split(",") if m else [])])
        go = (f"ssh: handshake failed: ssh: unable to authenticate, attempted methods "
              f"[{tried}], no supported methods remain")
    elif "connection refused" in low:
        go = f"dial tcp {hp}: connect: connection refused"
    elif "timed out" in low:
        go = f"dial tcp {hp}: i/o timeout"
    elif "no route to host" in low:
        go = f"dial tcp {hp}: connect: no route to host"
    elif "network is unreachable" in low:
        go = f"dial tcp {hp}: connect: network is unreachable"
    elif "could not resolve hostname" in low:
        go = f"dial tcp: lookup {t.host}: no such host"
    elif "connection closed" in low or "connection reset" in low or "kex_exchange" in low:
        go = "ssh: handshake failed: EOF"
    else:
        go = "ssh: handshake failed"
    return f"{go} (OpenSSH: {last})"


def _authenticated(log: str) -> bool:
    return "Authenticated to " in log


# --- run -------------------------------------------------------------------------------------------
def run(conn: Connection, command: str, *, env_vars: Mapping[str, str], stdin: str | None,
        stdout_sink: process.LineSink | None, stderr_sink: process.LineSink | None,
        status: Callable[[str], None], cancelled: threading.Event,
        on_start: Callable[[subprocess.Popen[bytes]], None] | None = None) -> tuple[str, str]:
    """Run command over SSH; (stdout, stderr) without their final newline, as the real one.

    Raises InputError (bad connection input), DialError (after the retries), CommandError."""
    limit = conn.target.dial_error_limit
    delay = RETRY_DELAY
    attempt = 0  # retry.Until's `try`
    while True:
        wd = _Workdir()
        try:
            setup = prepare(conn, command, env_vars, wd)
            done = process.run(setup.argv, env=setup.env, stdin=stdin, stdout_sink=stdout_sink,
                               stderr_sink=stderr_sink, on_start=on_start)
            log = setup.log_path.read_text(errors="replace") if setup.log_path.exists() else ""
        finally:
            wd.remove()
        if done.returncode == 255 and not _authenticated(log):
            dials = attempt + 1
            if limit > -1 and dials > limit:
                prefix = "proxy: " if conn.proxy is not None else ""
                raise DialError(f"{prefix}after {attempt} failed attempts: "
                                f"{_dial_error_text(log, conn)}")
            status(f"Dial {dials}/{'inf' if limit == -1 else limit} failed: retrying")
            if cancelled.wait(min(delay, RETRY_MAX_DELAY)):
                raise DialError("context canceled")
            delay = min(delay, RETRY_MAX_DELAY) * RETRY_BACKOFF
            attempt += 1
            continue
        if done.returncode != 0:
            if done.returncode < 0:
                why = f"ssh killed by signal {-done.returncode}"
            else:
                why = f"Process exited with status {done.returncode}"
            raise CommandError(why, done.combined)
        return done.stdout.removesuffix("\n"), done.stderr.removesuffix("\n")
