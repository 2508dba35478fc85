"""ASGI middleware loaded by `vllm serve --middleware spark_vllm_auth.RequireApiKey`.

With VLLM_API_KEY set, every HTTP route except /health and /ping needs
`Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"} (vLLM's own answer); so does
every websocket handshake (401 where the server can answer a refused handshake over HTTP, else
closed with 1008): vLLM 0.26.0 refused WS /v1/realtime without the key itself (observed,
tests/fixtures/real-vllm), but only under its guarded prefixes.
vLLM's check covers only paths under /v1, /v2, /inference and /cohere
(vllm/entrypoints/serve/middleware/authenticate.py, GUARDED_PREFIX in 0.33.0), while
/invocations (the SageMaker route, always registered) serves the same inference with no key;
its docs say not to rely on --api-key alone (vllm/entrypoints/common/cli_args.py, api_key).
Stdlib only: written into the vLLM container by its entrypoint, imported by vLLM's server.
"""
import hmac
import os

OPEN_PATHS = ("/health", "/ping")  # liveness probes answer without a key, as in vLLM
_BODY = b'{"error":"Unauthorized"}'


class RequireApiKey:
    def __init__(self, app):
        self.app = app
        key = os.environ.get("VLLM_API_KEY")
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send):
        if (scope["type"] not in ("http", "websocket") or self.expected is None
                or scope.get("path") in OPEN_PATHS or scope.get("method") == "OPTIONS"):
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            if "websocket.http.response" in (scope.get("extensions") or {}):
                await send({"type": "websocket.http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(_BODY)).encode())]})
                await send({"type": "websocket.http.response.body", "body": _BODY})
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(_BODY)).encode())]})
        await send({"type": "http.response.body", "body": _BODY})
