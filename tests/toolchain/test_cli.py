"""`spark-vllm` as an operator meets it, with the real Pulumi CLI and no lab: `init` makes a
project outside this clone, a plaintext or placeholder secret stops `pulumi preview` before any
resource, and a failing pulumi call reads as what went wrong and what to do — no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lab.config import REPO_DIR
from tests import operator_project

KEY = REPO_DIR / "tests" / "fixtures" / "keys" / "clear_ed25519"
CLI = operator_project.CLI


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """`spark-vllm init` into a directory outside the clone, run by the repo's .venv (which has
    spark-vllm installed), with its own file backend and one stack."""
    root = tmp_path_factory.mktemp("operator")
    assert not root.is_relative_to(REPO_DIR)
    proj, env, out = operator_project.make(root)
    assert "pulumi stack init SITE" in out
    req = (proj / "requirements.txt").read_text()
    assert f"spark-vllm @ file://{REPO_DIR}" in req  # where this spark-vllm came from
    doc = yaml.safe_load((proj / "Pulumi.yaml").read_text())
    assert doc["name"] == "spark-vllm" and "stackConfigDir" not in doc
    assert all(doc["config"][k]["secret"] for k in ("sshPrivateKey", "hfToken", "apiKey"))
    # the PR-preview workflow comes with the project, previewing Pulumi.<stack>.yaml there
    workflow = (proj / ".github" / "workflows" / "spark-vllm-preview.yml").read_text()
    assert 'glob("Pulumi.*.yaml")' in workflow and "venv/bin/spark-vllm summary" in workflow
    subprocess.run(["pulumi", "stack", "init", "site-a"], cwd=proj, env=env, check=True,
                   capture_output=True, timeout=60)
    example = (REPO_DIR / "stacks" / "Pulumi.spark-duo.yaml").read_text()
    with (proj / "Pulumi.site-a.yaml").open("a") as f:
        f.write(example)
    operator_project.pin_host_keys(proj / "Pulumi.site-a.yaml")
    return proj, env


def pulumi(proj: Path, env: dict[str, str], *args: str, stdin: str | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["pulumi", *args], cwd=proj, env=env, input=stdin,
                          capture_output=True, text=True, timeout=180)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_init_refuses_a_directory_that_holds_a_project(project: tuple[Path, dict[str, str]]) -> None:
    proj, _ = project
    proc = subprocess.run([str(CLI), "init", str(proj)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "already holds Pulumi.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_plaintext_and_placeholder_secrets_stop_the_preview_before_any_resource(
        project: tuple[Path, dict[str, str]]) -> None:
    proj, env = project
    pulumi(proj, env, "config", "set", "--secret", "spark-vllm:sshPrivateKey", stdin=KEY.read_text())
    pulumi(proj, env, "config", "set", "--plaintext", "spark-vllm:apiKey", "sk-site-a-in-clear")
    pulumi(proj, env, "config", "set", "--secret", "spark-vllm:hfToken", "HF_TOKEN_VALUE")
    proc = pulumi(proj, env, "preview", check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert ("apiKey: set in plaintext, so the stack file holds it in clear; set it as a secret "
            "instead: `pulumi config set --secret spark-vllm:apiKey`") in text
    assert ("hfToken: is a placeholder (an example's stand-in), not a real value; set it with "
            "`pulumi config set --secret spark-vllm:hfToken`") in text
    assert "sk-site-a-in-clear" not in text and "Traceback" not in text
    # nothing was made: the state holds no resource
    state = json.loads(pulumi(proj, env, "stack", "export").stdout)
    assert not state["deployment"].get("resources")
    # set right, by the documented commands (stdin): the config is accepted (the preview then
    # stops only at the nodes, which do not exist here)
    pulumi(proj, env, "config", "set", "--secret", "spark-vllm:apiKey", stdin="sk-site-a-7f3c9e21\n")
    pulumi(proj, env, "config", "rm", "spark-vllm:hfToken")
    proc = pulumi(proj, env, "preview", check=False)
    assert "invalid spark-vllm config" not in proc.stdout + proc.stderr


def test_a_wrong_passphrase_is_named_with_the_variables_to_set(
        project: tuple[Path, dict[str, str]]) -> None:
    proj, env = project
    pulumi(proj, env, "config", "set", "--secret", "spark-vllm:sshPrivateKey", stdin=KEY.read_text())
    proc = subprocess.run([str(CLI), "status", "--stack", "site-a"], cwd=proj, capture_output=True,
                          text=True, timeout=120,
                          env={**env, "PULUMI_CONFIG_PASSPHRASE": "not-the-passphrase"})
    assert proc.returncode == 2
    assert "the stack's secrets cannot be decrypted" in proc.stderr
    assert "PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE)" in proc.stderr
    assert "not set" not in proc.stderr and "Traceback" not in proc.stderr


def test_cli_failures_say_what_to_do(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    proj, env = project
    proc = subprocess.run([str(CLI), "status", "--stack", "nope"], cwd=proj, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "no such stack" in proc.stderr
    assert "`pulumi stack ls`" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([str(CLI), "status"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2 and "no Pulumi.yaml" in proc.stderr
    assert "spark-vllm init DIR" in proc.stderr
    proc = subprocess.run([str(CLI), "status", "--stack", "site-a"], cwd=proj,
                          capture_output=True, text=True, timeout=60,
                          env={**env, "PATH": str(Path(sys.executable).parent)})
    assert proc.returncode == 2 and "the `pulumi` CLI is not on PATH" in proc.stderr
