"""The engine parts under test, and the fixtures every conformance test shares.

The suite holds the lab's stand-ins to the official parts' behaviour, and runs unchanged against
the official parts themselves (docs/development.md, "Holding the stand-ins to the official
parts"):

    SPARK_VLLM_CONFORMANCE_COMMAND_PROVIDER=/path/to/pulumi-resource-command
    SPARK_VLLM_CONFORMANCE_LANGUAGE_HOST=/path/to/pulumi-language-python

Unset, each is the lab's stand-in (lab/engine/bin/). The CLI is always the one `source
lab/env.sh` gives; the language host under test is put beside it (the CLI looks for its
bundled host next to its own resolved path), with the SDK's two scripts the CLI's release
ships there."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi.automation as auto
import pytest

from lab import envsh

REPO = Path(__file__).resolve().parents[2]
STAND_IN_BIN = REPO / "lab" / "engine" / "bin"
SSHD = Path("/usr/sbin/sshd")


def part_under_test(name: str) -> Path:
    """The provider or host binary under test: the environment's choice, else the stand-in."""
    var = {"pulumi-resource-command": "SPARK_VLLM_CONFORMANCE_COMMAND_PROVIDER",
           "pulumi-language-python": "SPARK_VLLM_CONFORMANCE_LANGUAGE_HOST"}[name]
    chosen = os.environ.get(var)
    if not chosen:
        return STAND_IN_BIN / name
    path = Path(chosen).resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{var}={chosen}: not an executable file")
    return path


def cli_env(tmp: Path) -> dict[str, str]:
    """`source lab/env.sh`'s environment, with the language host under test beside the CLI:
    the lab's engine as it is for the stand-in, else a bin dir of the CLI, the SDK's scripts and
    the host under test, each hard-linked (else copied): the CLI and the official host each look
    for their neighbours beside their own resolved path."""
    env = envsh.sourced()
    env.pop("PYTHONPATH", None)
    host = part_under_test("pulumi-language-python")
    if host == STAND_IN_BIN / "pulumi-language-python":
        return env
    engine_bin = Path(env["SPARK_VLLM_TOOLCHAIN_BIN"])
    bin_dir = tmp / "engine-under-test" / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir(parents=True)
        parts = {f: (engine_bin / f).resolve() for f in
                 ("pulumi", "pulumi-language-python-exec", "pulumi-resource-pulumi-python")}
        for f, src in {**parts, "pulumi-language-python": host}.items():
            try:
                os.link(src, bin_dir / f)
            except OSError:
                shutil.copy2(src, bin_dir / f)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["SPARK_VLLM_TOOLCHAIN_BIN"] = str(bin_dir)
    return env


# --- engine ------------------------------------------------------------------------------------
@dataclass
class Engine:
    env: dict[str, str]
    pulumi_root: str  # <root>/bin/pulumi
    tmp: Path
    provider: Path  # the pulumi-resource-command under test

    def workspace_opts(self, env: dict[str, str] | None = None) -> Any:
        return auto.LocalWorkspaceOptions(
            env_vars=env or self.env,
            pulumi_command=auto.PulumiCommand(root=self.pulumi_root, skip_version_check=True))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """The CLI with a temp file backend and a temp PULUMI_HOME whose plugin cache holds the
    provider under test (resource-command-v1.2.1), ambient plugins ignored: what runs is the
    provider under test even if a PATH holds another one."""
    e = envsh.sourced()
    pulumi_bin = shutil.which("pulumi", path=e.get("PATH", ""))
    if pulumi_bin is None:
        pytest.fail("no pulumi CLI after `source lab/env.sh`")
    tmp = tmp_path_factory.mktemp("cmdprov")
    provider = part_under_test("pulumi-resource-command")
    home, state = tmp / "home", tmp / "state"
    plug = home / "plugins" / "resource-command-v1.2.1"
    plug.mkdir(parents=True)
    (plug / "pulumi-resource-command").symlink_to(provider)
    state.mkdir()
    env = {
        "PATH": f"{Path(pulumi_bin).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp)),
        "PULUMI_HOME": str(home),
        "PULUMI_BACKEND_URL": f"file://{state}",
        "PULUMI_CONFIG_PASSPHRASE": "cmdprov-test",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
    }
    return Engine(env, str(Path(pulumi_bin).parent.parent), tmp, provider)


# --- sshd --------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)


@dataclass
class Sshd:
    port: int
    user: str
    client_key: str
    host_key: str  # "ssh-ed25519 AAAA…"
    other_key: str  # a host key that is not this server's
    dir: Path


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A private sshd on loopback: its own host key and client key, AcceptEnv SVL_* and
    PULUMI_COMMAND_*; the commands it runs are this machine's."""
    if not SSHD.exists():
        pytest.fail("no /usr/sbin/sshd (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for n in ("host", "client", "other"):
        keygen(d / n)
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host
AuthorizedKeysFile {d}/authorized_keys
PidFile {d}/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv SVL_* PULUMI_COMMAND_*
LogLevel VERBOSE
""")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "w"))
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"sshd did not start: {(d / 'sshd.log').read_text()[-500:]}")
                time.sleep(0.05)
        yield Sshd(port, getpass.getuser(), (d / "client").read_text(),
                   " ".join((d / "host.pub").read_text().split()[:2]),
                   " ".join((d / "other.pub").read_text().split()[:2]), d)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
