"""spark-vllm as `pip install /path/to/spark-vllm` gives it: the wheel built from this checkout,
installed into a fresh virtualenv, and used from that virtualenv alone (its own python and its
own `spark-vllm`; no PYTHONPATH, no repository on the way, every command run outside the
clone), with the real Pulumi CLI of `source lab/env.sh`.

The two ways of using it (docs/usage.md) both preview the seeds' stacks up to the program's own
outcome: a project of your own from `spark-vllm init`, and a clone-like project whose stacks
live in stacks/ (`stackConfigDir: stacks`). A preview needs no SSH, so the nodes need not
exist. Then `spark-vllm status` and `summary` from the same virtualenv.

A wheel that leaves a subpackage out (pyproject's old `packages = ["spark_vllm"]` dropped
spark_vllm.components.render.backends) fails every preview here at the program's first import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lab import envsh
from lab.config import REPO_DIR
from tests import operator_project

KEY = REPO_DIR / "tests" / "fixtures" / "keys" / "clear_ed25519"
STACKS = REPO_DIR / "stacks"
PACKAGE = REPO_DIR / "spark_vllm"
INSTALL_TIMEOUT_S = 600  # the dependencies come from pip's cache or the registry


@dataclass(frozen=True)
class Installed:
    root: Path  # a temporary directory outside the clone
    wheel: Path
    venv: Path
    env: dict[str, str]  # what every command here runs with

    @property
    def cli(self) -> Path:
        return self.venv / "bin" / "spark-vllm"


def run(args: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{proc.args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc


def _source_copy(dest: Path) -> Path:
    """The checkout's files (tracked, and untracked ones git does not ignore) in `dest`: the
    wheel is built there, so that setuptools' in-tree build/ and egg-info never touch the clone
    and a build/lib left from an earlier build cannot slip files into this wheel."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_DIR, capture_output=True, timeout=60, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        src = REPO_DIR / name
        if src.is_symlink():  # spark_vllm/components -> ../components: the link, as git has it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).symlink_to(os.readlink(src))
        elif src.is_file():  # a tracked file deleted in the work tree is not there
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _env(root: Path, venv: Path) -> dict[str, str]:
    """The engine of `source lab/env.sh` (its PATH and PULUMI_*), a file backend of its own, and
    nothing that could lead Python to the clone: no PYTHONPATH, no VIRTUAL_ENV, no directory of
    the clone on PATH (its .venv has spark-vllm installed editable)."""
    sourced = envsh.sourced()
    path = [p for p in sourced["PATH"].split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(REPO_DIR)]
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_VLLM_PROJECT"}
           and not k.startswith("PULUMI_")}
    env.update({k: v for k, v in sourced.items() if k.startswith("PULUMI_")})
    (root / "state").mkdir()
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]),
               PULUMI_BACKEND_URL=f"file://{root / 'state'}",
               PULUMI_CONFIG_PASSPHRASE=operator_project.PASSPHRASE)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    assert not root.is_relative_to(REPO_DIR)
    src = _source_copy(root / "src")
    dist = root / "dist"
    ok(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, src], cwd=root,
           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           timeout=INSTALL_TIMEOUT_S))
    (wheel,) = dist.glob("spark_vllm-*.whl")
    venv = root / "venv"
    ok(run([sys.executable, "-m", "venv", venv], cwd=root, env=dict(os.environ), timeout=120))
    env = _env(root, venv)
    ok(run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], cwd=root, env=env,
           timeout=INSTALL_TIMEOUT_S))
    return Installed(root=root, wheel=wheel, venv=venv, env=env)


def test_the_wheel_holds_every_subpackage_and_the_package_data(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    files = [Path(d, f) for d, _, fs in os.walk(PACKAGE, followlinks=True) for f in fs]
    expected = {p.relative_to(REPO_DIR).as_posix()
                for p in files if "__pycache__" not in p.parts
                and (p.suffix == ".py" or p.parent.name in ("scripts", "template"))}
    # a subpackage (the old packages line dropped them), through the link to components/
    assert "spark_vllm/components/render/backends/__init__.py" in expected
    assert "spark_vllm/template/gitignore" in expected  # dot-less: what `init` writes as .gitignore
    assert sorted(expected - names) == []


def test_the_venv_imports_spark_vllm_from_itself(installed: Installed) -> None:
    proc = ok(run([installed.venv / "bin" / "python", "-c",
                   "import spark_vllm.components.program, spark_vllm.components.render.backends, sys; "
                   "print(spark_vllm.components.program.__file__); print(sys.path)"],
                  cwd=installed.root, env=installed.env, timeout=60))
    where = Path(proc.stdout.splitlines()[0])
    assert where.is_relative_to(installed.venv), where
    assert str(REPO_DIR) not in proc.stdout


def preview(project: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                          dict[str, str]]:
    """`pulumi preview --json`: (the run, each resource name → its step's op)."""
    proc = run(["pulumi", "preview", "--json"], cwd=project, env=env, timeout=300)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {}
    # what the program said (the JSON's stdout also holds the rendered node scripts, whose
    # Python has its own `except ImportError`)
    said = "\n".join([*(d.get("message", "") for d in doc.get("diagnostics", [])), proc.stderr])
    # the program got past its imports and its config read
    for failure in ("ImportError", "ModuleNotFoundError", "Traceback", "invalid spark-vllm config"):
        assert failure not in said, said[-3000:]
    ok(proc)
    steps = {s["urn"].rsplit("::", 1)[-1]: s["op"] for s in doc["steps"]}
    return proc, steps


@pytest.fixture(scope="module")
def own_project(installed: Installed) -> tuple[Path, subprocess.CompletedProcess[str],
                                                dict[str, str]]:
    """The first way: `spark-vllm init` (the venv's), a stack made from the seeds' two-Spark
    stack file, previewed: (project, the preview, its steps)."""
    project = installed.root / "sparks"
    out = ok(run([installed.cli, "init", project], cwd=installed.root, env=installed.env,
                 timeout=60)).stdout
    assert "pulumi stack init SITE" in out
    assert (project / ".gitignore").read_text().startswith("# the project's virtualenv")
    assert (project / ".github" / "workflows" / "spark-vllm-preview.yml").is_file()
    # the program the project installs is this wheel (pip's direct_url.json)
    assert f"spark-vllm @ {installed.wheel.as_uri()}" in (project / "requirements.txt").read_text()
    operator_project.use_venv(project, installed.venv)
    ok(run(["pulumi", "stack", "init", "site-a"], cwd=project, env=installed.env, timeout=120))
    with (project / "Pulumi.site-a.yaml").open("a") as f:
        f.write((STACKS / "Pulumi.spark-duo.yaml").read_text())
    operator_project.pin_host_keys(project / "Pulumi.site-a.yaml")
    ok(run(["pulumi", "config", "set", "--secret", "spark-vllm:sshPrivateKey"], cwd=project,
           env=installed.env, stdin=KEY.read_text(), timeout=120))
    proc, steps = preview(project, installed.env)
    return project, proc, steps


def test_an_init_project_previews_the_two_spark_stack(
        own_project: tuple[Path, subprocess.CompletedProcess[str], dict[str, str]]) -> None:
    _, _, steps = own_project
    assert {name: op for name, op in steps.items() if op != "create"} == {}
    assert {"spark-a-preflight", "spark-b-preflight", "image-check", "model-stage",
            "model-copy-spark-b", "memory-check", "ray-head", "ray-worker-spark-b", "ray-gate",
            "vllm-serve"} <= set(steps)


def test_a_clone_previews_its_stacks_dir(installed: Installed) -> None:
    """The second way: the clone's Pulumi.yaml (`stackConfigDir: stacks`) and __main__.py, a
    site's stack in stacks/ (here the four-Spark one); no spark_vllm/ beside them, so the
    program is the venv's."""
    clone = installed.root / "clone"
    (clone / "stacks").mkdir(parents=True)
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy2(REPO_DIR / name, clone / name)
    assert yaml.safe_load((clone / "Pulumi.yaml").read_text())["stackConfigDir"] == "stacks"
    site = clone / "stacks" / "Pulumi.site-b.yaml"
    shutil.copy2(STACKS / "Pulumi.spark-quad.yaml", site)
    operator_project.pin_host_keys(site)
    operator_project.use_venv(clone, installed.venv)
    ok(run(["pulumi", "stack", "init", "site-b"], cwd=clone, env=installed.env, timeout=120))
    ok(run(["pulumi", "config", "set", "--secret", "spark-vllm:sshPrivateKey"], cwd=clone,
           env=installed.env, stdin=KEY.read_text(), timeout=120))
    # the stack's file is the one in stacks/: the salt and the secret went there
    text = site.read_text()
    assert "encryptionsalt:" in text and "spark-vllm:sshPrivateKey:" in text
    assert not (clone / "Pulumi.site-b.yaml").exists()
    _, steps = preview(clone, installed.env)
    assert {name: op for name, op in steps.items() if op != "create"} == {}
    assert {f"ray-worker-spark-{n}" for n in "bcd"} | {"ray-head", "ray-gate",
                                                       "vllm-serve"} <= set(steps)
    # status finds the clone's stack (the selected one) from its Pulumi.yaml
    proc = run([installed.cli, "--cwd", clone, "status"], cwd=installed.root, env=installed.env,
               timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "stack site-b has no `nodes` output: run `pulumi up` first" in proc.stderr


def test_status_and_summary_run_from_the_venv(
        installed: Installed,
        own_project: tuple[Path, subprocess.CompletedProcess[str], dict[str, str]]) -> None:
    project, preview_run, _ = own_project
    # status reads the stack through the venv's Automation API: never deployed, it says so
    proc = run([installed.cli, "status", "--stack", "site-a"], cwd=project, env=installed.env,
               timeout=120)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert "stack site-a has no `nodes` output: run `pulumi up` first" in proc.stderr
    assert "Traceback" not in proc.stderr
    # the same from outside the project, named with --cwd
    proc = run([installed.cli, "--cwd", project, "status", "--stack", "site-a"],
               cwd=installed.root, env=installed.env, timeout=120)
    assert proc.returncode == 2 and "run `pulumi up` first" in proc.stderr, proc.stderr
    # summary reads the preview's JSON: what starts where
    preview_json = installed.root / "preview.json"
    preview_json.write_text(preview_run.stdout)
    proc = ok(run([installed.cli, "summary", preview_json], cwd=installed.root,
                  env=installed.env, timeout=60))
    assert proc.stdout.startswith("### spark-vllm preview: stack `site-a`"), proc.stdout
    assert "Ray starts on spark-a, spark-b" in proc.stdout
    assert "| spark-b | Ray worker | **create** |" in proc.stdout
