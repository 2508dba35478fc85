"""The engine `source lab/env.sh` gives (lab/tools.sh): the real Pulumi CLI from the Go module
proxy, the Python SDK's own language server launched as the bundled language host, and the
command provider at the version the Python SDK pins — the real one where installed, else the
lab's stand-in — linked into the lab's plugin cache as a download would be, nothing from $PATH.
And nothing in the repository reads or builds from copied upstream sources."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import envsh
from lab.config import REPO_DIR

STAND_IN = REPO_DIR / "lab" / "engine" / "bin"


def _pin(name: str) -> str:
    text = (REPO_DIR / "requirements.txt").read_text()
    match = re.search(rf"^{re.escape(name)}==(\S+)", text, re.M)
    assert match, f"no {name} pin"
    return match.group(1)


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return envsh.sourced()


def pulumi(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(["pulumi", *args], cwd=REPO_DIR, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "from $PATH" not in proc.stderr, proc.stderr
    return proc.stdout


def test_the_command_provider_is_in_the_plugin_cache_at_the_pinned_version(
        env: dict[str, str]) -> None:
    plugins = json.loads(pulumi(env, "plugin", "ls", "--json"))
    command = [p for p in plugins if (p["kind"], p["name"]) == ("resource", "command")]
    assert [p["version"] for p in command] == [_pin("pulumi-command")], plugins
    installed = (Path(env["PULUMI_HOME"]) / "plugins" / f"resource-command-v{_pin('pulumi-command')}"
                 / "pulumi-resource-command")
    # no real provider is installed on this machine: the stand-in, linked (it finds the
    # checkout from its own path)
    assert installed.resolve() == STAND_IN / "pulumi-resource-command"


def test_pulumi_about_names_the_sdks_language_server_and_the_project_venv(
        env: dict[str, str]) -> None:
    about = json.loads(pulumi(env, "about", "--json"))
    language = [p for p in about["plugins"] if p["kind"] == "language" and p["name"] == "python"]
    assert [p["version"] for p in language] == [_pin("pulumi")], about["plugins"]
    assert about["runtime"]["executable"] == str(REPO_DIR / ".venv" / "bin" / "python")
    assert about["runtime"]["toolchain"] == "Pip", about["runtime"]
    assert about["cliAbout"]["version"].startswith("3.")
    # the venv's top-level packages, as the official host lists them: spark-vllm, installed
    # editable into the lab's venv, requires pulumi, so pulumi is not top-level
    names = {d["name"] for d in about["dependencies"]}
    assert "spark-vllm" in names and "pulumi" not in names, names


def test_no_plugin_is_taken_from_path(env: dict[str, str]) -> None:
    assert env.get("PULUMI_IGNORE_AMBIENT_PLUGINS") == "true"
    path = env["PATH"]
    bundled = Path(env["SPARK_VLLM_TOOLCHAIN_BIN"])
    # the CLI is a real Go binary; the language host resolves next to it (bundled) to the lab's
    # launcher; the command provider is nowhere on PATH
    assert shutil.which("pulumi", path=path) == str(bundled / "pulumi")
    assert (bundled / "pulumi").read_bytes()[:4] == b"\x7fELF"
    assert shutil.which("pulumi-language-python", path=path) == str(bundled /
                                                                    "pulumi-language-python")
    assert (bundled / "pulumi-language-python").resolve() == STAND_IN / "pulumi-language-python"
    assert shutil.which("pulumi-resource-command", path=path) is None


def _installed_engine(tmp_path: Path, env: dict[str, str], with_plugin: bool = True) -> dict[str, str]:
    """An engine installed the usual way: the CLI with its language host in one directory on
    PATH (the official tarball's layout), the command provider in ~/.pulumi/plugins. The CLI is
    a copy of the lab's; the host and the provider are placeholders (only their place counts)."""
    built = Path(env["SPARK_VLLM_TOOLCHAIN_BIN"])
    bin_dir, home = tmp_path / "pulumi" / "bin", tmp_path / "home" / ".pulumi"
    bin_dir.mkdir(parents=True)
    shutil.copy2(built / "pulumi", bin_dir / "pulumi")
    for name in ("pulumi-language-python", "pulumi-resource-pulumi-python"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    if with_plugin:
        leaf = f"resource-command-v{_pin('pulumi-command')}"
        (home / "plugins" / leaf).mkdir(parents=True)
        (home / "plugins" / leaf / "pulumi-resource-command").write_text("#!/bin/sh\nexit 1\n")
        (home / "plugins" / leaf / "pulumi-resource-command").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PULUMI_HOME": str(home),
           "SPARK_VLLM_CACHE": str(tmp_path / "cache")}
    env.pop("SPARK_VLLM_OPERATOR_PULUMI_HOME", None)  # a lab shell's: this engine's home rules
    env.pop("SPARK_VLLM_ENGINE", None)
    return env


def _tools(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "lab/tools.sh"], cwd=REPO_DIR, capture_output=True, text=True,
                          timeout=60, env=env)


def test_an_installed_engine_is_used_whole_without_building(tmp_path: Path,
                                                             env: dict[str, str]) -> None:
    proc = _tools(_installed_engine(tmp_path, env))
    assert proc.returncode == 0, proc.stderr
    assert "using the installed engine" in proc.stderr and "building" not in proc.stderr
    assert "(the real one)" in proc.stderr
    bin_dir = Path(proc.stdout.splitlines()[-1])
    assert (bin_dir / "pulumi").resolve() == tmp_path / "pulumi" / "bin" / "pulumi"
    assert (bin_dir / "pulumi-language-python").resolve() == (
        tmp_path / "pulumi" / "bin" / "pulumi-language-python")
    plugin = bin_dir.parent / "plugins" / f"resource-command-v{_pin('pulumi-command')}"
    assert (plugin / "pulumi-resource-command").resolve().is_relative_to(tmp_path / "home")


def test_an_installed_cli_without_the_command_plugin_takes_the_stand_in_and_says_so(
        tmp_path: Path, env: dict[str, str]) -> None:
    proc = _tools(_installed_engine(tmp_path, env, with_plugin=False))
    assert proc.returncode == 0, proc.stderr
    assert "stand-in for pulumi-resource-command" in proc.stderr, proc.stderr
    bin_dir = Path(proc.stdout.splitlines()[-1])
    # the official host still answers: the stand-in only where nothing is installed
    assert (bin_dir / "pulumi-language-python").resolve() == (
        tmp_path / "pulumi" / "bin" / "pulumi-language-python")
    plugin = bin_dir.parent / "plugins" / f"resource-command-v{_pin('pulumi-command')}"
    assert (plugin / "pulumi-resource-command").resolve() == STAND_IN / "pulumi-resource-command"


def test_every_part_of_the_lab_engine_is_the_cache_or_this_checkout(env: dict[str, str]) -> None:
    """The engine comes from registries and this repository alone (issue 30): every file the
    lab's engine runs resolves into the toolchain cache (the CLI from the Go module proxy and
    the SDK's scripts from its served module) or into this checkout (the two stand-ins);
    nothing is taken from anywhere else."""
    bin_dir = Path(env["SPARK_VLLM_TOOLCHAIN_BIN"])
    cache = bin_dir.parent.parent  # <cache>/toolchain/engine-<key>/bin
    parts = [*bin_dir.iterdir(), *(bin_dir.parent / "plugins").glob("*/*")]
    assert {p.name for p in parts} >= {"pulumi", "pulumi-language-python",
                                      "pulumi-language-python-exec",
                                      "pulumi-resource-pulumi-python", "pulumi-resource-command"}
    elsewhere = [str(p) for p in parts
                 if not (p.resolve().is_relative_to(cache) or p.resolve().is_relative_to(REPO_DIR))]
    assert elsewhere == []


def test_two_lab_shells_with_different_engines_each_keep_their_own_provider(
        tmp_path: Path, env: dict[str, str]) -> None:
    """Shell A sources lab/env.sh with the lab's engine and is mid-run (it waits); shell B,
    of the same checkout, sources it with an installed engine whose real provider sits in the
    operator's plugin cache. Each has its own PULUMI_HOME, and A's provider is still the
    stand-in when it goes on: B's source relinked nothing of A's (it once switched a run that
    started on the official provider onto the stand-in)."""
    link = f"plugins/resource-command-v{_pin('pulumi-command')}/pulumi-resource-command"
    report = f'echo "$PULUMI_HOME"; readlink -f "$PULUMI_HOME/{link}"; pulumi plugin ls --json'
    a_env = {**os.environ, "SPARK_VLLM_ENGINE": "lab"}
    a_env.pop("SPARK_VLLM_OPERATOR_PULUMI_HOME", None)
    a = subprocess.Popen(
        ["bash", "-c", f"source lab/env.sh >/dev/null && echo sourced && read -r _ && {report}"],
        cwd=REPO_DIR, env=a_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    b_home = None
    try:
        assert a.stdout is not None and a.stdin is not None
        assert a.stdout.readline().strip() == "sourced", a.stderr.read() if a.stderr else ""
        b = subprocess.run(["bash", "-c", f"source lab/env.sh >/dev/null && {report}"],
                           cwd=REPO_DIR, env=_installed_engine(tmp_path, env),
                           capture_output=True, text=True, timeout=120)
        assert b.returncode == 0, b.stderr
        b_home, b_provider = b.stdout.splitlines()[:2]
        a_out, a_err = a.communicate("\n", timeout=120)
        assert a.returncode == 0, a_err
        a_home, a_provider = a_out.splitlines()[:2]
        assert a_home != b_home and Path(a_home).parent == Path(b_home).parent
        assert Path(a_provider) == STAND_IN / "pulumi-resource-command"
        assert Path(b_provider).is_relative_to(tmp_path / "home"), b_provider
        for out in (a_out, b.stdout):  # the engine sees one command plugin, at the pin
            plugins = json.loads("\n".join(out.splitlines()[2:]))
            assert [p["version"] for p in plugins if p["name"] == "command"] == [
                _pin("pulumi-command")], plugins
    finally:
        if a.poll() is None:
            a.kill()
        if b_home and Path(b_home).name.startswith("installed-"):
            shutil.rmtree(b_home, ignore_errors=True)
