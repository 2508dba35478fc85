"""ASGI middleware loaded by `vllm serve --middleware spark_vllm_auth.RequireApiKey`.

The key is in a file, named by SPARK_VLLM_API_KEY_FILE (0600, on a read-only mount of its
directory), read again whenever the file changes (its inode, size or mtime: one stat per
request), so a rotated key is in force from the next request, with no restart; vLLM itself is
given no key (its own check reads VLLM_API_KEY once, at start). Without that variable, the key
is VLLM_API_KEY's, as vLLM's own. The file unreadable: the last key read stays in force; none
ever read: every guarded request is refused (never open by accident). The key is never logged.

With a key, every HTTP route except /health and /ping needs `Authorization: Bearer <key>`,
else 401 {"error": "Unauthorized"} (vLLM's own answer); so does every websocket handshake (401
where the server can answer a refused handshake over HTTP, else closed with 1008). vLLM 0.26.0's
own check (vllm/entrypoints/serve/utils/server_utils.py AuthenticationMiddleware) covers only
paths under /v1, /v2 and /inference (0.33.0 adds /cohere: serve/middleware/authenticate.py
GUARDED_PREFIX), and skips OPTIONS, as this does; /invocations (the SageMaker route, always
registered) and /metrics serve with no key there. Its docs say not to rely on --api-key alone
(vllm/entrypoints/common/cli_args.py, api_key). Like vLLM's, the scheme is case-insensitive.
Stdlib only: written into the vLLM container by its entrypoint, imported by vLLM's server.
"""
import hmac
import os
import sys

OPEN_PATHS = ("/health", "/ping")  # liveness probes answer without a key, as in vLLM
KEY_FILE_ENV = "SPARK_VLLM_API_KEY_FILE"
_BODY = b'{"error":"Unauthorized"}'
_NEVER = object()  # a key file named but never read: nothing matches it


class RequireApiKey:
    def __init__(self, app):
        self.app = app
        self.path = os.environ.get(KEY_FILE_ENV) or None
        self._seen = None  # (inode, size, mtime_ns) of the file last read
        self._warned = False
        if self.path:
            self.expected = _NEVER
            self._reload()
        else:
            key = os.environ.get("VLLM_API_KEY")
            self.expected = key.encode() if key else None

    def _reload(self):
        """The key from the file, when it changed since the last read (one stat)."""
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            if seen == self._seen:
                return
            with open(self.path, "rb") as f:
                key = f.read().rstrip(b"\r\n")
        except OSError as err:
            if not self._warned:  # the path, never the key
                print(f"spark_vllm_auth: cannot read the API key file {self.path} "
                      f"({err.strerror or err}): the last key read stays in force",
                      file=sys.stderr, flush=True)
                self._warned = True
            return
        if not key:
            return  # a file being written by hand: the last key stays
        self.expected, self._seen, self._warned = key, seen, False

    def _allowed(self, headers):
        given = dict(headers or []).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() != b"bearer" or self.expected is _NEVER:
            return False
        return hmac.compare_digest(token, self.expected)

    async def __call__(self, scope, receive, send):
        if self.path and scope["type"] in ("http", "websocket"):
            self._reload()
        if (scope["type"] not in ("http", "websocket") or self.expected is None
                or scope.get("path") in OPEN_PATHS or scope.get("method") == "OPTIONS"):
            await self.app(scope, receive, send)
            return
        if self._allowed(scope.get("headers")):
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
