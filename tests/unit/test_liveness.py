"""The liveness companion's provider: what its diff decides, what its read script says for
each state docker can report, and that spark-vllm's code never becomes part of the state."""

from __future__ import annotations

import base64
import os
import pickletools
import stat
import subprocess
from pathlib import Path

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from spark_vllm import liveness
from spark_vllm.commands import script_text

PROPS = {"node": "node-2", "host": "10.0.0.2", "port": 22, "user": "aurora",
         "privateKey": "k", "hostKey": "", "container": "spark-vllm-s-ray-worker",
         "serving": [], "state": "running", "__provider": "old-code"}


def test_a_container_seen_dead_replaces_the_companion() -> None:
    for seen in ("exited (137)", "gone", "running, not serving: smoke request failed"):
        d = liveness._Provider().diff("id", {**PROPS, "state": seen}, PROPS)
        assert d.changes and d.replaces == ["state"], seen


def test_anything_else_is_an_update_that_keeps_the_id() -> None:
    """A new address or key must not restart anything by itself (the container command has its
    own triggers for that), and a new spark-vllm (another serialized provider) changes nothing."""
    p = liveness._Provider()
    assert not p.diff("id", PROPS, {**PROPS, "__provider": "new-code"}).changes
    for key, value in (("host", "10.0.0.9"), ("privateKey", "k2"), ("user", "root")):
        d = p.diff("id", PROPS, {**PROPS, key: value})
        assert d.changes and not d.replaces, key
    assert p.update("id", PROPS, {**PROPS, "host": "10.0.0.9"}).outs["state"] == "running"


def test_the_state_holds_a_reference_to_the_provider_not_its_code() -> None:
    """What the state stores for the companion's provider: a pickle that names the class (to be
    imported from the project at run time), with no code object. So upgrading spark-vllm cannot
    change it, even byte for byte."""
    blob = base64.b64decode(serialize_provider(liveness._Provider()))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(blob)]
    strings = [arg for name, arg in ops if isinstance(arg, str)]
    assert "spark_vllm.liveness" in strings and "_Provider" in strings
    assert not any("code" in str(arg).lower() for _, arg in ops if arg is not None), ops
    assert len(blob) < 200


@pytest.fixture
def fake_docker(tmp_path: Path) -> Path:
    """A `docker` that answers as $FAKE says, and records how it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "docker"
    tool.write_text("""#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$1:$FAKE" in
  inspect:missing) echo "Error: No such object: $3" >&2; exit 1 ;;
  inspect:daemon) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock" >&2; exit 1 ;;
  inspect:exited) echo "exited 137" ;;
  inspect:*) echo "running 0" ;;
  exec:serving) cat >/dev/null; exit 0 ;;
  exec:busy) cat >/dev/null; echo "smoke request: no answer within 5 s" >&2; exit 3 ;;
  exec:*) cat >/dev/null; echo "smoke request failed: HTTP Error 500" >&2; exit 2 ;;
esac
""")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.parametrize(("fake", "serving", "rc", "out"), [
    ("missing", None, 0, "gone"),
    ("exited", None, 0, "exited (137)"),
    ("running", None, 0, "running"),
    ("serving", ["127.0.0.1", "8000", "m"], 0, "running"),
    ("dead-generation", ["127.0.0.1", "8000", "m"], 0,
     "running, not serving: smoke request failed: HTTP Error 500"),
    # a long queue is not a dead server: refresh must not reload the weights for it
    ("busy", ["127.0.0.1", "8000", "m"], 0, "running"),
    ("daemon", None, 3, ""),
])
def test_inspect_script_says_what_docker_says(fake_docker: Path, tmp_path: Path, fake: str,
                                              serving: list[str] | None, rc: int,
                                              out: str) -> None:
    log = tmp_path / "calls"
    proc = subprocess.run(
        ["sh", "-c", liveness.inspect_script("spark-vllm-s-vllm", serving)],
        input=script_text("vllm_probe.py") if serving else "", capture_output=True, text=True,
        env={**os.environ, "PATH": f"{fake_docker}:{os.environ['PATH']}", "FAKE": fake,
             "FAKE_LOG": str(log)}, timeout=30)
    assert (proc.returncode, proc.stdout.strip()) == (rc, out), proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("inspect --format") and calls[0].endswith("spark-vllm-s-vllm")
    if fake == "daemon":
        assert "Cannot connect to the Docker daemon" in proc.stderr
    # the probe runs only for vLLM, only while it runs, in the container, with the probe's argv
    execs = [c for c in calls if c.startswith("exec")]
    assert execs == ([f"exec -i spark-vllm-s-vllm python3 - {' '.join(serving)} ready 0 smoke 5"]
                     if serving and fake in ("serving", "dead-generation", "busy") else [])
