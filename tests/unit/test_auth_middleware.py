"""The API-key middleware (scripts/spark_vllm_auth.py) as an ASGI app: every HTTP route but
/health and /ping, and every websocket handshake, needs the key."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from spark_vllm.components.render.commands import script_text


def middleware(key: str | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    if key is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", key)
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
