"""vLLM readiness probe, run inside the vLLM container (stdlib only: any vLLM image has it).

argv: HOST PORT SERVED_NAME MODE [SECONDS [smoke [SMOKE_SECONDS]]]. MODE "ready": exit 0 when
/health is 200 and /v1/models lists SERVED_NAME, 1 otherwise. MODE "wait": the same check every
0.1 s for up to SECONDS (one `docker exec`, one Python start, for the whole load), then with
"smoke" one short chat completion at once (printed), since vLLM's HTTP server can answer while
generation is dead (vllm#53157). Exit 0 when ready (and answered), 1 when not ready in time, 2
when the smoke request failed, 3 when it got no answer within SMOKE_SECONDS (default 120: a
busy server is slow, not dead). MODE "smoke": the chat completion alone.
The API key comes from the container's env (VLLM_API_KEY), never from argv.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

host, port, served, mode = sys.argv[1:5]
base = f"http://{host}:{port}"
key = os.environ.get("VLLM_API_KEY")
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = f"Bearer {key}"


def call(path, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read().decode()


WAIT_POLL_S = 0.1


def ready():
    """None when serving SERVED_NAME, else why not."""
    try:
        status, _ = call("/health", timeout=2.0)
        if status != 200:
            return f"/health answered {status}"
        _, body = call("/v1/models", timeout=2.0)
        ids = [m.get("id") for m in json.loads(body).get("data", [])]
    except (OSError, ValueError, urllib.error.URLError) as err:
        return f"{err}"
    return None if served in ids else f"/v1/models lists {ids}, not {served!r}"


def smoke(timeout):
    body = {"model": served, "max_tokens": 16,
            "messages": [{"role": "user", "content": "spark-vllm smoke test"}]}
    _, text = call("/v1/chat/completions", body, timeout=timeout)
    reply = json.loads(text)["choices"][0]["message"]["content"]
    print(f"smoke request answered: {reply[:200]!r}")


try:
    if mode in ("ready", "wait"):
        end = time.monotonic() + (float(sys.argv[5]) if mode == "wait" else 0.0)
        while (why := ready()) is not None and time.monotonic() < end:
            time.sleep(WAIT_POLL_S)
        if why is not None:
            print(f"{mode}: {why}", file=sys.stderr)
            sys.exit(1)
    if sys.argv[6:7] == ["smoke"]:
        smoke_s = float(sys.argv[7]) if len(sys.argv) > 7 else 120.0
        try:
            smoke(smoke_s)
        except (OSError, ValueError, KeyError, urllib.error.URLError) as err:
            if isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None),
                                                          TimeoutError):
                print(f"smoke request: no answer within {smoke_s:g} s", file=sys.stderr)
                sys.exit(3)
            print(f"smoke request failed: {err}", file=sys.stderr)
            sys.exit(2)
except (OSError, ValueError, KeyError, urllib.error.URLError) as err:
    print(f"{mode}: {err}", file=sys.stderr)
    sys.exit(1)
