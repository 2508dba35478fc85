"""The stand-in pulumi-resource-command without the engine: wire values, the Diff port, Check,
the OpenSSH configuration it writes, and the plugin protocol spoken over gRPC to the binary
(launched like the engine does: `pulumi-resource-command <engine address>`, port on stdout)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lab.engine.command_provider import props, resources, server, ssh  # noqa: E402
from lab.engine.command_provider.props import COMPUTED, Secret  # noqa: E402

WRAPPER = REPO / "lab" / "engine" / "bin" / "pulumi-resource-command"


# --- wire values -----------------------------------------------------------------------------------
def test_struct_round_trip_keeps_secrets_and_unknowns() -> None:
    v = {"a": Secret({"host": "h", "port": 22}), "b": COMPUTED, "c": [1, Secret("x")], "d": "s"}
    back = props.from_struct(props.to_struct(v))
    assert back == v
    assert props.reveal(back) == {"a": {"host": "h", "port": 22}, "b": COMPUTED, "c": [1, "x"],
                                  "d": "s"}
    assert repr(Secret("pw")) == "Secret([secret])"


def test_nulls_are_absent() -> None:
    from google.protobuf import struct_pb2
    s = struct_pb2.Struct()
    s.update({"create": None, "connection": {"host": "h", "password": None}})
    assert props.from_struct(s) == {"connection": {"host": "h"}}


def test_go_quote() -> None:
    assert props.go_quote('echo "a"\n\tb\\') == '"echo \\"a\\"\\n\\tb\\\\"'
    assert props.go_quote("\x01é") == '"\\x01é"'


# --- Diff --------------------------------------------------------------------------------------------
INPUTS = resources.REMOTE_INPUTS.keys()


def _diff(old: dict[str, Any], new: dict[str, Any]) -> props.DiffResult:
    return props.diff_inputs(old, new, INPUTS, ["triggers"])


BASE = {"connection": Secret({"host": "a", "port": 22}), "create": "c1", "delete": "d1",
        "triggers": ["t1"], "addPreviousOutputInEnv": True}
STATE = {**BASE, "stdout": "out", "stderr": ""}


def test_no_change_ignores_outputs() -> None:
    d = _diff(STATE, dict(BASE))
    assert not d.changed and d.detailed == {}


def test_create_connection_environment_are_updates() -> None:
    d = _diff(STATE, {**BASE, "create": "c2", "connection": Secret({"host": "b", "port": 22}),
                      "environment": {"K": "v"}})
    assert d.changed and d.replaces == []
    assert d.detailed == {"create": ("UPDATE", False), "connection": ("UPDATE", False),
                          "environment": ("ADD", False)}


def test_triggers_replace_at_top_level_elements_left_to_the_sdk() -> None:
    d = _diff(STATE, {**BASE, "triggers": ["t2"]})
    assert d.detailed == {"triggers[0]": ("UPDATE", False)}  # SDK: replace_on_changes triggers[*]
    d = _diff({k: v for k, v in STATE.items() if k != "triggers"}, dict(BASE))
    assert d.detailed == {"triggers": ("ADD", True)} and d.replaces == ["triggers"]
    d = _diff(STATE, {k: v for k, v in BASE.items() if k != "triggers"})
    assert d.detailed == {"triggers": ("DELETE", True)}


def test_nested_paths_and_ignore_changes() -> None:
    d = _diff({**STATE, "environment": {"A": "1", "odd key": "x"}},
              {**BASE, "environment": {"A": "2", "odd key": "y"}})
    assert d.detailed == {"environment.A": ("UPDATE", False),
                          'environment["odd key"]': ("UPDATE", False)}
    d = props.diff_inputs(STATE, {**BASE, "create": "c2"}, INPUTS, ["triggers"], ["create"])
    assert not d.changed


# --- Check --------------------------------------------------------------------------------------------
def test_check_fills_defaults_inside_the_secret_connection() -> None:
    r = resources.RemoteCommand()
    inputs, failures = r.check({"connection": Secret({"host": "h"}), "create": "x"})
    assert failures == []
    assert inputs["connection"] == Secret({"host": "h", "port": 22, "user": "root",
                                           "dialErrorLimit": 10, "perDialTimeout": 15})
    assert inputs["addPreviousOutputInEnv"] is True


def test_check_makes_the_schemas_secret_fields_secret_where_they_stand() -> None:
    """infer's applySecrets (pulumi-go-provider v1.3.0): the key, the passwords and the
    connection itself are secrets, the proxy's too, whether the program passed them as secrets
    or not, even when Check fails; nothing else is."""
    r = resources.RemoteCommand()
    conn = {"host": "h", "privateKey": "K", "password": Secret("P"),
            "proxy": {"host": "b", "privateKeyPassword": "Q"}}
    inputs, failures = r.check({"connection": conn, "create": "x", "stdin": "s"})
    assert failures == []
    assert isinstance(inputs["connection"], Secret)
    c = inputs["connection"].value
    assert c["privateKey"] == Secret("K") and c["password"] == Secret("P")
    assert c["proxy"]["privateKeyPassword"] == Secret("Q")
    assert not isinstance(c["proxy"], Secret) and c["host"] == "h" and c["port"] == 22
    assert inputs["create"] == "x" and inputs["stdin"] == "s"
    failed, failures = r.check({"connection": {"host": "h", "privateKey": "K"}, "bogus": 1})
    assert failures and failed["connection"] == Secret({"host": "h", "privateKey": Secret("K")})
    assert failed["bogus"] == 1


def test_check_failures() -> None:
    r = resources.RemoteCommand()
    _, failures = r.check({"create": "x", "bogus": 1})
    assert {(f.property, f.reason) for f in failures} == {
        ("bogus", "Unrecognized field 'bogus' on 'remote.CommandInputs'"),
        ("connection", "Missing required field 'connection' on 'remote.CommandInputs'")}
    _, failures = r.check({"connection": Secret({"port": "22"}), "logging": "loud"})
    reasons = sorted(f.reason for f in failures)
    assert any("must be one of stdout" in x for x in reasons)
    assert any("'remote.CommandInputs.connection.port': expected number" in x for x in reasons)
    assert any("Missing required field 'host'" in x for x in reasons)
    assert all(f.property in ("connection", "logging") for f in failures)  # never nested paths


def test_create_preview_and_update_preview_run_nothing() -> None:
    r = resources.RemoteCommand()
    ctx = resources.Context(log_status=lambda m: None, cancelled=__import__("threading").Event())
    rid, out = r.create("web", {"connection": Secret({"host": "h"}), "create": "x"}, True, ctx)
    assert rid.startswith("web") and len(rid) == 11 and out["stdout"] is COMPUTED
    new = r.update(STATE, {**BASE, "create": "c2"}, True, ctx)
    assert new["stdout"] is COMPUTED and new["connection"] == BASE["connection"]
    rid, out = r.create("web", {"connection": Secret({"host": "h"})}, False, ctx)
    assert out["stdout"] == "" and out["stderr"] == ""  # no create: nothing to run


# --- OpenSSH config ------------------------------------------------------------------------------------
def _keypair(tmp: Path) -> tuple[str, str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "k")],
                   check=True)
    return (tmp / "k").read_text(), " ".join((tmp / "k.pub").read_text().split()[:2])


def test_prepare_writes_private_files_and_keeps_secrets_off_argv(tmp_path: Path) -> None:
    key, pub = _keypair(tmp_path)
    conn = ssh.parse_connection({"host": "10.0.0.5", "port": 2222.0, "user": "ops",
                                 "privateKey": key, "hostKey": pub + " comment",
                                 "perDialTimeout": 7})
    wd = ssh._Workdir()
    try:
        setup = ssh.prepare(conn, "docker ps", {"SVL_A": "x\ny", "HOME": "/h"}, wd)
        assert stat.S_IMODE(wd.path.stat().st_mode) == 0o700
        cfg = (wd.path / "ssh_config").read_text()
        idf = wd.path / f"id-{ssh.TARGET_ALIAS}"
        assert stat.S_IMODE(idf.stat().st_mode) == 0o600 and idf.read_text() == key
        for line in ('HostName "10.0.0.5"', "Port 2222", 'User "ops"', "ConnectTimeout 7",
                     "StrictHostKeyChecking yes", "HostKeyAlgorithms ssh-ed25519",
                     "PasswordAuthentication no", "BatchMode yes", "SendEnv SVL_A",
                     'SetEnv HOME="/h"', "GlobalKnownHostsFile /dev/null"):
            assert line in cfg, line
        kh = (wd.path / f"known_hosts-{ssh.TARGET_ALIAS}").read_text()
        assert kh == f"{ssh.TARGET_ALIAS} {pub}\n"
        assert setup.argv[-3:] == ["--", ssh.TARGET_ALIAS, "docker ps"]
        assert key not in " ".join(setup.argv) and "PRIVATE" not in " ".join(setup.argv)
        assert setup.env["SVL_A"] == "x\ny" and "HOME" in setup.env
        assert setup.env["HOME"] == os.environ.get("HOME")  # ssh's own HOME untouched
    finally:
        wd.remove()
    assert not wd.path.exists()


def test_prepare_without_host_key_accepts_any(tmp_path: Path) -> None:
    conn = ssh.parse_connection({"host": "h", "privateKey": _keypair(tmp_path)[0]})
    wd = ssh._Workdir()
    try:
        cfg_text = (ssh.prepare(conn, "", {}, wd).argv, (wd.path / "ssh_config").read_text())
        assert cfg_text[0][-1] == " "  # empty command: still a command, not a shell on stdin
        assert "StrictHostKeyChecking no" in cfg_text[1]
        assert "UserKnownHostsFile /dev/null" in cfg_text[1]
    finally:
        wd.remove()


def _prepare(conn: dict[str, Any]) -> None:
    wd = ssh._Workdir()
    try:
        ssh.prepare(ssh.parse_connection(conn), "x", {}, wd)
    finally:
        wd.remove()


def test_bad_key_and_host_key_fail_without_dialing(tmp_path: Path) -> None:
    with pytest.raises(ssh.InputError, match="ssh: no key found"):
        _prepare({"host": "h", "privateKey": "garbage"})
    with pytest.raises(ssh.InputError, match=r"ssh: no key found \(connection.hostKey\)"):
        _prepare({"host": "h", "hostKey": "ssh-ed25519 bm9wZQ=="})
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pw", "-f", str(tmp_path / "e")],
                   check=True)
    enc = (tmp_path / "e").read_text()
    with pytest.raises(ssh.InputError, match="passphrase protected"):
        _prepare({"host": "h", "privateKey": enc})
    with pytest.raises(ssh.InputError, match="x509: decryption password incorrect"):
        _prepare({"host": "h", "privateKey": enc, "privateKeyPassword": "nope"})
    _prepare({"host": "h", "privateKey": enc, "privateKeyPassword": "pw"})  # right passphrase


def test_dial_error_texts() -> None:
    conn = ssh.parse_connection({"host": "10.1.2.3", "port": 22})
    assert ssh._dial_error_text("ssh: connect to host 10.1.2.3 port 22: Connection refused\n",
                                conn).startswith(
        "dial tcp 10.1.2.3:22: connect: connection refused (OpenSSH: ssh: connect")
    assert ssh._dial_error_text("Host key verification failed.\n", conn).startswith(
        "ssh: handshake failed: ssh: host key mismatch")
    assert ssh._dial_error_text("root@10.1.2.3: Permission denied (publickey,password).\n",
                                conn).startswith(
        "ssh: handshake failed: ssh: unable to authenticate, attempted methods "
        "[none publickey password], no supported methods remain")


# --- the plugin binary over gRPC -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def plugin() -> Iterator[Any]:
    import grpc
    from pulumi.runtime.proto import provider_pb2_grpc
    p = subprocess.Popen([str(WRAPPER), "--logtostderr", "-v=9", "--tracing", "http://x:1",
                          "127.0.0.1:1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd="/")
    try:
        assert p.stdout is not None
        line = p.stdout.readline().decode()
        assert line.strip().isdigit(), (line, p.stderr.read() if p.stderr else b"")
        ch = grpc.insecure_channel(f"127.0.0.1:{int(line)}")
        yield provider_pb2_grpc.ResourceProviderStub(ch)
        ch.close()
    finally:
        p.terminate()
        p.wait(10)


def test_protocol(plugin: Any) -> None:
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import provider_pb2

    assert plugin.GetPluginInfo(empty_pb2.Empty()).version == "1.2.1"
    hs = plugin.Handshake(provider_pb2.ProviderHandshakeRequest(engine_address="127.0.0.1:1"))
    assert hs.accept_secrets and hs.accept_resources and not hs.accept_outputs
    cfg = plugin.Configure(provider_pb2.ConfigureRequest())
    assert cfg.acceptSecrets and cfg.supportsPreview
    urn = "urn:pulumi:dev::p::command:remote:Command::web"
    news = props.to_struct({"connection": Secret({"host": "h"}), "create": "echo"})
    chk = plugin.Check(provider_pb2.CheckRequest(urn=urn, news=news))
    checked = props.from_struct(chk.inputs)
    assert not chk.failures and isinstance(checked["connection"], Secret)
    assert checked["connection"].value["port"] == 22
    cr = plugin.Create(provider_pb2.CreateRequest(urn=urn, properties=chk.inputs, preview=True))
    out = props.from_struct(cr.properties)
    assert cr.id.startswith("web") and out["stdout"] is COMPUTED
    assert isinstance(out["connection"], Secret)
    state = props.to_struct({**checked, "stdout": "o", "stderr": ""})
    d = plugin.Diff(provider_pb2.DiffRequest(
        urn=urn, id=cr.id, olds=state,
        news=props.to_struct({**checked, "create": "echo 2", "triggers": ["x"]})))
    assert d.changes == provider_pb2.DiffResponse.DIFF_SOME
    assert sorted(d.diffs) == ["create", "triggers"] and list(d.replaces) == ["triggers"]
    assert d.detailedDiff["create"].kind == provider_pb2.PropertyDiff.UPDATE
    assert d.detailedDiff["triggers"].kind == provider_pb2.PropertyDiff.ADD_REPLACE
    rd = plugin.Read(provider_pb2.ReadRequest(urn=urn, id=cr.id, properties=state))
    assert rd.id == cr.id and props.from_struct(rd.properties)["stdout"] == "o"
    plugin.Delete(provider_pb2.DeleteRequest(urn=urn, id=cr.id, properties=state))  # no delete


def test_the_command_line_is_the_real_ones(capsys: pytest.CaptureFixture[str]) -> None:
    """Go's flag package over glog's flags and --tracing, as the real binary has them: the
    engine's address after the flags; --version (which the real one lacks) is its usage and
    exit 2, so nothing can tell the two apart by asking."""
    assert server.engine_address(["--logtostderr", "-v=9", "--tracing", "x", "127.0.0.1:5"]) \
        == "127.0.0.1:5"
    assert server.engine_address(["-v", "3", "127.0.0.1:6"]) == "127.0.0.1:6"
    with pytest.raises(SystemExit) as ended:
        server.engine_address(["--version"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("flag provided but not defined: -version\nUsage of ")
    assert "  -logtostderr\n" in err and "  -tracing value\n" in err
