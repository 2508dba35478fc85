"""vLLM readiness probe, run inside the vLLM container (stdlib only: any vLLM image has it).

argv: HOST PORT SERVED_NAME MODE [SECONDS [smoke [SMOKE_SECONDS]]]. MODE "ready": exit 0 when
/health is 200 and /v1/models lists SERVED_NAME, 1 otherwise. MODE "wait": the same check every
0.1 s for up to SECONDS (one `docker exec`, one Python start, for the whole load), then with
"smoke" one short chat completion at once (printed), since vLLM's HTTP server can answer while
generation is dead (vllm#53157). Exit 0 when ready (and answered), 1 when not ready in time, 2
when the smoke request failed, 3 when it got no answer within SMOKE_SECONDS (default 360:
vLLM 0.26.0's own per-step limit, VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS 300 s, and a minute; the
program passes the bound it derives, start_clocks.smoke_timeout: a first request slowed by kernels
compiled on first use is slow, not dead). MODE "smoke": the chat completion alone.
The API key comes from the key file the container's env names (SPARK_VLLM_API_KEY_FILE; or
VLLM_API_KEY), never from argv.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

host, port, served, mode = sys.argv[1:5]
base = f"http://{host}:{port}"

def api_key():
    """The key the middleware checks: its file (SPARK_VLLM_API_KEY_FILE), else VLLM_API_KEY."""
    path = os.environ.get("SPARK_VLLM_API_KEY_FILE")
    if not path:
        return os.environ.get("VLLM_API_KEY")
    try:
        with open(path, "rb") as f:
            return f.read().rstrip(b"\r\n").decode() or None
    except OSError:
        return None


key = api_key()
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = f"Bearer {key}"


def call(path, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read().decode()


WAIT_POLL_S = 0.1
DEFAULT_SMOKE_S = 360.0


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
    print(f"smoke request answered: {answer(json.loads(text))}")


def answer(reply):
    """What a chat completion answered, in a few words. Any valid completion is an answer:
    with a reasoning parser vLLM returns content null and the text in `reasoning`
    (`reasoning_content` in older releases), a tool call content null and `tool_calls`, and
    a model may answer nothing at all (observed on vLLM 0.26.0: tests/fixtures/real-vllm/).
    Raises ValueError when `reply` is not a chat completion."""
    try:
        choice = reply["choices"][0]
        msg = choice["message"]
        if not isinstance(msg, dict):
            raise TypeError(type(msg).__name__)
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(f"not a chat completion ({type(err).__name__}: {err})") from None
    content = msg.get("content")
    if isinstance(content, str) and content:
        return repr(content[:200])
    for key in ("reasoning", "reasoning_content"):
        if isinstance(msg.get(key), str) and msg[key]:
            return f"(reasoning) {msg[key][:200]!r}"
    calls = msg.get("tool_calls") or []
    if calls:
        names = [str((c.get("function") or {}).get("name")) for c in calls if isinstance(c, dict)]
        return f"(tool calls) {', '.join(names)}"
    return f"(no text; finish_reason {choice.get('finish_reason')})"


try:
    if mode in ("ready", "wait"):
        end = time.monotonic() + (float(sys.argv[5]) if mode == "wait" else 0.0)
        while (why := ready()) is not None and time.monotonic() < end:
            time.sleep(WAIT_POLL_S)
        if why is not None:
            print(f"{mode}: {why}", file=sys.stderr)
            sys.exit(1)
    extra = sys.argv[5:] if mode == "smoke" else sys.argv[6:]  # smoke [SMOKE_SECONDS]
    if mode == "smoke" or extra[:1] == ["smoke"]:
        rest = extra[1:] if extra[:1] == ["smoke"] else extra
        smoke_s = float(rest[0]) if rest else DEFAULT_SMOKE_S
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
