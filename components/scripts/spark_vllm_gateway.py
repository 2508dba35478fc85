"""The gateway's entry point: LiteLLM's proxy (its FastAPI app, `litellm.proxy.proxy_server`)
behind the same API-key middleware as every vLLM server of the stack (spark_vllm_auth.py).

`python3 spark_vllm_gateway.py HOST PORT`, with config.yaml and spark_vllm_auth.py beside it
(the program writes the three into the gateway's directory on the node, mounted read-only).

- The client's key is checked by RequireApiKey against the stack's key file (rotated without a
  restart, 401 on every route but the liveness probe's, as the services answer).
- LiteLLM refuses to start without a master key (1.105: master_key_boot_check). It gets one
  of its own, random per start, that no client ever sees: a request the middleware let through
  reaches LiteLLM with that key in place of the client's, so LiteLLM's own check passes, and
  nothing reaches LiteLLM any other way (the middleware wraps its app in this process).
- The vLLM servers behind it require the stack's key too: LiteLLM sends the key read from the
  key file at start (config.yaml's api_key: os.environ/SPARK_VLLM_UPSTREAM_KEY); the program
  replaces the gateway when the key changes (components/gateway.py).
- LiteLLM's /health calls every model; only /health/liveliness answers without a key.
"""
import os
import secrets
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("CONFIG_FILE_PATH", os.path.join(HERE, "config.yaml"))
INTERNAL_KEY = "sk-" + secrets.token_hex(32)
os.environ["LITELLM_MASTER_KEY"] = INTERNAL_KEY


def upstream_key() -> str:
    """The stack's key, from the middleware's key file ("none": the stack has no key)."""
    path = os.environ.get("SPARK_VLLM_API_KEY_FILE")
    if not path:
        return "none"
    try:
        with open(path, "rb") as f:
            return f.read().rstrip(b"\r\n").decode() or "none"
    except OSError as err:
        print(f"spark_vllm_gateway: cannot read the API key file {path} "
              f"({err.strerror or err})", file=sys.stderr, flush=True)
        return "none"


os.environ["SPARK_VLLM_UPSTREAM_KEY"] = upstream_key()


class AsInternal:
    """A request the middleware let through, as LiteLLM's own master key."""

    def __init__(self, app):
        self.app = app
        self.bearer = b"Bearer " + INTERNAL_KEY.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"authorization"]
            scope = {**scope, "headers": [*headers, (b"authorization", self.bearer)]}
        await self.app(scope, receive, send)


def main() -> None:
    import spark_vllm_auth
    import uvicorn
    from litellm.proxy.proxy_server import app

    spark_vllm_auth.OPEN_PATHS = ("/health/liveliness",)
    uvicorn.run(spark_vllm_auth.RequireApiKey(AsInternal(app)), host=sys.argv[1],
                port=int(sys.argv[2]), log_level="info")


if __name__ == "__main__":
    main()
