"""The state the provider under test writes for a remote Command, held to the state the official
pulumi-resource-command 1.2.1 wrote for the same resource (recorded: tests/fixtures/engine/).

A stack is moved between the stand-in and the official provider whenever a lab stack meets an
operator's engine, or a PR preview runs where the other one is installed. If the two write the
state differently, every remote Command shows `[diff: ~connection]` under the other (an in-place
update of each: nothing restarts, but every preview of a moved stack lies about what changes).
The official provider writes `connection` as a secret with `privateKey` a secret of its own
inside it (its schema marks the key secret; pulumi-go-provider v1.3.0 infer/apply_secrets.go).

Recording (with the official provider at hand):

    SPARK_VLLM_CONFORMANCE_COMMAND_PROVIDER=/path/to/official/pulumi-resource-command \\
    SPARK_VLLM_RECORD_COMMAND_STATE="what it is (version, how it was obtained)" \\
        .venv/bin/python -m pytest tests/engine/test_command_state.py
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pytest

from tests.engine.conftest import REPO, Engine, Sshd
from tests.engine.stacks import Stack

pytestmark = pytest.mark.integration

FIXTURE = REPO / "tests" / "fixtures" / "engine" / "command-1.2.1-remote-state.json"
SIG = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
STDIN = "stdin-of-the-state-test"


def program(sshd: Sshd) -> None:
    """One remote Command made as the program makes them (components/node.py): a secret key and
    a pinned host key in the connection, create/update/delete, a secret stdin, triggers."""
    command.remote.Command(
        "state",
        connection=command.remote.ConnectionArgs(
            host="127.0.0.1", port=sshd.port, user=sshd.user,
            private_key=pulumi.Output.secret(sshd.client_key), host_key=sshd.host_key,
            dial_error_limit=4, per_dial_timeout=20),
        create="echo made; echo note >&2", update="echo updated", delete="true",
        stdin=pulumi.Output.secret(STDIN), triggers=["a", 1],
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(delete_before_replace=True, replace_on_changes=["triggers"]))


def placeholders(sshd: Sshd, rid: str) -> dict[Any, str]:
    """What differs between two runs, and its name in the fixture."""
    names: dict[Any, str] = {sshd.client_key: "<privateKey>", sshd.host_key: "<hostKey>", sshd.port: "<port>",
            sshd.user: "<user>", rid: "<id>"}
    return names


def shape(v: Any, names: dict[Any, Any]) -> Any:
    """A value of `pulumi stack export --show-secrets` as data to compare: a secret becomes
    {"<secret>": its value} (its plaintext is JSON, itself holding any nested secret), run-
    dependent values their placeholders."""
    if isinstance(v, dict) and v.get(SIG) == SECRET_SIG:
        return {"<secret>": shape(json.loads(v["plaintext"]), names)}
    if isinstance(v, dict):
        return {k: shape(e, names) for k, e in sorted(v.items())}
    if isinstance(v, list):
        return [shape(e, names) for e in v]
    if isinstance(v, str | int) and not isinstance(v, bool) and v in names:
        return names[v]
    return v


def unshape(v: Any, values: dict[Any, Any]) -> Any:
    """The inverse of shape, for `pulumi stack import`: secrets as plaintext (the CLI encrypts
    them), placeholders as this run's values."""
    if isinstance(v, dict) and set(v) == {"<secret>"}:
        return {SIG: SECRET_SIG, "plaintext": json.dumps(unshape(v["<secret>"], values))}
    if isinstance(v, dict):
        return {k: unshape(e, values) for k, e in v.items()}
    if isinstance(v, list):
        return [unshape(e, values) for e in v]
    if isinstance(v, str) and v in values:
        return values[v]
    return v


def export(st: Stack) -> dict[str, Any]:
    r = subprocess.run([str(Path(st.engine.pulumi_root, "bin", "pulumi")), "stack", "export",
                        "--show-secrets", "--stack", st.stack.name],
                       cwd=st.stack.workspace.work_dir, env=st.env, capture_output=True,
                       text=True, timeout=60, check=True)
    exported: dict[str, Any] = json.loads(r.stdout)
    return exported


def the_resource(deployment: dict[str, Any]) -> dict[str, Any]:
    found = [r for r in deployment["resources"] if r["urn"].endswith("::state")]
    assert len(found) == 1, [r["urn"] for r in deployment["resources"]]
    return found[0]


def test_the_state_is_the_real_providers_and_a_moved_stack_plans_nothing(
        engine: Engine, sshd: Sshd) -> None:
    st = Stack(engine, "state", lambda: program(sshd))
    try:
        r = st.up()
        assert r.error is None, r.error
        exported = export(st)
        res = the_resource(exported["deployment"])
        names = placeholders(sshd, res["id"])
        written = {k: shape(res[k], names) for k in ("type", "inputs", "outputs")}
        recording = os.environ.get("SPARK_VLLM_RECORD_COMMAND_STATE")
        if recording:
            FIXTURE.parent.mkdir(parents=True, exist_ok=True)
            FIXTURE.write_text(json.dumps({
                "recorded": datetime.date.today().isoformat(), "provider": recording,
                "program": "tests/engine/test_command_state.py program()",
                "resource": written}, indent=2) + "\n")
        official = json.loads(FIXTURE.read_text())["resource"]
        # the key a secret of its own inside the secret connection, in inputs and outputs alike
        for where in ("inputs", "outputs"):
            conn = official[where]["connection"]["<secret>"]
            assert conn["privateKey"] == {"<secret>": "<privateKey>"}, conn
        assert written == official

        # the state the official provider wrote, put in this stack's place: nothing to do
        values = {name: value for value, name in names.items()}
        res.update({k: unshape(official[k], values) for k in ("inputs", "outputs")})
        res["id"] = values["<id>"]
        imported = st.engine.tmp / "moved.json"
        imported.write_text(json.dumps(exported))
        subprocess.run([str(Path(st.engine.pulumi_root, "bin", "pulumi")), "stack", "import",
                        "--file", str(imported), "--stack", st.stack.name],
                       cwd=st.stack.workspace.work_dir, env=st.env, capture_output=True,
                       text=True, timeout=60, check=True)
        preview = st.preview()
        assert preview.error is None, preview.error
        assert preview.changed() == [], preview.ops
    finally:
        st.destroy()
        st.remove()
