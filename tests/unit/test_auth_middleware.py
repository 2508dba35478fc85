"""The API-key middleware (scripts/spark_vllm_auth.py) as an ASGI app: every HTTP route but
/health and /ping, and every websocket handshake, needs the key."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from spark_vllm.components.render.commands import script_text


def middleware(key: str | None, monkeypatch: pytest.MonkeyPatch,
               key_file: Path | None = None) -> Any:
    """The middleware with `key` in VLLM_API_KEY, or (`key_file`) named by the program's
    SPARK_VLLM_API_KEY_FILE, as its containers run it."""
    monkeypatch.delenv("SPARK_VLLM_API_KEY_FILE", raising=False)
    if key is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", key)
    if key_file is not None:
        monkeypatch.setenv("SPARK_VLLM_API_KEY_FILE", str(key_file))
    spec = importlib.util.spec_from_loader("spark_vllm_auth", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    exec(script_text("spark_vllm_auth.py"), mod.__dict__)  # noqa: S102 - our own script

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "app", "path": scope["path"]})
    return mod.RequireApiKey(app)


def call(mw: Any, scope: dict) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(msg: dict) -> None:
        sent.append(msg)
    # a loop of its own: asyncio.run would leave no current loop for the Pulumi mock tests
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(mw(scope, receive, send))
    finally:
        loop.close()
    return sent


def http(path: str, auth: bytes | None = None) -> dict:
    return {"type": "http", "path": path, "method": "GET",
            "headers": [(b"authorization", auth)] if auth else []}


def ws(path: str, auth: bytes | None = None, extensions: dict | None = None) -> dict:
    return {"type": "websocket", "path": path, "extensions": extensions or {},
            "headers": [(b"authorization", auth)] if auth else []}


def test_http_routes_need_the_key_but_health_and_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    mw = middleware("k1", monkeypatch)
    for path in ("/v1/models", "/invocations", "/metrics", "/version"):
        assert call(mw, http(path))[0]["status"] == 401, path
        assert call(mw, http(path, b"Bearer k1"))[0]["type"] == "app", path
        assert call(mw, http(path, b"Bearer k2"))[0]["status"] == 401, path
    for path in ("/health", "/ping"):
        assert call(mw, http(path))[0]["type"] == "app", path


def test_a_websocket_handshake_needs_the_key_on_any_path(monkeypatch: pytest.MonkeyPatch) -> None:
    mw = middleware("k1", monkeypatch)
    for path in ("/v1/realtime", "/anything"):
        refused = call(mw, ws(path, extensions={"websocket.http.response": {}}))
        assert refused[0] == {"type": "websocket.http.response.start", "status": 401,
                              "headers": refused[0]["headers"]}
        assert call(mw, ws(path))[0] == {"type": "websocket.close", "code": 1008}
        assert call(mw, ws(path, b"Bearer k1"))[0]["type"] == "app"


def test_without_a_key_nothing_is_guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    mw = middleware(None, monkeypatch)
    assert call(mw, http("/v1/models"))[0]["type"] == "app"
    assert call(mw, ws("/v1/realtime"))[0]["type"] == "app"


def write_key(path: Path, key: str) -> None:
    """As the key's command writes it (api_key_commands.api_key_script): a new file, renamed over."""
    tmp = path.with_name(".key.new")
    tmp.write_text(key)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def test_a_rotated_key_file_is_in_force_at_the_next_request(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = tmp_path / "key"
    write_key(key, "sk-old-1")
    mw = middleware("sk-env-ignored", monkeypatch, key_file=key)  # the file wins
    assert call(mw, http("/v1/models", b"Bearer sk-old-1"))[0]["type"] == "app"
    assert call(mw, http("/v1/models", b"Bearer sk-env-ignored"))[0]["status"] == 401
    write_key(key, "sk-new-2")  # the same size: the new inode tells
    assert call(mw, http("/v1/models", b"Bearer sk-old-1"))[0]["status"] == 401
    assert call(mw, http("/invocations", b"Bearer sk-new-2"))[0]["type"] == "app"
    assert call(mw, ws("/v1/realtime", b"Bearer sk-new-2"))[0]["type"] == "app"
    assert call(mw, ws("/v1/realtime", b"Bearer sk-old-1"))[0]["type"] == "websocket.close"
    key.write_text("sk-edited-by-hand-3\n")  # in place, a newline after it
    assert call(mw, http("/v1/models", b"Bearer sk-edited-by-hand-3"))[0]["type"] == "app"
    assert call(mw, http("/health"))[0]["type"] == "app"


def test_a_key_file_never_read_guards_everything_and_a_lost_one_keeps_the_last_key(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    key = tmp_path / "key"
    mw = middleware(None, monkeypatch, key_file=key)  # named, not there yet: never open
    assert call(mw, http("/v1/models"))[0]["status"] == 401
    assert call(mw, http("/v1/models", b"Bearer "))[0]["status"] == 401
    assert call(mw, http("/health"))[0]["type"] == "app"
    write_key(key, "sk-late-4")
    assert call(mw, http("/v1/models", b"Bearer sk-late-4"))[0]["type"] == "app"
    key.unlink()  # gone (or unreadable): the last key read stays in force
    assert call(mw, http("/v1/models", b"Bearer sk-late-4"))[0]["type"] == "app"
    assert call(mw, http("/v1/models"))[0]["status"] == 401
    key.write_text("")  # empty (being written by hand): the last key still
    assert call(mw, http("/v1/models", b"Bearer sk-late-4"))[0]["type"] == "app"
    err = capsys.readouterr().err
    assert str(key) in err and "sk-late-4" not in err  # the path is said, never the key
    assert err.count("cannot read") == 2  # once while missing at start, once after the loss


def test_the_scheme_is_case_insensitive_as_in_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.26.0 (serve/utils/server_utils.py verify_token): `scheme.lower() != "bearer"`."""
    mw = middleware("k1", monkeypatch)
    for auth in (b"Bearer k1", b"bearer k1", b"BEARER k1"):
        assert call(mw, http("/v1/models", auth))[0]["type"] == "app", auth
    for auth in (b"Basic k1", b"k1", b"Bearer  k1", b"Bearer k1 "):
        assert call(mw, http("/v1/models", auth))[0]["status"] == 401, auth
