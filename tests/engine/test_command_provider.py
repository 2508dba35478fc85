"""The pulumi-resource-command under test (the lab's stand-in, lab/engine/command_provider, unless
SPARK_VLLM_CONFORMANCE_COMMAND_PROVIDER names another: tests/engine/conftest.py) under the REAL
Pulumi CLI (lab/tools.sh, via `source lab/env.sh`), driving `command:remote:Command` from the
real pulumi_command 1.2.1 SDK against a private sshd on loopback.

Automation API inline programs (no language host needed), a temp file backend and a temp
PULUMI_HOME whose plugin cache holds the provider under test, with ambient plugins ignored, so
it is what runs even if a PATH holds another one; one test launches it from PATH instead.

The commands run on this machine (the sshd is local), so they record what ran in a file."""

from __future__ import annotations

import json
import os
from typing import Any

import pulumi
import pulumi_command as command
import pytest

from tests.engine.conftest import Engine, Sshd, free_port, keygen
from tests.engine.stacks import Stack, conn, ops_log

pytestmark = pytest.mark.integration

SECRET_STDIN = "stdin-s3cret-" + os.urandom(4).hex()


# --- scenarios -------------------------------------------------------------------------------------
def test_lifecycle(engine: Engine, sshd: Sshd) -> None:
    """create -> no-op -> create changed (in-place update, old delete not run) -> connection
    changed (update on the new connection) -> triggers changed with delete_before_replace (the
    OLD delete string runs, then create) -> destroy (delete runs)."""
    log = ops_log(engine, "lifecycle")
    spec: dict[str, Any] = {"v": "1", "dv": "1", "trigger": "a", "host": "127.0.0.1"}

    def program() -> None:
        c = command.remote.Command(
            "c1", connection=conn(sshd, host=spec["host"]),
            create=(f"echo create-v{spec['v']} >> {log}; echo out-v{spec['v']}; "
                    f"echo err-v{spec['v']} >&2; echo \"prev=$PULUMI_COMMAND_STDOUT\" >> {log}"),
            delete=f"echo delete-v{spec['dv']} \"prev=$PULUMI_COMMAND_STDOUT\" >> {log}",
            triggers=[spec["trigger"]],
            opts=pulumi.ResourceOptions(delete_before_replace=True,
                                        replace_on_changes=["triggers"]))
        pulumi.export("stdout", c.stdout)
        pulumi.export("stderr", c.stderr)
        pulumi.export("id", c.id)

    st = Stack(engine, "lifecycle", program)
    try:
        r = st.up()
        assert r.error is None, r.error
        assert ("create", "c1") in r.ops
        assert r.outputs["stdout"] == "out-v1" and r.outputs["stderr"] == "err-v1"
        rid = r.outputs["id"]
        assert rid.startswith("c1") and len(rid) == 10 and int(rid[2:], 16) >= 0
        assert "out-v1" in r.lines() and "err-v1" in r.lines()  # streamed as status lines
        assert log.read_text().splitlines() == ["create-v1", "prev="]

        r = st.up()  # no change: nothing runs
        assert r.error is None, r.error
        assert r.changed() == [], r.ops
        assert log.read_text().splitlines() == ["create-v1", "prev="]

        r = st.refresh()  # Read returns the stored state: nothing changes, nothing runs
        assert r.error is None, r.error
        assert st.resource("c1")["outputs"]["stdout"] == "out-v1"
        assert st.up().changed() == []
        assert log.read_text().splitlines() == ["create-v1", "prev="]

        spec.update(v="2", dv="2")  # create + delete changed: in-place update, create runs again
        r = st.up()
        assert r.error is None, r.error
        assert ("update", "c1") in r.ops and not any(op == "delete" for op, _ in r.ops)
        assert r.outputs["id"] == rid and r.outputs["stdout"] == "out-v2"
        assert log.read_text().splitlines()[2:] == ["create-v2", "prev=out-v1"]

        spec.update(host="localhost")  # new connection: in-place update on the new host
        r = st.up()
        assert r.error is None, r.error
        assert ("update", "c1") in r.ops and r.outputs["id"] == rid
        assert log.read_text().splitlines()[4:] == ["create-v2", "prev=out-v2"]

        spec.update(v="3", dv="3", trigger="b")  # replace, delete first with the OLD delete
        r = st.up()
        assert r.error is None, r.error
        assert [op for op, n in r.ops if n == "c1"] == ["delete-replaced", "replace",
                                                        "create-replacement"], r.ops
        assert r.outputs["id"] != rid
        assert log.read_text().splitlines()[6:] == ["delete-v2 prev=out-v2", "create-v3",
                                                    "prev="]

        r = st.destroy()
        assert r.error is None, r.error
        assert log.read_text().splitlines()[9:] == ["delete-v3 prev=out-v3"]
    finally:
        st.remove()


def test_update_runs_update_keeps_the_id_and_stores_the_new_key_for_delete(
        engine: Engine, sshd: Sshd) -> None:
    """With `update` set and replace_on_changes on triggers only (components/node.py): a new
    private key and new script text are an in-place update that runs `update` (not `create`)
    on the new connection; stdout becomes the update's; the id stays, so a dependent whose
    triggers hold it is kept, while one holding stdout is replaced because a preview of an
    update makes stdout unknown (pulumi-command v1.2.1 remote/commandController.go Update with
    pulumi-go-provider v1.3.0 infer's default dependency wiring: every output depends on
    every input, and a changed input makes it computed in a preview). After the old key is
    removed from authorized_keys, the replacement's delete runs with the stored, new key."""
    log = ops_log(engine, "update")
    keygen(sshd.dir / "rotated")
    rotated = (sshd.dir / "rotated").read_text()
    spec: dict[str, Any] = {"key": sshd.client_key, "v": "1", "trigger": "a"}
    opts = pulumi.ResourceOptions(delete_before_replace=True, replace_on_changes=["triggers"])

    def connect(key: str) -> Any:
        return command.remote.ConnectionArgs(host="127.0.0.1", port=sshd.port, user=sshd.user,
                                             private_key=pulumi.Output.secret(key))

    def program() -> None:
        conn = connect(spec["key"])
        c = command.remote.Command(
            "u1", connection=conn, triggers=[spec["trigger"]], opts=opts,
            create=f"echo create-v{spec['v']} >> {log}; echo made",
            update=f"echo update-v{spec['v']} >> {log}; echo kept",
            delete=f"echo delete-v{spec['v']} >> {log}")
        # the dependents' own connection never changes
        command.remote.Command("by-id", connection=connect(rotated), triggers=[c.id],
                               opts=opts, create=f"echo by-id >> {log}")
        command.remote.Command("by-stdout", connection=connect(rotated), triggers=[c.stdout],
                               opts=opts,
                               create=f"echo by-stdout-$(date +%N) >> {log}")
        pulumi.export("stdout", c.stdout)
        pulumi.export("id", c.id)

    (sshd.dir / "authorized_keys").write_text(
        (sshd.dir / "client.pub").read_text() + (sshd.dir / "rotated.pub").read_text())
    st = Stack(engine, "update", program)
    try:
        r = st.up()
        assert r.error is None, r.error
        rid = r.outputs["id"]
        spec.update(key=rotated, v="2")
        r = st.preview()
        assert r.error is None, r.error
        assert ("update", "u1") in r.ops and ("same", "by-id") in r.ops, r.ops
        assert ("replace", "by-stdout") in r.ops, r.ops  # stdout unknown in the update's preview
        r = st.up()
        assert r.error is None, r.error
        assert r.outputs == {"stdout": "kept", "id": rid}
        assert ("same", "by-id") in r.ops, r.ops
        lines = log.read_text().splitlines()
        assert lines[0] == "create-v1" and lines.count("by-id") == 1, lines  # kept
        assert "update-v2" in lines and "create-v2" not in lines, lines
        # the old key revoked: a replacement deletes with the key the update stored
        (sshd.dir / "authorized_keys").write_text((sshd.dir / "rotated.pub").read_text())
        spec.update(v="3", trigger="b")
        r = st.up()
        assert r.error is None, r.error
        assert [op for op, n in r.ops if n == "u1"] == ["delete-replaced", "replace",
                                                        "create-replacement"], r.ops
        lines = log.read_text().splitlines()
        assert lines.index("delete-v2") < lines.index("create-v3"), lines
        r = st.destroy()
        assert r.error is None, r.error
    finally:
        (sshd.dir / "authorized_keys").write_text((sshd.dir / "client.pub").read_text())
        st.remove()


def test_triggers_replace_by_default(engine: Engine, sshd: Sshd) -> None:
    """No resource options: a `triggers` change alone is a replace (provider + the SDK's own
    replace_on_changes), create-before-delete, and the replaced one runs its stored delete."""
    log = ops_log(engine, "triggers")
    spec = {"t": "a"}

    def program() -> None:
        command.remote.Command("t1", connection=conn(sshd),
                               create=f"echo create-{spec['t']} >> {log}",
                               delete=f"echo delete-{spec['t']} >> {log}",
                               triggers=[spec["t"], 1])

    st = Stack(engine, "triggers", program)
    try:
        assert st.up().error is None
        spec["t"] = "b"
        r = st.up()
        assert r.error is None, r.error
        assert [op for op, n in r.ops if n == "t1"] == ["create-replacement", "replace",
                                                        "delete-replaced"], r.ops
        assert log.read_text().splitlines() == ["create-a", "create-b", "delete-a"]
    finally:
        st.destroy()
        st.remove()


def test_preview_runs_nothing(engine: Engine, sshd: Sshd) -> None:
    log = ops_log(engine, "preview")
    spec = {"v": "1"}

    def program() -> None:
        c = command.remote.Command("p1", connection=conn(sshd),
                                   create=f"echo create-{spec['v']} >> {log}; echo hi")
        pulumi.export("stdout", c.stdout)

    st = Stack(engine, "preview", program)
    try:
        r = st.preview()
        assert r.error is None, r.error
        assert ("create", "p1") in r.ops
        assert log.read_text() == ""
        assert st.up().error is None
        spec["v"] = "2"
        r = st.preview()
        assert r.error is None and ("update", "p1") in r.ops
        assert log.read_text().splitlines() == ["create-1"]
    finally:
        st.destroy()
        st.remove()


def test_refresh_returns_the_stored_state(engine: Engine, sshd: Sshd) -> None:
    """A Command has no remote state to read: refresh keeps the state as the last run left it
    (stdout and stderr byte for byte, the command not run again), even when what the command
    made on the host is gone since — which is why the program adds its own liveness resources."""
    log = ops_log(engine, "refresh")
    made = engine.tmp / "refresh.made"

    def program() -> None:
        c = command.remote.Command("r1", connection=conn(sshd),
                                   create=f"echo ran >> {log}; touch {made}; echo out-$$; "
                                          "echo err-line >&2")
        pulumi.export("stdout", c.stdout)

    st = Stack(engine, "refresh", program)
    try:
        assert st.up().error is None
        before = st.resource("r1")
        made.unlink()  # the host changed behind the state's back
        r = st.refresh()
        assert r.error is None, r.error
        after = st.resource("r1")
        assert after["outputs"]["stdout"] == before["outputs"]["stdout"]
        assert after["outputs"]["stderr"] == before["outputs"]["stderr"] == "err-line"
        assert after["id"] == before["id"]
        assert log.read_text().splitlines() == ["ran"]  # refresh ran nothing on the host
        preview = st.preview()
        assert preview.error is None and preview.changed() == [], preview.ops
    finally:
        st.destroy()
        st.remove()


def test_stdin_and_secrets(engine: Engine, sshd: Sshd) -> None:
    """stdin reaches the command; connection (always) and a secret stdin are encrypted in the
    state; stdout is not secret; environment arrives (sshd AcceptEnv SVL_*)."""
    out = engine.tmp / "stdin.out"

    def program() -> None:
        c = command.remote.Command(
            "s1", connection=conn(sshd),
            create=f"cat > {out}; echo \"env=$SVL_GREETING\"",
            stdin=pulumi.Output.secret(SECRET_STDIN),
            environment={"SVL_GREETING": "hello world\nline2"})
        pulumi.export("stdout", c.stdout)
        pulumi.export("stdin", c.stdin)

    st = Stack(engine, "secrets", program)
    try:
        r = st.up()
        assert r.error is None, r.error
        assert out.read_text() == SECRET_STDIN
        assert r.outputs["stdout"] == "env=hello world\nline2"
        assert SECRET_STDIN not in "\n".join(r.lines())
        stack = st.stack.outputs()
        assert stack["stdin"].secret and not stack["stdout"].secret
        res = st.resource("s1")
        for where in ("inputs", "outputs"):
            for k in ("connection", "stdin"):
                v = res[where][k]
                assert isinstance(v, dict) and "ciphertext" in v, (where, k, v)
        blob = json.dumps(st.export())
        assert SECRET_STDIN not in blob and "PRIVATE KEY" not in blob
    finally:
        st.destroy()
        st.remove()


def test_host_key_pinning(engine: Engine, sshd: Sshd) -> None:
    spec = {"key": sshd.host_key}

    def program() -> None:
        c = command.remote.Command("h1", connection=conn(sshd, host_key=spec["key"],
                                                          dial_error_limit=1),
                                   create="echo pinned")
        pulumi.export("stdout", c.stdout)

    st = Stack(engine, "hostkey", program)
    try:
        r = st.up()
        assert r.error is None, r.error
        assert r.outputs["stdout"] == "pinned"
        st.destroy()
        spec["key"] = sshd.other_key
        r = st.up()
        assert r.error is not None
        assert "after 1 failed attempts: ssh: handshake failed: ssh: host key mismatch" in r.error
        assert any("Dial 1/1 failed: retrying" in m for m in r.lines())
    finally:
        st.destroy()
        st.remove()


def test_failing_command_fails_with_its_output(engine: Engine, sshd: Sshd) -> None:
    def program() -> None:
        command.remote.Command("f1", connection=conn(sshd),
                               create="echo partial-out; echo boom >&2; exit 3")

    st = Stack(engine, "failing", program)
    try:
        r = st.up()
        assert r.error is not None
        assert ('Process exited with status 3: running "echo partial-out; echo boom >&2; '
                'exit 3"') in r.error
        assert "partial-out" in r.error and "boom" in r.error
        assert all(not x["urn"].endswith("::f1") for x in st.export().get("resources", []))
    finally:
        st.destroy()
        st.remove()


def test_unreachable_host_fails_after_dial_error_limit(engine: Engine, sshd: Sshd) -> None:
    port = free_port()  # nothing listens there

    def program() -> None:
        command.remote.Command("u1", connection=command.remote.ConnectionArgs(
            host="127.0.0.1", port=port, private_key=pulumi.Output.secret(sshd.client_key),
            dial_error_limit=3, per_dial_timeout=2), create="echo never")

    st = Stack(engine, "unreachable", program)
    try:
        r = st.up()
        assert r.error is not None
        assert (f"after 3 failed attempts: dial tcp 127.0.0.1:{port}: connect: connection "
                "refused") in r.error
        retries = [m for m in r.lines() if "failed: retrying" in m]
        assert retries == ["Dial 1/3 failed: retrying", "Dial 2/3 failed: retrying",
                           "Dial 3/3 failed: retrying"]
        assert r.seconds < 30
    finally:
        st.destroy()
        st.remove()


def test_streams_while_running_and_logging_none(engine: Engine, sshd: Sshd) -> None:
    def program() -> None:
        command.remote.Command("l1", connection=conn(sshd),
                               create="echo first-line; sleep 2; echo second-line")
        command.remote.Command("l2", connection=conn(sshd), create="echo quiet-line",
                               logging=command.remote.Logging.NONE)

    st = Stack(engine, "streaming", program)
    try:
        r = st.up()
        assert r.error is None, r.error
        t = {m: at for at, m, _ in r.status}
        assert "first-line" in t and "second-line" in t
        assert t["second-line"] - t["first-line"] > 1.0  # not all at the end
        assert t["first-line"] < r.done_at["l1"] - 1.0
        assert all(eph for _, m, eph in r.status if m in ("first-line", "second-line"))
        assert "quiet-line" not in r.lines()
    finally:
        st.destroy()
        st.remove()


def test_found_on_path(engine: Engine, sshd: Sshd) -> None:
    """Without the plugin cache entry: the CLI takes pulumi-resource-command from PATH
    (and warns that it did)."""
    home, on_path = engine.tmp / "home-path", engine.tmp / "on-path"
    (home / "plugins").mkdir(parents=True)
    on_path.mkdir()
    (on_path / "pulumi-resource-command").symlink_to(engine.provider)
    env = dict(engine.env, PULUMI_HOME=str(home), PATH=f"{on_path}:{engine.env['PATH']}")
    env.pop("PULUMI_IGNORE_AMBIENT_PLUGINS")

    def program() -> None:
        c = command.remote.Command("w1", connection=conn(sshd), create="echo via-path")
        pulumi.export("stdout", c.stdout)

    st = Stack(engine, "onpath", program, env=env)
    try:
        r = st.up()
        assert r.error is None, r.error
        assert r.outputs["stdout"] == "via-path"
        assert any("using pulumi-resource-command from $PATH" in m for m in r.lines())
    finally:
        st.destroy()
        st.remove()


def test_local_command(engine: Engine) -> None:
    """command:local:Command, the cheap part: /bin/sh -c, stdout, environment, stdin, errors."""
    spec = {"create": "echo \"local-$SVL_L\"; cat"}

    def program() -> None:
        c = command.local.Command("loc", create=spec["create"], environment={"SVL_L": "env"},
                                  stdin="from-stdin")
        pulumi.export("stdout", c.stdout)

    st = Stack(engine, "local", program)
    try:
        r = st.up()
        assert r.error is None, r.error
        assert r.outputs["stdout"] == "local-env\nfrom-stdin"
        spec["create"] = "echo bad; exit 2"
        r = st.up()
        assert r.error is not None and 'exit status 2: running "echo bad; exit 2"' in r.error
    finally:
        st.destroy()
        st.remove()
