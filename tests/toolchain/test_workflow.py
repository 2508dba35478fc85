"""The pull-request workflow an operator's project gets (spark_vllm/template/preview.yml, which
`spark-vllm init` writes to .github/workflows/) passes actionlint, the real linter, built from
the Go module proxy by lab/actionlint.sh (it also runs shellcheck on `run:` scripts when
shellcheck is on PATH); and the check can fail: a broken copy is reported."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.config import REPO_DIR

PREVIEW = REPO_DIR / "spark_vllm" / "template" / "preview.yml"


@pytest.fixture(scope="module")
def actionlint() -> str:
    proc = subprocess.run(["bash", "lab/actionlint.sh"], cwd=REPO_DIR, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def lint(actionlint: str, *files: Path, cwd: Path = REPO_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([actionlint, "-no-color", *map(str, files)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_linter_is_the_pinned_actionlint(actionlint: str) -> None:
    proc = subprocess.run([actionlint, "-version"], capture_output=True, text=True, timeout=30)
    assert proc.stdout.splitlines()[0] == "v1.7.12", proc.stdout


def _project(tmp_path: Path, text: str) -> Path:
    """The workflow where `spark-vllm init` puts it."""
    path = tmp_path / ".github" / "workflows" / "spark-vllm-preview.yml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_the_preview_workflow_passes_actionlint(actionlint: str, tmp_path: Path) -> None:
    proc = lint(actionlint, _project(tmp_path, PREVIEW.read_text()), cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize(("old", "new", "reported"), [
    ("runs-on: ubuntu-latest", "runs-on: ubuntu-latst", 'label "ubuntu-latst" is unknown'),
    ('cat summary.md >> "$GITHUB_STEP_SUMMARY"',
     'echo "${{ steps.nope.outputs.x }}" >> "$GITHUB_STEP_SUMMARY"',
     'property "nope" is not defined'),
])
def test_a_broken_copy_is_reported(actionlint: str, tmp_path: Path, old: str, new: str,
                                   reported: str) -> None:
    text = PREVIEW.read_text()
    assert old in text
    broken = _project(tmp_path, text.replace(old, new, 1))
    proc = lint(actionlint, broken, cwd=tmp_path)
    assert proc.returncode == 1, proc
    assert reported in proc.stdout, proc.stdout


def _workflow() -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load(PREVIEW.read_text())
    return doc


def test_the_preview_workflow_runs_on_the_program_and_stacks_with_minimal_permissions() -> None:
    doc = _workflow()
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on["pull_request"]["paths"] == ["__main__.py", "requirements.txt", "Pulumi.yaml",
                                           "Pulumi.*.yaml"]
    assert doc["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert all("permissions" not in job for job in doc["jobs"].values())


def test_the_preview_never_refreshes_and_installs_the_pinned_cli() -> None:
    text = PREVIEW.read_text()
    runs = [step.get("run", "") for job in _workflow()["jobs"].values() for step in job["steps"]]
    previews = [ln.strip() for run in runs for ln in run.splitlines()
                if ln.strip().startswith("pulumi preview")]
    assert len(previews) == 2 and not any("--refresh" in p for p in previews), previews
    assert 'm.version("pulumi")' in text and "get.pulumi.com | sh -s -- --version" in text
    assert "<!-- spark-vllm-preview:${stack} -->" in text
