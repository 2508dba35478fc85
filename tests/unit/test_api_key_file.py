"""The API key's own file on the API server's node (api_key_commands.api_key_script and
api_key_remove_script, run by node.py api_key_command): written atomically, 0600, in a 0700
directory of the stack's state dir that only the API server's container mounts (read-only), so
a rotation is written in place and restarts nothing; removed with the last container that
mounts it. The key travels on stdin only."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from spark_vllm.components.render import api_key_commands
from spark_vllm.components.render import commands as c
from spark_vllm.components.render.backends import native, ray
from tests.unit.harness import lab_nodes, spec_from

# a docker that answers `ps` with an id while $FAKE/mounted exists, and records its argv
FAKE_DOCKER = """#!/bin/sh
printf '%s\\n' "$*" >> "$FAKE/docker.calls"
case "$1" in
  ps) [ -e "$FAKE/mounted" ] && echo 0123456789ab ;;
esac
exit 0
"""


def run(script: str, home: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    (home / "bin").mkdir(exist_ok=True)
    docker = home / "bin" / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    env = {**os.environ, "HOME": str(home), "FAKE": str(home),
           "PATH": f"{home / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, text=True,
                          env=env, timeout=30)


def test_the_key_is_written_atomically_0600_and_rewritten_in_place(tmp_path: Path) -> None:
    spec = spec_from(lab_nodes(2), stack="duo")
    script = api_key_commands.api_key_script(spec, spec.head)
    assert "sk-" not in script  # the key is never in the script: stdin only
    first = run(script, tmp_path, api_key_commands.api_key_text("sk-first-1"))
    assert first.returncode == 0, first.stderr
    d = tmp_path / ".spark-vllm" / "duo" / "api-key"
    key = d / "key"
    assert key.read_text() == "sk-first-1"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert sorted(p.name for p in d.iterdir()) == ["key"]  # no temporary file left
    assert "sk-first-1" not in first.stderr + first.stdout
    inode = key.stat().st_ino
    again = run(script, tmp_path, api_key_commands.api_key_text("sk-second-2"))
    assert again.returncode == 0, again.stderr
    # a new file renamed over the old one: a reader sees either key whole, never a part
    assert key.read_text() == "sk-second-2" and key.stat().st_ino != inode
    assert not (tmp_path / "docker.calls").exists()  # no container is touched


def test_no_key_on_stdin_fails_and_keeps_the_old_key(tmp_path: Path) -> None:
    spec = spec_from(lab_nodes(2), stack="duo")
    assert run(api_key_commands.api_key_script(spec, spec.head), tmp_path, "sk-kept").returncode == 0
    failed = run(api_key_commands.api_key_script(spec, spec.head), tmp_path, "")
    assert failed.returncode == 1 and "no key on stdin" in failed.stderr
    d = tmp_path / ".spark-vllm" / "duo" / "api-key"
    assert sorted(p.name for p in d.iterdir()) == ["key"]
    assert (d / "key").read_text() == "sk-kept"


@pytest.mark.parametrize("bad", ["", "two\nlines", "nul\0inside", "cr\r"])
def test_a_key_that_is_not_one_printable_line_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="apiKey"):
        api_key_commands.api_key_text(bad)


def test_removed_with_the_last_container_that_mounts_it(tmp_path: Path) -> None:
    spec = spec_from(lab_nodes(2), stack="duo")
    assert run(api_key_commands.api_key_script(spec, spec.head), tmp_path, "sk-x").returncode == 0
    remove = api_key_commands.api_key_remove_script(spec, spec.head)
    (tmp_path / "mounted").touch()  # a container of the stack still mounts it (a switch)
    kept = run(remove, tmp_path)
    assert kept.returncode == 0 and "kept" in kept.stderr
    assert (tmp_path / ".spark-vllm" / "duo" / "api-key" / "key").exists()
    calls = (tmp_path / "docker.calls").read_text()
    assert "ps -aq --filter label=spark-vllm.stack=duo --filter volume=/spark-vllm-key" in calls
    (tmp_path / "mounted").unlink()
    gone = run(remove, tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert not (tmp_path / ".spark-vllm" / "duo").exists()  # the stack's dir held nothing else
    assert run(remove, tmp_path).returncode == 0  # idempotent


@pytest.mark.parametrize("backend", ["ray", "native"])
def test_only_the_api_servers_container_mounts_it_and_the_node_shell_expands_home(
        backend: str, tmp_path: Path) -> None:
    spec = spec_from(lab_nodes(2), stack="duo", backend=backend)
    if backend == "ray":
        serve = ray.vllm_run_argv(spec)
        others = [ray.head_run_argv(spec), ray.worker_run_argv(spec, spec.workers[0])]
    else:
        serve = native.leader_run_argv(spec)
        others = [native.rank_run_argv(spec, spec.workers[0])]
    mount = "~/.spark-vllm/duo/api-key:/spark-vllm-key:ro"
    assert serve[serve.index(mount) - 1] == "--volume"
    assert serve[serve.index("SPARK_VLLM_API_KEY_FILE=/spark-vllm-key/key") - 1] == "--env"
    assert not [w for argv in others for w in argv if "spark-vllm-key" in w]
    # the line the start script runs: the tilde is the node's (the SSH user's home)
    out = run(f"set -- {c.sh_join(serve)}\nprintf '%s\\n' \"$@\"", tmp_path)
    words = out.stdout.splitlines()
    assert f"{tmp_path}/.spark-vllm/duo/api-key:/spark-vllm-key:ro" in words
    assert words[:len(serve)] == [w.replace("~", str(tmp_path), 1) if w.startswith("~/") else w
                                  for w in serve]
