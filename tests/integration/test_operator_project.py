"""An operator's own project, outside this clone, deploys on the lab with the commands the
README gives (the real `pulumi` CLI, secrets by stdin), and `spark-vllm status` reads it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import cluster, config, keys
from tests import operator_project
from tests.integration.engine import node_sh

pytestmark = pytest.mark.integration

STACK = "ops"
CLI = operator_project.CLI


@pytest.fixture(scope="module")
def operator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("operator-repo")
    assert not root.is_relative_to(config.REPO_DIR)
    proj, env, _ = operator_project.make(root)
    try:
        cluster.up(cluster.UpOptions(nodes=2, stack=STACK, quiet=True))
        # the lab's addresses and host keys, as an operator would write them for their nodes;
        # nothing of the operator's stack stays in the clone
        lab_file = config.stack_file(STACK)
        shutil.move(lab_file, proj / f"Pulumi.{STACK}.yaml")
        yield proj, env
    finally:
        subprocess.run(["pulumi", "destroy", "--yes", "--skip-preview", "--stack", STACK],
                       cwd=proj, env=env, capture_output=True, timeout=600)
        config.stack_file(STACK).unlink(missing_ok=True)
        cluster.down(keep_volumes=True, quiet=True)


def sh(proj: Path, env: dict[str, str], *argv: str, stdin: str | None = None,
       timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=proj, env=env, input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def test_a_stack_kept_outside_the_clone_deploys_and_status_reads_it(
        operator: tuple[Path, dict[str, str]]) -> None:
    proj, env = operator
    assert sh(proj, env, "pulumi", "stack", "init", STACK).returncode == 0
    for key, value in (("sshPrivateKey", keys.client_key().read_text()),
                       ("apiKey", "sk-ops-5d1e9a7b\n")):
        proc = sh(proj, env, "pulumi", "config", "set", "--secret", f"spark-vllm:{key}",
                  stdin=value)
        assert proc.returncode == 0, proc.stderr
    text = (proj / f"Pulumi.{STACK}.yaml").read_text()
    assert "sk-ops-5d1e9a7b" not in text and "PRIVATE KEY" not in text  # encrypted there

    up = sh(proj, env, "pulumi", "up", "--yes", "--skip-preview", "--stack", STACK)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    assert not config.stack_file(STACK).exists()  # the clone holds nothing of this stack
    # the containers of this stack run on the nodes
    names = node_sh("node-1", f"docker ps --filter label=spark-vllm.stack={STACK} "
                              "--format '{{.Names}}'").split()
    assert sorted(names) == [f"spark-vllm-{STACK}-ray-head", f"spark-vllm-{STACK}-vllm"]

    status = sh(proj, env, str(CLI), "status", "--stack", STACK, timeout=180)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "verdict: SERVING" in status.stdout and "Traceback" not in status.stderr
    assert "sk-ops-5d1e9a7b" not in status.stdout + status.stderr

    down = sh(proj, env, "pulumi", "destroy", "--yes", "--skip-preview", "--stack", STACK)
    assert down.returncode == 0, down.stderr[-3000:]
    for node in ("node-1", "node-2"):
        assert node_sh(node, f"docker ps -aq --filter label=spark-vllm.stack={STACK}").split() == []
