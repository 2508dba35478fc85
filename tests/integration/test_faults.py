"""Faults and security on the real engine against a 2-node lab, logged in as the non-root user
`aurora` (as on the Sparks of the outage), with every secret set. Each scenario asserts on what
the user sees, how long it took, and what is left on the nodes and in the state; the last ones
scan everything a run leaves (state files, engine output and events, outputs, node files,
process lists) for the secrets' values."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab import cluster, config, keys, model
from spark_vllm.components.spec import SSH_DIALS
from tests.integration.conftest import API_KEY, TEST_DIAL_TIMEOUT_S
from tests.integration.engine import (
    LOG_DIR,
    REPO,
    STACK,
    Lab,
    Run,
    containers,
    docker_events,
    engine_env,
    node_sh,
)
from tests.integration.test_day2 import LAYOUT, NODES, by_role
from tests.integration.test_lifecycle import assert_serving, lab_identities, ok

pytestmark = pytest.mark.integration

HF_TOKEN = "hf_itest" + os.urandom(8).hex()
USER = "aurora"
RUNS: list[Run] = []  # every engine run of this module: their text and events are scanned
OUTPUTS: list[str] = []  # the stack's outputs while it served


def run_ok(run: Run) -> Run:
    RUNS.append(run)
    return ok(run)


def pending(lab: Lab) -> list[str]:
    ops = lab.stack.export_stack().deployment.get("pending_operations") or []
    return [f"{op['type']}:{op['resource']['urn'].split('::')[-1]}" for op in ops]


class ProcessLists:
    """Every command line on every node, sampled every 0.3 s while runs happen."""

    def __init__(self) -> None:
        self.text: dict[str, list[str]] = {n: [] for n in NODES}
        self.procs = {n: subprocess.Popen(
            cluster.ssh_argv(n, "while :; do ps -eo args; sleep 0.3; done"),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for n in NODES}
        self.threads = [threading.Thread(target=self._read, args=(n,), daemon=True) for n in NODES]
        for t in self.threads:
            t.start()

    def _read(self, node: str) -> None:
        out = self.procs[node].stdout
        assert out is not None
        for line in out:
            self.text[node].append(line)

    def stop(self) -> dict[str, str]:
        for p in self.procs.values():
            p.terminate()
        for t in self.threads:
            t.join(timeout=10)
        return {n: "".join(lines) for n, lines in self.text.items()}


@pytest.fixture(scope="module")
def lab(lab2: Lab) -> Iterator[Lab]:
    """The lab stack as `aurora`, with hfToken set too."""
    for i in range(len(NODES)):
        lab2.set(f"nodes[{i}].user", USER, path=True)
    lab2.set("hfCache", f"/home/{USER}/.cache/huggingface")
    # the model where aurora keeps it (the lab made it under /root for the root stacks)
    model.ensure(cluster.info().nodes[0], size=config.TEST_MODEL_BYTES,
                 hf_home=f"/home/{USER}/.cache/huggingface", owner=USER)
    lab2.stack.set_config("spark-vllm:hfToken", auto.ConfigValue(HF_TOKEN, secret=True))
    yield lab2
    lab2.stack.remove_config("spark-vllm:hfToken")  # `lab up` keeps secrets for later modules


@pytest.fixture(scope="module")
def ps_samples(lab: Lab) -> Iterator[ProcessLists]:
    sampler = ProcessLists()
    yield sampler
    sampler.stop()


def test_0_a_non_root_user_deploys_and_its_home_holds_the_state(lab: Lab,
                                                                ps_samples: ProcessLists) -> None:
    run_ok(lab.up())
    assert_serving(lab, lab_identities())
    OUTPUTS.append(json.dumps(lab.outputs()))
    for node in NODES:
        listing = node_sh(node, f"stat -c '%U %a %n' /home/{USER}/.spark-vllm/{STACK}/*.env")
        rows = [line.split() for line in listing.splitlines()]
        assert rows and all(r[:2] == [USER, "600"] for r in rows), listing  # 0600, aurora's
        assert node_sh(node, "ls -A /root/.spark-vllm 2>/dev/null || true").strip() == ""
    assert {c.role for c in containers(NODES)} == {r for _, r in LAYOUT}


def test_1_a_wrong_pinned_host_key_stops_the_update_before_any_command(lab: Lab) -> None:
    real = lab.get("nodes")[1]["hostKey"]
    other = config.STATE_DIR / "wrong_host_key"
    other.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    lab.set("nodes[1].hostKey", wrong, path=True)
    lab.set("env", {"NCCL_DEBUG": "INFO"})  # a change: without the check, it would restart all
    since = time.time()
    try:
        run = lab.up()
        RUNS.append(run)
    finally:
        lab.set("nodes[1].hostKey", real, path=True)
        lab.set("env", {"NCCL_DEBUG": "WARN"})
    assert run.error is not None
    node2 = cluster.find_node("node-2")
    from spark_vllm.components.hostkeys import fingerprint
    assert (f"nodes[1].hostKey: node-2 at {node2.mgmt_ip}:22 presents ssh-ed25519 "
            f"{fingerprint(real)}, not the pinned {fingerprint(wrong)}") in run.error
    assert run.seconds < 15, run.seconds
    assert [s for s in run.steps if s.op != "same"] == []  # no step of any resource started
    assert docker_events(NODES, since, time.time()) == []  # nothing ran on any node
    print(f"wrong host key refused in {run.seconds:.1f} s")


def _cli_up(log: Path) -> subprocess.Popen[str]:
    """`pulumi up` as a user runs it in a terminal: its own process group (Ctrl-C = SIGINT to
    the group: CLI, language host, program and providers)."""
    return subprocess.Popen(["pulumi", "up", "--yes", "--skip-preview", "--stack", STACK],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO,
                            env={**os.environ, **engine_env()}, start_new_session=True)


def _wait_for(log: Path, text: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < end, f"{text!r} never appeared:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def test_2_a_second_up_on_the_same_stack_is_refused_and_the_first_finishes(lab: Lab) -> None:
    lab.set("env", {"NCCL_DEBUG": "INFO"})
    log = LOG_DIR / "first-up.log"
    first = _cli_up(log)
    _wait_for(log, "ray-head")  # the first holds the stack's lock and is changing it
    second = lab.up()
    RUNS.append(second)
    assert second.error is not None and "locked" in second.error, second.error
    assert second.seconds < 15
    assert first.wait(timeout=300) == 0, log.read_text()[-3000:]
    by_role()  # one container per role, all running
    assert_serving(lab, lab_identities())
    assert pending(lab) == []


# (node, the command's resource name, its container's role, what runs once it is interrupted)
CTRL_C_AT = {
    "vllm-load": ("node-1", "vllm-serve", "vllm", {"ray-head", "ray-worker"}),
    "worker-join": ("node-2", "ray-worker-node-2", "ray-worker", {"ray-head"}),
}


def _interrupted_up(lab: Lab, at: str, times: int, debug: str) -> tuple[Path, float]:
    """`pulumi up` of an env change, Ctrl-C'd `times` times once `at`'s command is running;
    returns the CLI's log and the seconds from the last Ctrl-C to its exit."""
    _, command, _, _ = CTRL_C_AT[at]
    # a vLLM load long enough to be Ctrl-C'd in; a worker's join needs no longer one (its
    # rerun's vLLM start would only wait out the 12 s)
    lab.set("env", {"NCCL_DEBUG": debug,
                    **({"VLLM_SIM_LOAD_SECONDS": "12"} if at == "vllm-load" else {})})
    log = LOG_DIR / f"ctrl-c-{times}-{at}.log"
    up = _cli_up(log)
    _wait_for(log, f"{command} creating")
    if at == "vllm-load":
        time.sleep(1)  # well into the load
    for i in range(times):
        os.killpg(up.pid, signal.SIGINT)
        if i + 1 < times:
            time.sleep(0.5)
    t0 = time.monotonic()
    up.wait(timeout=300)
    return log, time.monotonic() - t0


@pytest.mark.parametrize("at", CTRL_C_AT)
def test_3a_ctrl_c_once_lets_the_step_in_flight_finish(lab: Lab, at: str) -> None:
    """One Ctrl-C while vLLM loads, or while a worker joins: Pulumi starts nothing new and
    waits for the command in flight (it is not cancellable); nothing pending, nothing
    half-done; the next `up` finishes the plan."""
    log, took = _interrupted_up(lab, at, 1, "WARN" if at == "vllm-load" else "INFO")
    text = log.read_text()
    assert "update canceled" in text, text[-2000:]
    assert pending(lab) == []
    roles = {c.role for c in containers(NODES)}
    assert all(c.running for c in containers(NODES))
    _, _, role, before_it = CTRL_C_AT[at]
    assert roles == before_it | {role}  # the command in flight finished, nothing after it ran
    run_ok(lab.up())
    by_role()
    assert_serving(lab, lab_identities())
    print(f"Ctrl-C once at {at}: pulumi exited {took:.1f} s later (the step in flight finished)")


@pytest.mark.parametrize("at", CTRL_C_AT)
def test_3b_ctrl_c_twice_leaves_nothing_half_done_on_the_node(lab: Lab, at: str) -> None:
    node, command, role, left_running = CTRL_C_AT[at]
    log, took = _interrupted_up(lab, at, 2, "WARN" if at == "vllm-load" else "INFO")
    assert took < 5 and "terminating" in log.read_text()
    assert pending(lab) == [f"creating:{command}"]
    # the interrupted command, still running on its node, notices that its session is gone (at
    # its next write: ≤ 10 s) and removes its container and its probe
    t0 = time.monotonic()
    name = f"spark-vllm-{STACK}-{role}"
    # the start script's log prefix, as a pattern this check's own command line cannot match
    script = f"\\[spark-vllm\\] \\$node: {role}:"
    while True:
        left = node_sh(node, f"docker ps -aq --filter name={name}; "
                             f"ps -eo args | grep -c '{script}' || true")
        ids, scripts = left.split()[:-1], left.split()[-1]
        if not ids and scripts == "0":
            break
        assert time.monotonic() - t0 < 25, left
        time.sleep(0.5)
    cleaned = time.monotonic() - t0
    assert {c.role for c in containers(NODES)} == left_running
    # the next run warns about the pending operation and finishes the job
    rerun = run_ok(lab.up())
    assert any("pending operations" in line for line in rerun.output)
    by_role()
    assert_serving(lab, lab_identities())
    # the documented way to clear the warning (README): it changes nothing else
    subprocess.run(["pulumi", "refresh", "--clear-pending-creates", "--yes", "--skip-preview",
                    "--stack", STACK], cwd=REPO, env={**os.environ, **engine_env()}, check=True,
                   capture_output=True, timeout=120)
    assert pending(lab) == []
    assert run_ok(lab.up()).changed() == {}
    print(f"Ctrl-C twice at {at}: pulumi gone in {took:.1f} s, {node} clean {cleaned:.1f} s later")


def test_4_a_node_cut_off_mid_up_is_named_within_the_dial_bound(lab: Lab) -> None:
    lab.set("env", {"NCCL_DEBUG": "WARN"})
    log = LOG_DIR / "node-cut.log"
    node2 = cluster.find_node("node-2")
    up = _cli_up(log)
    try:
        _wait_for(log, "ray-head creating replacement")
        cluster.power_off(["node-2"], hard=True)
        t0 = time.monotonic()
        rc = up.wait(timeout=300)
        took = time.monotonic() - t0
    finally:
        cluster.power_on(["node-2"])
    text = log.read_text()
    assert rc != 0
    assert f"dial tcp {node2.mgmt_ip}:22" in text and "ray-worker-node-2" in text, text[-3000:]
    # 4 dials of at most sshDialTimeout (3 s in the tests; node.py), not TCP's minutes
    assert took < SSH_DIALS * TEST_DIAL_TIMEOUT_S + 15, took
    # the node is back (stopped containers, as after a power cut): one up converges
    run = run_ok(lab.up(refresh=True))
    assert run.error is None
    by_role()
    assert_serving(lab, lab_identities())
    print(f"node-2 cut mid-up: named {took:.1f} s after the cut")


def test_5_after_up_change_destroy_no_secret_is_anywhere(lab: Lab,
                                                         ps_samples: ProcessLists) -> None:
    destroyed = run_ok(lab.destroy())
    samples = ps_samples.stop()
    key_lines = [ln for ln in keys.client_key().read_text().splitlines()
                 if ln and not ln.startswith("-----")]
    secrets = {"apiKey": [API_KEY], "hfToken": [HF_TOKEN], "sshPrivateKey": key_lines}
    places: dict[str, str] = {}
    state_dir = config.STATE_DIR / "state"
    for f in state_dir.rglob("*"):
        if f.is_file():
            places[f"state file {f.relative_to(state_dir)}"] = f.read_bytes().decode(
                errors="replace")
    for i, run in enumerate(RUNS + [destroyed]):
        places[f"run {i} output"] = "\n".join(run.output) + (run.error or "")
        places[f"run {i} events"] = "\n".join(run.events)
    places["stack outputs"] = "\n".join(OUTPUTS)
    for f in LOG_DIR.glob("*.log"):  # the CLI's own text output, and Automation's
        places[f"log {f.name}"] = f.read_text(errors="replace")
    for node, text in samples.items():
        places[f"{node} process lists"] = text
    for node in NODES:
        places[f"{node} files"] = node_sh(
            node, "grep -rIlF -e " + " -e ".join(
                f"'{v}'" for v in (API_KEY, HF_TOKEN, key_lines[1]))
            + " /home /root /tmp /etc /var/lib/docker/containers 2>/dev/null || true")
        assert node_sh(node, f"ls -A /home/{USER}/.spark-vllm/{STACK} 2>/dev/null || true"
                       ).strip() == ""  # env-files gone
    assert len(RUNS) >= 7 and OUTPUTS and sum(len(s) for s in samples.values()) > 100_000
    found = [(name, where) for name, values in secrets.items() for where, text in places.items()
             for v in values if v in text]
    assert found == [], found


def test_6_a_node_gone_for_good_is_named_and_the_rest_torn_down(lab: Lab) -> None:
    run_ok(lab.up())
    node2 = cluster.find_node("node-2")
    cluster.power_off(["node-2"], hard=True)
    try:
        failed = lab.destroy()
        assert failed.error is not None
        assert "ray-worker-node-2" in failed.error and f"{node2.mgmt_ip}:22" in failed.error
        assert failed.seconds < SSH_DIALS * TEST_DIAL_TIMEOUT_S + 20, failed.seconds
        tear = subprocess.run([sys.executable, "-m", "spark_vllm.teardown", "--stack", STACK,
                               "--node-gone", "node-2"], capture_output=True, text=True,
                              cwd=REPO, env={**os.environ, **engine_env()}, timeout=300)
        assert tear.returncode == 0, tear.stdout[-3000:] + tear.stderr[-3000:]
        assert "forgetting ray-worker-node-2" in tear.stdout
        assert lab.state_resources() == []
        assert node_sh("node-1", f"docker ps -aq --filter label=spark-vllm.stack={STACK}") == ""
        assert node_sh("node-1", f"ls -A /home/{USER}/.spark-vllm/{STACK} 2>/dev/null || true"
                       ).strip() == ""
    finally:
        cluster.power_on(["node-2"])
    print(f"destroy with node-2 gone: named after {failed.seconds:.1f} s")
