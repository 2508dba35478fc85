"""The stand-in pulumi-language-python's pieces that mirror the real host's Go code, without the
CLI: Go flag syntax, PEP 440 -> plugin versions, pulumi-plugin.json handling, runtime options,
venv activation and the exec script's command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from google.protobuf import struct_pb2
from pulumi.runtime.proto import language_pb2

# tests/engine has no __init__.py: under plain `pytest` (not `python -m pytest` from the repo)
# the repo root is not on sys.path
REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from lab.engine.language_host import STAND_IN_VERSION, flags  # noqa: E402
from lab.engine.language_host.packages import (  # noqa: E402
    package_dependency,
    plugin_version,
    required_packages,
)
from lab.engine.language_host.server import LanguageHost, _go_json_string_map  # noqa: E402
from lab.engine.language_host.toolchain import (  # noqa: E402
    Package,
    ToolchainError,
    activate_virtualenv,
    normalize_name,
    parse_options,
    parse_python_version,
    resolve_toolchain,
)


def test_version_is_labelled_stand_in() -> None:
    assert STAND_IN_VERSION.startswith("3.274.1+") and "stand-in" in STAND_IN_VERSION


@pytest.mark.parametrize("argv,values,positional", [
    (["127.0.0.1:1234"], {}, ["127.0.0.1:1234"]),
    (["--logtostderr", "-v=9", "--tracing", "http://t", "127.0.0.1:1"],
     {"logtostderr": "true", "v": "9", "tracing": "http://t"}, ["127.0.0.1:1"]),
    (["-root=/p", "-virtualenv", "venv", "--", "-x"], {"root": "/p", "virtualenv": "venv"},
     ["-x"]),
    (["-logtostderr=false", "a", "-v=3"], {"logtostderr": "false"}, ["a", "-v=3"]),
])
def test_go_flag_syntax(argv: list[str], values: dict[str, str], positional: list[str]) -> None:
    a = flags.parse(argv)
    assert a.values == values and a.positional == positional


@pytest.mark.parametrize("argv", [["-nope"], ["-tracing"], ["-logtostderr=maybe"]])
def test_go_flag_errors(argv: list[str]) -> None:
    with pytest.raises(flags.UsageError):
        flags.parse(argv)


@pytest.mark.parametrize("pep440,semver", [
    ("1.2.1", "1.2.1"), ("1.0", "1.0.0"), ("3", "3.0.0"), ("1.2.3a4", "1.2.3-alpha.4"),
    ("1.2.3b4", "1.2.3-beta.4"), ("1.2.3rc4", "1.2.3-rc.4"), ("1.2.3.post4", "1.2.3+post4"),
    ("1.2.3.dev5", "1.2.3+dev5"), ("1.2.3.post4.dev5", "1.2.3+post4dev5"),
])
def test_plugin_version(pep440: str, semver: str) -> None:
    assert plugin_version(pep440) == semver


@pytest.mark.parametrize("bad", ["", "1!2.0", "1.2.3foo"])
def test_plugin_version_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        plugin_version(bad)


def _pkg(tmp_path: Path, name: str, version: str, plugin: dict[str, object] | None) -> Package:
    mod = tmp_path / name.replace("-", "_")
    mod.mkdir()
    if plugin is not None:
        (mod / "pulumi-plugin.json").write_text(json.dumps(plugin))
    return Package(normalize_name(name), version, str(tmp_path))


def test_required_packages_from_plugin_json(tmp_path: Path) -> None:
    pkgs = [
        _pkg(tmp_path, "pulumi_command", "1.2.1",
             {"resource": True, "name": "command", "version": "1.2.1"}),
        _pkg(tmp_path, "pulumi-random", "4.16.0", None),  # name and version derived
        _pkg(tmp_path, "pulumi-policy", "1.0.0", None),  # known to have no plugin
        _pkg(tmp_path, "pulumi-nores", "1.0.0", {"resource": False}),
        _pkg(tmp_path, "acme-infra", "0.3", {"resource": True, "name": "acme",
                                             "server": "https://example.invalid"}),
        _pkg(tmp_path, "requests", "2.0.0", None),
        _pkg(tmp_path, "pulumi-epoch", "1!2.0", None),  # version undeterminable: skipped
        _pkg(tmp_path, "pulumi-alpha", "3.31.0a16", None),
    ]
    got = [(d.name, d.version, d.kind, d.server) for d in required_packages(pkgs)]
    assert got == [("command", "v1.2.1", "resource", ""),
                   ("random", "v4.16.0", "resource", ""),
                   ("acme", "v0.3.0", "resource", "https://example.invalid"),
                   ("alpha", "v3.31.0-alpha.16", "resource", "")]


def test_parameterization_from_plugin_json(tmp_path: Path) -> None:
    p = _pkg(tmp_path, "pulumi-tf", "0.1.0", {
        "resource": True, "name": "terraform-provider", "version": "0.8.0",
        "parameterization": {"name": "tf", "version": "0.1.0", "value": "eyJ4IjoxfQ=="}})
    dep = package_dependency(p)
    assert dep is not None and dep.parameterization is not None
    assert (dep.name, dep.version) == ("terraform-provider", "v0.8.0")
    assert dep.parameterization.value == b'{"x":1}'


def test_runtime_options() -> None:
    o = parse_options("/r", "/r/p", {"toolchain": "pip", "virtualenv": "venv"})
    assert resolve_toolchain(o).virtualenv_path == "/r/venv"
    o = parse_options("/r", "/r", {"virtualenv": "/abs/venv"})
    assert resolve_toolchain(o).virtualenv_path == "/abs/venv"
    for bad in ({"virtualenv": 3}, {"toolchain": "conda"}, {"typechecker": "pytype"}):
        with pytest.raises(ToolchainError):
            parse_options("/r", "/r", bad)
    with pytest.raises(ToolchainError, match="STAND-IN"):
        resolve_toolchain(parse_options("/r", "/r", {"toolchain": "uv"}))


def test_uv_lock_detected_when_toolchain_unset(tmp_path: Path) -> None:
    (tmp_path / "uv.lock").write_text("")
    (tmp_path / "prog").mkdir()
    with pytest.raises(ToolchainError, match="uv"):
        resolve_toolchain(parse_options(str(tmp_path), str(tmp_path / "prog"), {}))


def test_activate_virtualenv() -> None:
    env = activate_virtualenv({"PATH": "/usr/bin", "PYTHONHOME": "/x", "VIRTUAL_ENV": "/old",
                               "A": "1"}, "/v")
    assert env == {"PATH": "/v/bin:/usr/bin", "A": "1", "VIRTUAL_ENV": "/v"}
    assert activate_virtualenv({}, "/v") == {"PATH": "/v/bin", "VIRTUAL_ENV": "/v"}


def test_python_version() -> None:
    assert parse_python_version("Python 3.11.7\n") == "3.11.7"
    assert parse_python_version("Python 3.13.0rc1") == "3.13.0-rc.1"
    assert parse_python_version("3.12") == "3.12.0"


def test_exec_command_line_in_real_host_order() -> None:
    host = LanguageHost("/x/pulumi-language-python-exec", "127.0.0.1:5", "")
    opts = struct_pb2.Struct()
    opts.update({"virtualenv": "venv"})
    req = language_pb2.RunRequest(
        project="p", stack="s", pwd="/w", monitor_address="127.0.0.1:7", dryRun=True,
        parallel=16, args=["a1"], info=language_pb2.ProgramInfo(
            root_directory="/r", program_directory="/w", entry_point=".", options=opts))
    assert host.construct_arguments(req) == [
        "--monitor", "127.0.0.1:7", "--engine", "127.0.0.1:5", "--project", "p",
        "--root_directory", "/r", "--stack", "s", "--pwd", "/w", "--dry_run", "true",
        "--parallel", "16", ".", "a1"]
    req.organization, req.dryRun = "org", False
    host.tracing = "http://t"
    args = host.construct_arguments(req)
    assert args[args.index("--dry_run") + 1] == "false"
    assert args[-6:] == ["--tracing", "http://t", "--organization", "org", ".", "a1"]


def test_config_json_like_go() -> None:
    req = language_pb2.RunRequest(config={"p:b": "2", "p:a": "<1>"})
    assert json.loads(_go_json_string_map(req.config)) == {"p:a": "<1>", "p:b": "2"}
    assert _go_json_string_map(req.config).index("p:a") < _go_json_string_map(req.config).index(
        "p:b")
