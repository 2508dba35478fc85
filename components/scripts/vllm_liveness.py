"""vLLM liveness: serving, busy, wedged or not serving, from vLLM's own signals. Run inside the
vLLM container (stdlib only), by the refresh-time read and by `spark-vllm status`.

argv: HOST PORT SERVED_NAME CANARY_S WINDOW_S. The API key comes from the key file the
container's env names (SPARK_VLLM_API_KEY_FILE; or VLLM_API_KEY), never from argv.

  1. /health must answer 200 (a killed rank: 503 within a second on vLLM 0.26.0);
  2. the token counter `vllm:generation_tokens_total` is read, then a canary (a streamed
     completion of one token) is sent: its first chunk within CANARY_S = serving;
  3. no first token: the counter is read again, every second, until WINDOW_S after the first
     read. It moved = busy (a long queue: never reload 120 GB of weights for it); it stood
     still = wedged. On vLLM 0.26.0 with one rank frozen, /health stayed 200, the canary got
     nothing and the counter stood still, while `vllm:num_requests_running` kept its last
     value (gauges are published per engine step, and the step never ended): the gauges
     cannot tell, the counter can (tests/fixtures/real-vllm/).

Prints the state on stdout, one line: "running" (serving or busy) or
"wedged: no token for the canary in C s, none generated in W s" or
"running, not serving: WHY"; what it saw on stderr ("serving: first token in 0.05 s",
"busy: the canary waited 30 s; 1234 tokens generated in 31 s", or "unknown: … (counted as
serving: …)" when the counter could not be read). Exit 0 whenever it could tell.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

host, port, served = sys.argv[1:4]
canary_s, window_s = float(sys.argv[4]), float(sys.argv[5])
base = f"http://{host}:{port}"
headers = {"Content-Type": "application/json"}


def api_key():
    """The key the middleware checks: its file (SPARK_VLLM_API_KEY_FILE), else VLLM_API_KEY
    (a container started by a release before the key file)."""
    path = os.environ.get("SPARK_VLLM_API_KEY_FILE")
    if not path:
        return os.environ.get("VLLM_API_KEY")
    try:
        with open(path, "rb") as f:
            return f.read().rstrip(b"\r\n").decode() or None
    except OSError:
        return None


KEY = api_key()
if KEY:
    headers["Authorization"] = f"Bearer {KEY}"
COUNTER = "vllm:generation_tokens_total"
# No token for the canary and no counter to tell busy from wedged: the check prints "running",
# as for serving, on purpose; `spark-vllm status` then says "serving" and refresh replaces
# nothing. Said in the message, since the price is real: a server whose counter cannot be read
# is never found wedged here.
COUNTED_AS_SERVING = ("a long queue looks the same, and replacing a busy server reloads its "
                      "weights")


def tokens():
    """(the sum of the counter over its label sets, None) or (None, why /metrics did not say)."""
    try:  # the API key guards /metrics too (the program's middleware): 401 without it
        req = urllib.request.Request(base + "/metrics", headers=headers)
        with urllib.request.urlopen(req, timeout=5) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as err:
        return None, f"/metrics answered {err.code}"
    except (OSError, urllib.error.URLError) as err:
        return None, f"/metrics: {getattr(err, 'reason', err)}"
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(COUNTER) and not line.startswith(COUNTER + "_created"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return (total, None) if seen else (None, f"no {COUNTER} in /metrics")


def canary():
    """Seconds to the first streamed chunk, or None when none came within CANARY_S."""
    body = {"model": served, "prompt": "spark-vllm liveness", "max_tokens": 1, "stream": True,
            "temperature": 0}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers=headers)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=canary_s) as resp:
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    return time.monotonic() - t0
    except (TimeoutError, OSError) as err:
        if isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None),
                                                       TimeoutError):
            return None
        raise
    raise ValueError("the canary's stream ended without a token")


def main():
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as resp:
            if resp.status != 200:
                return f"running, not serving: /health answered {resp.status}"
    except urllib.error.HTTPError as err:
        return f"running, not serving: /health answered {err.code}"
    except (OSError, urllib.error.URLError) as err:
        return f"running, not serving: /health: {getattr(err, 'reason', err)}"
    t0 = time.monotonic()
    before, why = tokens()
    try:
        first = canary()
    except urllib.error.HTTPError as err:
        why = err.read()[:200].decode(errors="replace").strip()
        return f"running, not serving: the canary got {err.code}: {why}"
    except (OSError, ValueError, urllib.error.URLError) as err:
        return f"running, not serving: the canary failed: {getattr(err, 'reason', err)}"
    if first is not None:
        print(f"serving: first token in {first:.2f} s", file=sys.stderr)
        return "running"
    if before is None:
        # "unknown:" first: status and the lab keep the stderr lines that start so
        print(f"unknown: no token for the canary in {canary_s:g} s and {why}: busy cannot be "
              f"told from wedged (counted as serving: {COUNTED_AS_SERVING})", file=sys.stderr)
        return "running"
    while True:
        now, _ = tokens()
        if now is not None and now > before:
            print(f"busy: the canary waited {canary_s:g} s; {now - before:g} tokens generated "
                  f"in {time.monotonic() - t0:.0f} s", file=sys.stderr)
            return "running"
        if time.monotonic() - t0 >= window_s:
            return (f"wedged: no token for the canary in {canary_s:g} s, "
                    f"none generated in {window_s:g} s")
        time.sleep(1.0)


print(main())
