"""The lab's language host (lab/engine/language_launcher.py: the Python SDK's own language server,
launched where the CLI looks for its host) under the real CLI, on what the program relies on:
the project's virtualenv, config and secret flags reaching the program, exit code 32 as "the
program already said why" (components/program.py), another exit code named, a missing venv
named with the fix, and the provider SDKs' plugins declared up front."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import envsh
from lab.engine import language_launcher

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROGRAM = '''
import os, sys
import pulumi
from pulumi.runtime import config as rc
cfg = pulumi.Config("t")
print("venv=" + sys.prefix)
print("secret-flag=" + str(rc.is_config_secret("t:token")))
print("greeting=" + cfg.require("greeting"))
what = cfg.get("end") or ""
if what == "bail":
    pulumi.log.error("bad field: nodes[1].fabricIp")
    raise SystemExit(32)
if what == "crash":
    raise SystemExit(7)
pulumi.export("token_len", cfg.require_secret("token").apply(len))
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("langhost")
    (d / "Pulumi.yaml").write_text(
        f"name: langhost\nruntime:\n  name: python\n  options:\n"
        f"    virtualenv: {sys.prefix}   # the project's venv\n")
    (d / "__main__.py").write_text(PROGRAM)
    (d / "state").mkdir()
    env = {**envsh.sourced(), "PULUMI_BACKEND_URL": f"file://{d / 'state'}",
           "PULUMI_CONFIG_PASSPHRASE": "langhost"}
    env.pop("PYTHONPATH", None)
    pulumi(d, env, "stack", "init", "dev")
    pulumi(d, env, "config", "set", "t:greeting", "hello")
    pulumi(d, env, "config", "set", "--secret", "t:token", "s3cr3t-value")
    return d, env


def pulumi(cwd: Path, env: dict[str, str], *args: str,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["pulumi", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def preview_ending(d: Path, env: dict[str, str], end: str) -> subprocess.CompletedProcess[str]:
    """`pulumi preview` of the program made to end as `end` says (bail: exit 32 after its own
    error; crash: exit 7), the config put back after."""
    pulumi(d, env, "config", "set", "t:end", end)
    try:
        return pulumi(d, env, "preview", check=False)
    finally:
        pulumi(d, env, "config", "rm", "t:end")


def test_the_program_runs_in_the_project_venv_with_its_config_and_secret_flags(
        project: tuple[Path, dict[str, str]]) -> None:
    d, env = project
    proc = pulumi(d, env, "up", "--yes", "--skip-preview")
    out = proc.stdout
    assert f"venv={sys.prefix}" in out
    assert "secret-flag=True" in out and "greeting=hello" in out
    assert "s3cr3t-value" not in out + proc.stderr
    assert pulumi(d, env, "stack", "output", "token_len", "--show-secrets").stdout.strip() == "12"


def test_exit_32_is_the_programs_own_error_and_nothing_more(
        project: tuple[Path, dict[str, str]]) -> None:
    proc = preview_ending(*project, "bail")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # the diagnostics hold the program's error and no second one from the host or engine
    errors = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("error:")]
    assert errors == ["error: bad field: nodes[1].fabricIp"], text
    assert "unhandled error" not in text and "Traceback" not in text, text


def test_another_exit_code_is_named(project: tuple[Path, dict[str, str]]) -> None:
    proc = preview_ending(*project, "crash")
    assert proc.returncode != 0
    assert "program exited with non-zero exit code: 7" in proc.stdout + proc.stderr


def test_a_missing_virtualenv_is_named_with_the_fix(tmp_path: Path,
                                                    project: tuple[Path, dict[str, str]]) -> None:
    _, env = project
    (tmp_path / "Pulumi.yaml").write_text(
        "name: novenv\nruntime:\n  name: python\n  options:\n    virtualenv: venv\n")
    (tmp_path / "__main__.py").write_text("import pulumi\n")
    (tmp_path / "state").mkdir()
    env = {**env, "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}"}
    pulumi(tmp_path, env, "stack", "init", "dev")
    proc = pulumi(tmp_path, env, "preview", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{tmp_path}/venv" in text and "python3 -m venv" in text, text


def test_the_provider_sdks_plugins_are_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    """GetRequiredPackages: pulumi_command's pulumi-plugin.json names command at the SDK's pin."""
    pin = next(line.split("==")[1].strip() for line in
               (REPO / "requirements.txt").read_text().splitlines()
               if line.startswith("pulumi-command=="))
    assert ("resource", "command", pin) in language_launcher.required_packages()
    assert os.path.basename(language_launcher.entry_point(str(REPO), ".")) == "__main__.py"
