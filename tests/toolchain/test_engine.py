"""The engine `source lab/env.sh` gives is the real Pulumi engine (lab/tools.sh): the command
provider at the version the Python SDK pins, installed in the lab's plugin cache as a download
would be, and the Python language host bundled next to the CLI — nothing taken from $PATH."""

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

VENDOR = Path(os.environ.get("SPARK_VLLM_VENDOR", REPO_DIR.parent / "shared" / "vendor"))


def _pin(name: str) -> str:
    text = (REPO_DIR / "requirements.txt").read_text()
    match = re.search(rf"^{re.escape(name)}==(\S+)", text, re.M)
    assert match, f"no {name} pin"
    return match.group(1)


def _vendored_sdk() -> str:
    row = next(line for line in (VENDOR / "README.md").read_text().splitlines()
               if line.startswith("| `pulumi-language-python/`"))
    match = re.search(r"\| sdk (\d+\.\d+\.\d+)", row)
    assert match, row
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


def test_the_command_provider_is_installed_at_the_pinned_version(env: dict[str, str]) -> None:
    plugins = json.loads(pulumi(env, "plugin", "ls", "--json"))
    command = [p for p in plugins if (p["kind"], p["name"]) == ("resource", "command")]
    assert [p["version"] for p in command] == [_pin("pulumi-command")], plugins
    installed = (Path(env["PULUMI_HOME"]) / "plugins" / f"resource-command-v{_pin('pulumi-command')}"
                 / "pulumi-resource-command")
    built = (Path(env["SPARK_VLLM_TOOLCHAIN_BIN"]).parent / "plugins"
             / f"resource-command-v{_pin('pulumi-command')}" / "pulumi-resource-command")
    assert installed.read_bytes() == built.read_bytes()
    # a Go binary with pulumi-command's own version stamped in, not a script
    data = built.read_bytes()
    assert data[:4] == b"\x7fELF" and b"github.com/pulumi/pulumi-command/provider" in data


def test_pulumi_about_names_the_real_language_host(env: dict[str, str]) -> None:
    about = json.loads(pulumi(env, "about", "--json"))
    language = [p for p in about["plugins"] if p["kind"] == "language" and p["name"] == "python"]
    assert [p["version"] for p in language] == [_vendored_sdk()], about["plugins"]
    assert about["cliAbout"]["version"].startswith("3.")


def test_no_plugin_is_taken_from_path(env: dict[str, str]) -> None:
    assert env.get("PULUMI_IGNORE_AMBIENT_PLUGINS") == "true"
    path = env["PATH"]
    bundled = Path(env["SPARK_VLLM_TOOLCHAIN_BIN"])
    # the language host resolves next to the CLI (bundled), the command provider nowhere on PATH
    assert shutil.which("pulumi", path=path) == str(bundled / "pulumi")
    assert shutil.which("pulumi-language-python", path=path) == str(bundled /
                                                                    "pulumi-language-python")
    assert (bundled / "pulumi-language-python").read_bytes()[:4] == b"\x7fELF"
    assert shutil.which("pulumi-resource-command", path=path) is None


def test_a_vendor_snapshot_that_does_not_match_the_pin_is_refused(tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    shutil.copytree(VENDOR, vendor)
    readme = vendor / "README.md"
    readme.chmod(0o644)
    readme.write_text(readme.read_text().replace(f"tag v{_pin('pulumi-command')}", "tag v1.0.9"))
    proc = subprocess.run(["bash", "lab/tools.sh"], cwd=REPO_DIR, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SPARK_VLLM_VENDOR": str(vendor),
                                           "SPARK_VLLM_CACHE": str(tmp_path / "cache"),
                                           "SPARK_VLLM_ENGINE": "vendored"})
    assert proc.returncode != 0
    assert f"pins pulumi-command=={_pin('pulumi-command')}" in proc.stderr
    assert "v1.0.9" in proc.stderr
    assert not (tmp_path / "cache").exists()  # refused before building anything


def _installed_engine(tmp_path: Path, env: dict[str, str], with_plugin: bool = True) -> dict[str, str]:
    """An engine installed the usual way: the CLI with its language host in one directory on
    PATH (the official tarball's layout), the command provider in ~/.pulumi/plugins. Its parts
    are copies of the real ones the fallback built."""
    built = Path(env["SPARK_VLLM_TOOLCHAIN_BIN"])
    bin_dir, home = tmp_path / "pulumi" / "bin", tmp_path / "home" / ".pulumi"
    bin_dir.mkdir(parents=True)
    for part in built.iterdir():
        shutil.copy2(part, bin_dir / part.name)
    if with_plugin:
        leaf = f"resource-command-v{_pin('pulumi-command')}"
        (home / "plugins" / leaf).mkdir(parents=True)
        shutil.copy2(built.parent / "plugins" / leaf / "pulumi-resource-command",
                     home / "plugins" / leaf / "pulumi-resource-command")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PULUMI_HOME": str(home),
            "SPARK_VLLM_CACHE": str(tmp_path / "cache"),
            # no sources: only the installed engine can answer
            "SPARK_VLLM_VENDOR": str(tmp_path / "no-vendor")}


def test_an_installed_engine_is_used_without_building_or_vendored_sources(
        tmp_path: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(["bash", "lab/tools.sh"], cwd=REPO_DIR, capture_output=True, text=True,
                          timeout=60, env=_installed_engine(tmp_path, env))
    assert proc.returncode == 0, proc.stderr
    assert "using the installed engine" in proc.stderr and "building" not in proc.stderr
    bin_dir = Path(proc.stdout.splitlines()[-1])
    assert (bin_dir / "pulumi").resolve() == tmp_path / "pulumi" / "bin" / "pulumi"
    plugin = bin_dir.parent / "plugins" / f"resource-command-v{_pin('pulumi-command')}"
    assert (plugin / "pulumi-resource-command").resolve().is_relative_to(tmp_path / "home")
    version = subprocess.run([str(bin_dir / "pulumi"), "version"], capture_output=True,
                             text=True, timeout=60).stdout.strip()
    assert version.startswith("v3.")


def test_an_installed_cli_without_the_command_plugin_falls_back_and_says_why(
        tmp_path: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(["bash", "lab/tools.sh"], cwd=REPO_DIR, capture_output=True, text=True,
                          timeout=60, env=_installed_engine(tmp_path, env, with_plugin=False))
    assert proc.returncode != 0
    assert f"pulumi plugin install resource command {_pin('pulumi-command')}" in proc.stderr
    assert "set SPARK_VLLM_VENDOR" in proc.stderr
