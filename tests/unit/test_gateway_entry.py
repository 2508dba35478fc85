"""The gateway's entry point (scripts/spark_vllm_gateway.py) without LiteLLM: the key it sends
to the models is the stack's key file's, and a request the stack's middleware let through
reaches LiteLLM with LiteLLM's own start-time key in place of the client's."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from spark_vllm.components.render import gateway_commands
from spark_vllm.components.render.commands import script_text


def run(coro: Any) -> None:
    """A loop of its own: asyncio.run would leave no current loop for the Pulumi mock tests
    that follow (as tests/unit/test_auth_middleware.py says)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


def entry(monkeypatch: pytest.MonkeyPatch, key_file: Path | None) -> Any:
    monkeypatch.delenv("SPARK_VLLM_API_KEY_FILE", raising=False)
    monkeypatch.delenv("LITELLM_MASTER_KEY", raising=False)
    monkeypatch.delenv("CONFIG_FILE_PATH", raising=False)
    if key_file is not None:
        monkeypatch.setenv("SPARK_VLLM_API_KEY_FILE", str(key_file))
    spec = importlib.util.spec_from_loader("spark_vllm_gateway", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__dict__["__file__"] = "/spark-vllm-gateway/spark_vllm_gateway.py"
    exec(script_text("spark_vllm_gateway.py"), mod.__dict__)  # noqa: S102 - our own script
    return mod


def test_the_upstream_key_is_the_stacks_and_litellm_gets_a_key_of_its_own(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-stack\n")
    mod = entry(monkeypatch, key)
    assert os.environ["SPARK_VLLM_UPSTREAM_KEY"] == "sk-stack"
    internal = os.environ["LITELLM_MASTER_KEY"]
    assert internal.startswith("sk-") and len(internal) == 67 and internal != "sk-stack"
    assert os.environ["CONFIG_FILE_PATH"] == "/spark-vllm-gateway/config.yaml"
    # without a key file (no apiKey): "none", and LiteLLM still gets its own
    entry(monkeypatch, None)
    assert os.environ["SPARK_VLLM_UPSTREAM_KEY"] == "none"
    assert mod.INTERNAL_KEY != os.environ["LITELLM_MASTER_KEY"]  # new per start


def test_a_request_reaches_litellm_with_its_own_key_never_the_clients(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mod = entry(monkeypatch, None)
    seen: list[dict] = []

    async def litellm(scope: dict, receive: Any, send: Any) -> None:
        seen.append(scope)

    scope = {"type": "http", "path": "/v1/models",
             "headers": [(b"authorization", b"Bearer sk-client"), (b"x-a", b"1")]}
    run(mod.AsInternal(litellm)(scope, None, None))
    headers = seen[0]["headers"]
    assert (b"authorization", b"Bearer " + mod.INTERNAL_KEY.encode()) in headers
    assert (b"authorization", b"Bearer sk-client") not in headers and (b"x-a", b"1") in headers
    run(mod.AsInternal(litellm)({"type": "lifespan"}, None, None))
    assert seen[1] == {"type": "lifespan"}  # LiteLLM's startup passes through as it is


def test_the_gateways_stdin_carries_its_files_after_their_separators() -> None:
    from tests.unit.test_several_graph import two
    spec = two()
    text = gateway_commands.stdin(spec)
    for name in gateway_commands.FILES:
        assert gateway_commands.FILE_SEPARATOR + name in text
    from tests.unit.harness import API_KEY
    assert API_KEY not in text  # no key: it is in the key file
    config = gateway_commands.config(spec)
    assert [m["model_name"] for m in config["model_list"]] == ["org/big", "org/small"]
    assert config["model_list"][1]["litellm_params"] == {
        "model": "hosted_vllm/org/small", "api_base": "http://192.168.231.12:8002/v1",
        "api_key": "os.environ/SPARK_VLLM_UPSTREAM_KEY"}


def test_the_start_writes_the_gateways_files_and_waits_for_its_port(tmp_path: Path) -> None:
    """The gateway's `create` run for real with a fake docker: its stdin split into the
    gateway's directory (each file whole), the image checked, the container started, ready once
    something listens on the stack's port."""
    import json
    import socket
    import subprocess

    from spark_vllm.components.spec import parse_spec
    from tests.unit.harness import pinned
    from tests.unit.test_several_graph import two

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    raw = {"nodes": pinned([{"name": "node-1", "host": "127.0.0.1"}]), "image": "vllm/image:1",
           "backend": "native", "port": port, "gateway": {"image": "litellm:1"},
           "models": [{"name": "m", "model": "org/m", "tensorParallelSize": 1}]}
    spec = parse_spec(raw, "t", frozenset({"sshPrivateKey"}))
    assert two()  # the shared fixture still parses
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "docker.log"
    (bin_dir / "docker").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\ncase "$1" in\n'
        '  run) echo 0123456789abcdef0123 ;;\n  inspect) echo running ;;\nesac\nexit 0\n')
    (bin_dir / "docker").chmod(0o755)
    try:
        proc = subprocess.run(["sh", "-c", gateway_commands.start(spec)],
                              input=gateway_commands.stdin(spec), capture_output=True,
                              text=True, timeout=60,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0123456789abcdef0123"
    d = tmp_path / ".spark-vllm" / "t" / "gateway"
    assert sorted(p.name for p in d.iterdir()) == sorted(gateway_commands.FILES)
    for name, text in gateway_commands.files(spec).items():
        assert (d / name).read_text() == text.rstrip("\n") + "\n", name
    assert json.loads((d / "config.yaml").read_text()) == gateway_commands.config(spec)
    env_file = (tmp_path / ".spark-vllm" / "t" / "gateway.env").read_text()
    assert "follows" not in env_file and env_file.startswith("#")
    run_line = next(line for line in log.read_text().splitlines() if line.startswith("run "))
    assert f"{gateway_commands.GATEWAY_MOUNT}/spark_vllm_gateway.py 0.0.0.0 {port}" in run_line


@pytest.mark.parametrize("ps, kept", [
    ("a1b2c3 \n", True),  # the gateway (no model label) still mounts the file
    ("d4e5f6 big\nf7a8b9 small\n", False),  # only the models' containers: each reads its own
    ("", False),
])
def test_the_gateways_key_file_is_kept_only_while_a_container_without_a_model_reads_it(
        tmp_path: Path, ps: str, kept: bool) -> None:
    """The delete of the gateway's key command (api_key_commands.api_key_remove_script), run
    with a fake docker whose `ps` lists the stack's containers that mount a key file, each with
    its model label: the models' own containers read their own models' files."""
    import subprocess

    from spark_vllm.components.render import api_key_commands
    from tests.unit.test_several_graph import two

    spec = two()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "ps.out").write_text(ps)
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = ps ] && cat {tmp_path}/ps.out\n')
    (bin_dir / "docker").chmod(0o755)
    key = tmp_path / ".spark-vllm" / "test" / "api-key" / "key"
    key.parent.mkdir(parents=True)
    key.write_text("sk-test\n")
    proc = subprocess.run(["sh", "-c", api_key_commands.api_key_remove_script(spec, spec.head)],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert key.exists() is kept, proc.stderr
    assert ("kept: a container of this stack still reads it" in proc.stderr) is kept
