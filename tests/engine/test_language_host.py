"""The stand-in pulumi-language-python (lab/engine/language_host) under the REAL Pulumi CLI
(lab/tools.sh, via `source lab/env.sh`): a scratch project in a temp dir — a ComponentResource,
plain and secret config, exports, a RunError and an unhandled exception — run with
`pulumi stack init / preview / up / up (no changes) / destroy` and with the Automation API's
`work_dir` stacks. No resource providers (only components and outputs), a temp file backend and
a temp PULUMI_HOME; the program runs on the repo's .venv (read-only)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import envsh

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STAND_IN_BIN = REPO / "lab" / "engine" / "bin"
VENV = REPO / ".venv"

PROGRAM = '''\
import json
import os
import sys

import pulumi


class Box(pulumi.ComponentResource):
    def __init__(self, name, size, opts=None):
        super().__init__("lhtest:index:Box", name, {}, opts)
        self.size = pulumi.Output.from_input(size)
        self.register_outputs({"size": self.size})


cfg = pulumi.Config()
greeting = cfg.require("greeting")
token = cfg.require_secret("token")
if greeting == "fail":
    raise pulumi.RunError("bad config: greeting must not be 'fail'")
if greeting == "crash":
    {}["no-such-key"]
box = Box("box", len(greeting))
print("stdout-from-program", greeting)
print("stderr-from-program", file=sys.stderr)
pulumi.export("greeting", greeting)
pulumi.export("size", box.size)
pulumi.export("token", token)
pulumi.export("env", {
    "VIRTUAL_ENV": os.environ.get("VIRTUAL_ENV"),
    "PYTHONPATH": os.environ.get("PYTHONPATH"),
    "executable": sys.executable,
    "secret_keys": json.loads(os.environ["PULUMI_CONFIG_SECRET_KEYS"]),
    "cwd": os.getcwd(),
})
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    e = envsh.sourced()
    tool_bin = e.get("SPARK_VLLM_TOOLCHAIN_BIN", "")
    if not tool_bin or not Path(tool_bin, "pulumi-language-python-exec").exists():
        pytest.fail("the toolchain has no pulumi-language-python-exec (lab/tools.sh)")
    if not (VENV / "bin" / "python").exists():
        pytest.fail("no .venv")
    base = tmp_path_factory.mktemp("lh-engine")
    (base / "state").mkdir()
    (base / "home").mkdir()
    e.pop("PYTHONPATH", None)
    e.update({
        # the stand-in first: these tests are about it, even once a real host is built
        "PATH": f"{STAND_IN_BIN}:{e['PATH']}",
        "PULUMI_BACKEND_URL": f"file://{base / 'state'}",
        "PULUMI_HOME": str(base / "home"),
        "PULUMI_CONFIG_PASSPHRASE": "lh-test",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_SKIP_CONFIRMATIONS": "true",
    })
    return e


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lh-project")
    (d / "Pulumi.yaml").write_text(
        "name: lhtest\n"
        "runtime:\n  name: python\n  options:\n    toolchain: pip\n"
        f"    virtualenv: {VENV}\n"
        "stackConfigDir: stacks\n")
    (d / "__main__.py").write_text(PROGRAM)
    return d


def pulumi(env: dict[str, str], cwd: Path, *args: str, stdin: str | None = None,
           ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["pulumi", *args, "--non-interactive"] if args[0] not in ("config",)
                       else ["pulumi", *args], cwd=cwd, env=env, input=stdin,
                       capture_output=True, text=True, timeout=120)
    if ok and r.returncode != 0:
        raise AssertionError(f"pulumi {' '.join(args)}: exit {r.returncode}\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def diagnostics(out: str) -> str:
    """The Diagnostics section of the CLI's summary (each message once)."""
    m = re.search(r"^Diagnostics:\n(.*?)(?=^\S|\Z)", out, re.S | re.M)
    return m.group(1) if m else ""


@pytest.fixture(scope="module")
def stack(env: dict[str, str], project: Path) -> Iterator[str]:
    pulumi(env, project, "stack", "init", "dev")
    pulumi(env, project, "config", "set", "greeting", "hello")
    pulumi(env, project, "config", "set", "--secret", "token", "s3cr3t")
    yield "dev"
    pulumi(env, project, "destroy", "--yes", ok=False)
    pulumi(env, project, "stack", "rm", "--yes", "--force", "dev", ok=False)


def test_plugin_prints_only_its_port_and_answers(env: dict[str, str]) -> None:
    """Launched as the CLI does (engine address positional), one line on stdout: the port."""
    import grpc
    from google.protobuf import empty_pb2, struct_pb2
    from pulumi.runtime.proto import language_pb2, language_pb2_grpc

    t0 = time.monotonic()
    p = subprocess.Popen([str(STAND_IN_BIN / "pulumi-language-python"), "127.0.0.1:1"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        startup = time.monotonic() - t0
        assert re.fullmatch(r"\d+\n", line), line
        stub = language_pb2_grpc.LanguageRuntimeStub(grpc.insecure_channel(f"127.0.0.1:{line}"))
        assert "stand-in" in stub.GetPluginInfo(empty_pb2.Empty(), timeout=10).version
        opts = struct_pb2.Struct()
        opts.update({"toolchain": "pip", "virtualenv": str(VENV)})
        info = language_pb2.ProgramInfo(root_directory=str(REPO), program_directory=str(REPO),
                                        entry_point=".", options=opts)
        deps = stub.GetRequiredPackages(language_pb2.GetRequiredPackagesRequest(info=info),
                                        timeout=30).packages
        assert ("command", "v1.2.1", "resource") in [(d.name, d.version, d.kind) for d in deps]
        with pytest.raises(grpc.RpcError) as e:
            stub.GetRequiredPlugins(language_pb2.GetRequiredPluginsRequest(info=info), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        about = stub.About(language_pb2.AboutRequest(info=info), timeout=30)
        assert about.executable == str(VENV / "bin" / "python") and about.version.startswith("3.")
        # an existing venv: no re-creation, requirements only (none here) -> quick
        chunks = list(stub.InstallDependencies(language_pb2.InstallDependenciesRequest(
            info=language_pb2.ProgramInfo(root_directory="/nonexistent-lh",
                                          program_directory="/nonexistent-lh",
                                          entry_point=".", options=opts)), timeout=30))
        text = b"".join(c.stdout for c in chunks).decode()
        assert "Installing dependencies..." in text and "Using the existing virtual" in text
        assert text.rstrip().endswith("Finished installing dependencies")
        print(f"stand-in startup (port on stdout): {startup:.2f}s")
    finally:
        p.terminate()
        p.wait(timeout=10)
    assert p.stdout.read() == ""  # nothing after the port
    assert p.stderr is not None and p.stderr.read() == ""  # stderr is shown to users: silent


def test_cli_lifecycle(env: dict[str, str], project: Path, stack: str) -> None:
    t0 = time.monotonic()
    # stackConfigDir (a CLI concern): the stack file lives in stacks/
    assert (project / "stacks" / "Pulumi.dev.yaml").exists()
    assert not (project / "Pulumi.dev.yaml").exists()
    assert "secure:" in (project / "stacks" / "Pulumi.dev.yaml").read_text()

    pv = pulumi(env, project, "preview")
    assert "+ 2 to create" in pv.stdout, pv.stdout
    assert "stdout-from-program hello" in pv.stdout and "stderr-from-program" in pv.stdout

    up = pulumi(env, project, "up", "--yes")
    assert "+ 2 created" in up.stdout, up.stdout
    outs = json.loads(pulumi(env, project, "stack", "output", "--json", "--show-secrets").stdout)
    assert outs["greeting"] == "hello" and outs["size"] == 5 and outs["token"] == "s3cr3t"
    e = outs["env"]
    assert e["VIRTUAL_ENV"] == str(VENV)
    assert e["executable"].startswith(str(VENV / "bin"))
    assert e["PYTHONPATH"] is None  # the wrapper's PYTHONPATH does not leak into the program
    assert e["secret_keys"] == ["lhtest:token"]
    assert e["cwd"] == str(project)
    assert json.loads(pulumi(env, project, "stack", "output", "--json").stdout)["token"] == \
        "[secret]"

    again = pulumi(env, project, "up", "--yes", "--expect-no-changes")
    assert "2 unchanged" in again.stdout, again.stdout

    # RunError: the message once, no traceback, non-zero exit (then the engine's generic
    # "program exited with non-zero exit code: 1", as with the real host: the exec script exits
    # 1 after logging a RunError, and only exit 32 means bail)
    pulumi(env, project, "config", "set", "greeting", "fail")
    bad = pulumi(env, project, "up", "--yes", ok=False)
    assert bad.returncode != 0
    diag = diagnostics(bad.stdout)
    assert diag.count("error: bad config: greeting must not be 'fail'") == 1, bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr
    assert "program exited with non-zero exit code: 1" in diag

    # unhandled exception: the exec script logs the user's traceback and exits 32 -> bail, so
    # the engine adds nothing
    pulumi(env, project, "config", "set", "greeting", "crash")
    crash = pulumi(env, project, "preview", ok=False)
    assert crash.returncode != 0
    diag = diagnostics(crash.stdout)
    assert "Program failed with an unhandled exception:" in diag
    assert "KeyError: 'no-such-key'" in diag and "__main__.py" in diag
    assert "non-zero exit code" not in crash.stdout
    assert "pulumi-language-python-exec" not in diag  # traceback trimmed to the user's code

    pulumi(env, project, "config", "set", "greeting", "hello")
    down = pulumi(env, project, "destroy", "--yes")
    assert "2 deleted" in down.stdout, down.stdout
    assert json.loads(pulumi(env, project, "stack", "output", "--json").stdout) == {}
    print(f"CLI lifecycle (init..destroy): {time.monotonic() - t0:.1f}s")


def test_automation_api_work_dir(env: dict[str, str], project: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from pulumi import automation as auto

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    st = auto.create_or_select_stack(stack_name="auto", work_dir=str(project),
                                     opts=auto.LocalWorkspaceOptions(env_vars=env))
    try:
        assert (project / "stacks" / "Pulumi.auto.yaml").exists()
        st.set_config("greeting", auto.ConfigValue("hi"))
        st.set_config("token", auto.ConfigValue("tok", secret=True))
        events: list[Any] = []
        res = st.up(on_event=events.append)
        assert res.summary.result == "succeeded"
        assert res.outputs["greeting"].value == "hi" and res.outputs["size"].value == 2
        assert res.outputs["token"].secret and res.outputs["token"].value == "tok"
        created = [(e.resource_pre_event.metadata.type, e.resource_pre_event.metadata.op.value)
                   for e in events if e.resource_pre_event]
        assert ("lhtest:index:Box", "create") in created
        assert any(e.diagnostic_event and "stdout-from-program hi" in e.diagnostic_event.message
                   for e in events)

        res2 = st.up()
        assert res2.summary.resource_changes == {"same": 2}

        st.set_config("greeting", auto.ConfigValue("fail"))
        events = []
        with pytest.raises(auto.CommandError):
            st.up(on_event=events.append)
        errors = [e.diagnostic_event.message for e in events
                  if e.diagnostic_event and e.diagnostic_event.severity == "error"]
        assert sum("bad config: greeting must not be 'fail'" in m for m in errors) == 1, errors
        assert not any("Traceback" in m for m in errors)

        st.set_config("greeting", auto.ConfigValue("hi"))
        assert st.destroy().summary.result == "succeeded"
    finally:
        st.workspace.remove_stack("auto", force=True)
    print(f"Automation API (up, up, failing up, destroy): {time.monotonic() - t0:.1f}s")


def test_missing_venv_is_reported_like_the_real_host(env: dict[str, str],
                                                     tmp_path: Path) -> None:
    """A venv that exists but is not one: the real host's NewVirtualEnvError text."""
    (tmp_path / "notavenv").mkdir()
    (tmp_path / "notavenv" / "junk").write_text("")
    (tmp_path / "Pulumi.yaml").write_text(
        "name: lhbad\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
        "    virtualenv: notavenv\n")
    (tmp_path / "__main__.py").write_text("import pulumi\n")
    pulumi(env, tmp_path, "stack", "init", "bad")
    try:
        r = pulumi(env, tmp_path, "preview", ok=False)
        assert r.returncode != 0
        assert "The 'virtualenv' option in Pulumi.yaml is set to \"notavenv\"" in \
            r.stdout + r.stderr
        assert "doesn't appear to be a virtual environment" in r.stdout + r.stderr
    finally:
        pulumi(env, tmp_path, "stack", "rm", "--yes", "--force", "bad", ok=False)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
