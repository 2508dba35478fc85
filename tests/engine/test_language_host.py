"""The Python language host under test (the lab's stand-in, lab/engine/language_launcher.py: the
Python SDK's own language server launched where the CLI looks for its host, unless
SPARK_VLLM_CONFORMANCE_LANGUAGE_HOST names another: tests/engine/conftest.py) under the real CLI,
on what the program and its users rely on: the project's virtualenv, config and secret flags
reaching the program, exit code 32 as "the program already said why" (components/program.py),
another exit code named, a missing or empty virtualenv created with the project's requirements
as the official host does, and the provider SDKs' plugins declared up front."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.engine import language_launcher
from tests.engine.conftest import cli_env

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
    env = {**cli_env(d), "PULUMI_BACKEND_URL": f"file://{d / 'state'}",
           "PULUMI_CONFIG_PASSPHRASE": "langhost"}
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


def _venv_project(d: Path, env: dict[str, str], requirements: str = "") -> dict[str, str]:
    """A project whose Pulumi.yaml names `virtualenv: venv`, with its own stack and state."""
    d.mkdir(exist_ok=True)
    (d / "Pulumi.yaml").write_text(
        "name: novenv\nruntime:\n  name: python\n  options:\n    virtualenv: venv\n")
    (d / "__main__.py").write_text("import pulumi\npulumi.export('ran', 'yes')\n")
    if requirements:
        (d / "requirements.txt").write_text(requirements)
    (d / "state").mkdir()
    env = {**env, "PULUMI_BACKEND_URL": f"file://{d / 'state'}"}
    pulumi(d, env, "stack", "init", "dev")
    return env


@pytest.mark.parametrize("start", ["missing", "empty"])
def test_a_missing_or_empty_virtualenv_is_created_with_the_requirements(
        tmp_path: Path, project: tuple[Path, dict[str, str]], start: str) -> None:
    """As the official host does (pulumi/pulumi sdk/python/toolchain/pip.go, EnsureVenv and
    InstallDependencies, v3.259.0; called from the host's GetRequiredPackages): a `virtualenv:`
    directory that is missing or empty is created (`python3 -m venv`), pip, setuptools and
    wheel are upgraded from the package index, the program directory's requirements.txt is
    installed, and the program runs in it; the host says each step."""
    pin = next(line.split("==")[1].strip() for line in
               (REPO / "requirements.txt").read_text().splitlines()
               if line.startswith("pulumi=="))
    d = tmp_path / "p"
    env = _venv_project(d, project[1], requirements=f"pulumi=={pin}\n")
    if start == "empty":
        (d / "venv").mkdir()
    proc = pulumi(d, env, "preview", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    for step in ("Creating virtual environment...", "Finished creating virtual environment",
                 "Updating pip, setuptools, and wheel in virtual environment...",
                 "Installing dependencies in virtual environment...",
                 "Finished installing dependencies"):
        assert step in text, (step, text[-3000:])
    venv_python = d / "venv" / "bin" / "python"
    probe = subprocess.run(
        [str(venv_python), "-c", "import sys, importlib.metadata as m; "
         "print(sys.prefix, m.version('pulumi'), m.version('wheel'))"],
        capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr  # wheel: upgraded in, a bare venv has none
    prefix, version, _ = probe.stdout.split()
    assert (prefix, version) == (str(d / "venv"), pin)
    # the program ran in it: its output is in the preview
    assert "ran" in proc.stdout and '"yes"' in proc.stdout, proc.stdout
    # a second preview finds it and creates nothing
    again = pulumi(d, env, "preview")
    assert "Creating virtual environment" not in again.stdout + again.stderr
    # `pulumi about`: the venv's interpreter, pip as its toolchain, its top-level packages
    about = json.loads(pulumi(d, env, "about", "--json").stdout)
    assert about["runtime"]["executable"] == str(venv_python)
    assert about["runtime"]["toolchain"] == "Auto", about["runtime"]  # Pulumi.yaml names none
    assert {"name": "pulumi", "version": pin} in about["dependencies"], about["dependencies"]
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", dep["name"])
               for dep in about["dependencies"]), about["dependencies"]


def test_a_virtualenv_that_is_a_file_or_holds_no_python_is_refused(
        tmp_path: Path, project: tuple[Path, dict[str, str]]) -> None:
    """What the official host answers (v3.259.0, tried): a file is "not a directory"; a
    directory that holds files but no bin/python is left alone, and running its python fails."""
    d = tmp_path / "p"
    env = _venv_project(d, project[1])
    (d / "venv").write_text("")
    proc = pulumi(d, env, "preview", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (f"the 'virtualenv' option in Pulumi.yaml is set to \"{d}/venv\" but it is not a "
            "directory") in text, text
    (d / "venv").unlink()
    (d / "venv").mkdir()
    (d / "venv" / "junk").write_text("")
    proc = pulumi(d, env, "preview", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{d}/venv/bin/python: no such file or directory" in text, text
    assert sorted(p.name for p in (d / "venv").iterdir()) == ["junk"]  # left as it was


def test_the_stand_ins_provider_sdks_plugins_are_declared() -> None:
    """The stand-in's GetRequiredPackages (its own code, whatever host is under test):
    pulumi_command's pulumi-plugin.json names command at the SDK's pin."""
    pin = next(line.split("==")[1].strip() for line in
               (REPO / "requirements.txt").read_text().splitlines()
               if line.startswith("pulumi-command=="))
    assert ("resource", "command", pin) in language_launcher.required_packages()
    assert os.path.basename(language_launcher.entry_point(str(REPO), ".")) == "__main__.py"


def test_the_host_ends_on_the_engines_sigint_even_started_with_sigint_ignored(
        project: tuple[Path, dict[str, str]]) -> None:
    """A background job of a non-interactive shell (`pulumi up &` in a script, CI, nohup)
    starts with SIGINT ignored. The engine ends its language host with SIGINT; a Python host
    that kept the inherited SIG_IGN did not end, and the CLI waited its grace period on every
    run (5 s per `pulumi up` of the bench, found by running it in the background). Go's
    os/signal.Notify, which the official host uses, un-ignores the signal."""
    import signal
    import time

    from tests.engine.conftest import part_under_test

    d, env = project
    host = subprocess.Popen(
        [str(part_under_test("pulumi-language-python")), "127.0.0.1:1"], cwd=d, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        port = host.stdout.readline().strip()  # the host is up when it prints its port
        assert port.isdigit(), port
        host.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 4
        while host.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.poll() is not None, "the host ignored the engine's SIGINT"
    finally:
        host.kill()
        host.wait(timeout=10)
