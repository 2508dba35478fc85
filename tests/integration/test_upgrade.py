"""Living with a deployment on the real engine and a 2-node lab: an upgrade of spark-vllm and a
rotation of the deploy key restart nothing, and everything after the rotation works with the old
key already removed from the nodes.

1. The lab is deployed by the program of the commit named in `upgrade_base` (its package from
   `git archive`, on today's engine, the same stack and state); today's program then previews
   no replacement and its `up` restarts no container (docker's ids and start times), but what
   this release changes on purpose (ON_PURPOSE), which the PR summary names.
2. An intended change (an env value) still replaces the chain, in order.
3. A new `sshPrivateKey` (added to the nodes' authorized_keys first) previews no replacement
   and its `up` restarts nothing; the old key is then removed from every node, and `spark-vllm
   status`, `refresh`, `up --refresh` after a killed worker, an `apiKey` rotation (which
   restarts nothing: the key's file is rewritten in place) and `destroy` all work with the new
   key.

What the nodes hold is read with `docker exec` on the lab's node containers, not over SSH: the
lab's own key is the old key, and it is revoked here.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from lab import cluster, keys
from tests.integration.conftest import API_KEY
from tests.integration.engine import (
    FABRIC,
    REMEASURED,
    REPO,
    STACK,
    Lab,
    Run,
    chat,
    containers,
    engine_env,
    planned,
)
from tests.integration.test_lifecycle import assert_ordered_replacement, ok
from tests.integration.test_native import summary_of

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
CONTAINERS = {"ray-head", "ray-worker-node-2", "ray-gate", "vllm-serve"}
# the commit whose program deployed the state this release must upgrade without a restart: the
# previously landed one (updated on each landing; a change of what a container *is* restarts
# it once, and then names the commit that made it)
BASE_FILE = Path(__file__).with_name("upgrade_base")
REPLACING = {"replace", "create-replacement", "delete-replaced", "create", "delete"}
# what today's program changes on purpose in the base's deployment, and what the PR summary
# says of it; empty from the landing after the change (99428f4 moved the apiKey out of the API
# server's env into a file of its own, replacing that container once; that was its landing).
ON_PURPOSE: set[str] = set()  # replaced or created
ON_PURPOSE_SAID: tuple[str, ...] = ()
RESTARTED = {("node-1", "vllm")} if ON_PURPOSE else set()


def base_commit() -> str:
    return BASE_FILE.read_text().split("#")[0].split()[0]


def in_node(node: str, command: str, check: bool = True) -> str:
    """`command` on a lab node without SSH (docker exec on its container)."""
    proc = subprocess.run(["docker", "exec", cluster.find_node(node).container, "sh", "-c",
                           command], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"{node}: {command!r} failed: {proc.stderr}")
    return proc.stdout


def running() -> dict[tuple[str, str], tuple[str, str]]:
    """(node, role) -> (container id, start time) of the stack's containers; all running."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    fmt = '{{.Id}} {{index .Config.Labels "spark-vllm.role"}} {{.State.StartedAt}} {{.State.Running}}'
    for node in NODES:
        ids = in_node(node, f"docker ps -aq --filter label=spark-vllm.stack={STACK}").split()
        if not ids:
            continue
        for line in in_node(node, f"docker inspect --format '{fmt}' {' '.join(ids)}").splitlines():
            cid, role, started, up = line.split()
            assert (node, role) not in out, line  # no duplicate
            assert up == "true", line
            out[(node, role)] = (cid, started)
    return out


def replacing(run: Run) -> dict[str, str]:
    """What a run starts, stops or replaces; not the fabric check, which starts nothing (an
    upgrade from a release without it creates it once)."""
    return {n: op for n, op in run.changed().items() if op in REPLACING and n not in FABRIC}


def serves(lab: Lab, api_key: str) -> None:
    out = lab.outputs()
    reply = chat(out["endpoint"], out["servedModelName"], api_key)
    assert reply, out


def status() -> tuple[int, dict[str, Any]]:
    import json

    proc = subprocess.run([sys.executable, "-m", "spark_vllm.status", "--stack", STACK, "--json"],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **engine_env()}, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def base_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base commit's project: its files (git archive), this checkout's venv and the lab's
    stack file (the same config, state and engine)."""
    commit = base_commit()
    d = tmp_path_factory.mktemp("upgrade-base")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                             capture_output=True, timeout=60)
    assert archive.returncode == 0, archive.stderr.decode()
    subprocess.run(["tar", "-x", "-C", str(d)], input=archive.stdout, check=True, timeout=60)
    (d / ".venv").symlink_to(REPO / ".venv")
    (d / "stacks" / f"Pulumi.{STACK}.yaml").symlink_to(REPO / "stacks" / f"Pulumi.{STACK}.yaml")
    return d


@pytest.fixture(scope="module")
def keys_restored(lab2: Lab) -> Iterator[dict[str, str]]:
    """root's authorized_keys of every node, as the lab made them, put back at the end."""
    saved = {n: in_node(n, "cat /root/.ssh/authorized_keys") for n in NODES}
    yield saved
    for node, text in saved.items():
        in_node(node, f"printf %s '{text}' > /root/.ssh/authorized_keys")


def test_1_the_previous_release_deploys(lab2: Lab, base_project: Path) -> None:
    old = Lab(work_dir=base_project)
    ok(old.up())
    assert {(n, r) for n, r in running()} == {("node-1", "ray-head"), ("node-1", "vllm"),
                                              ("node-2", "ray-worker")}
    serves(lab2, API_KEY)


def test_2_the_upgrade_restarts_only_what_this_release_changes_on_purpose(lab2: Lab) -> None:
    """Nothing restarts but ON_PURPOSE, and the PR summary says why it does."""
    before = running()
    preview = ok(lab2.preview())
    assert set(replacing(preview)) == ON_PURPOSE, preview.changed()
    if ON_PURPOSE:
        summary = summary_of(lab2)
        for why in ON_PURPOSE_SAID:
            assert why in summary, summary
    run = ok(lab2.up())
    assert set(replacing(run)) == ON_PURPOSE, run.changed()
    after = running()
    assert {k for k in before if before[k] != after.get(k)} == RESTARTED, (before, after)
    serves(lab2, API_KEY)
    ok_again = ok(lab2.preview())
    assert not ok_again.changed(), ok_again.changed()  # the upgraded state is today's


def test_3_an_intended_change_still_replaces_the_chain_in_order(lab2: Lab) -> None:
    lab2.set("env", {"NCCL_DEBUG": "INFO"})
    preview = ok(lab2.preview())
    assert planned(preview) == {*CONTAINERS, REMEASURED}, preview.changed()
    before, old = running(), containers(NODES)
    since = time.time()
    run = ok(lab2.up())
    assert planned(run) == {*CONTAINERS, REMEASURED}, run.changed()
    assert_ordered_replacement(run, old, since, time.time(),
                               ["vllm-serve", "ray-gate", "ray-worker-node-2", "ray-head"])
    after = running()
    assert all(before[k][0] != after[k][0] for k in before), (before, after)
    serves(lab2, API_KEY)


def test_4_a_new_deploy_key_restarts_nothing_and_the_old_one_can_go(
        lab2: Lab, keys_restored: dict[str, str], tmp_path: Path) -> None:
    new = tmp_path / "id_new"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rotated",
                    "-f", str(new)], check=True, timeout=30)
    pub = (tmp_path / "id_new.pub").read_text().strip()
    for node in NODES:
        in_node(node, f"echo '{pub}' >> /root/.ssh/authorized_keys")
    lab2.stack.set_config("spark-vllm:sshPrivateKey",
                          auto.ConfigValue(new.read_text(), secret=True))
    before = running()
    preview = ok(lab2.preview())
    assert not replacing(preview), preview.changed()
    run = ok(lab2.up())
    assert not replacing(run), run.changed()
    assert running() == before
    # the old key removed from every node: only the new one opens them now
    old_pub = keys.client_key().with_suffix(".pub").read_text().split()[1]
    for node in NODES:
        in_node(node, f"grep -v '{old_pub}' /root/.ssh/authorized_keys > /tmp/ak; "
                      "cat /tmp/ak > /root/.ssh/authorized_keys")
        proc = subprocess.run(cluster.ssh_argv(node, "true"), capture_output=True, timeout=30)
        assert proc.returncode == 255, (node, proc.stderr)  # refused

    code, report = status()
    assert code == 0 and report["serving"], report
    refreshed = ok(lab2.refresh())
    assert not [s for s in refreshed.steps if s.op == "refresh" and "state" in s.diffs]


def test_5_with_the_old_key_gone_a_killed_worker_is_repaired(lab2: Lab) -> None:
    before = running()
    in_node("node-2", f"docker kill spark-vllm-{STACK}-ray-worker")
    code, report = status()
    assert code == 1 and not report["serving"], report
    run = ok(lab2.up(refresh=True))
    assert set(replacing(run)) & CONTAINERS == {"ray-worker-node-2", "ray-gate", "vllm-serve"}, \
        run.changed()
    after = running()
    assert after[("node-1", "ray-head")] == before[("node-1", "ray-head")]
    assert after[("node-2", "ray-worker")][0] != before[("node-2", "ray-worker")][0]
    serves(lab2, API_KEY)


def test_6_an_api_key_rotation_restarts_nothing(lab2: Lab) -> None:
    """The key is a file of its own on the head, read by the middleware at the next request
    (node.py api_key_command): a rotation is one update in place, no container restarts."""
    new_key = "sk-rotated-" + secrets.token_hex(8)
    lab2.stack.set_config("spark-vllm:apiKey", auto.ConfigValue(new_key, secret=True))
    before = running()
    preview = ok(lab2.preview())
    assert preview.changed() == {"vllm-api-key": "update"}, preview.changed()
    run = ok(lab2.up())
    assert run.changed() == {"vllm-api-key": "update"}, run.changed()
    assert running() == before  # the same containers, never restarted
    serves(lab2, new_key)
    with pytest.raises(urllib.error.HTTPError) as err:
        serves(lab2, API_KEY)
    assert err.value.code == 401


def test_7_destroy_with_the_new_key_leaves_nothing(lab2: Lab) -> None:
    ok(lab2.destroy())
    assert running() == {}
    for node in NODES:  # the stack's env-files (the secrets) went with their containers
        left = in_node(node, f"ls -A /root/.spark-vllm/{STACK} 2>&1 || true").strip()
        assert "No such file or directory" in left, (node, left)
        assert not in_node(node, "find /root/.spark-vllm -name '*.env' -o -name key").strip(), \
            node
