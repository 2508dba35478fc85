"""vLLM readiness probe, run inside the vLLM container (stdlib only: any vLLM image has it).

argv: HOST PORT SERVED_NAME MODE. MODE "ready": exit 0 when /health is 200 and /v1/models
lists SERVED_NAME, 1 otherwise. MODE "smoke": one short chat completion, printed.
The API key comes from the container's env (VLLM_API_KEY), never from argv.
"""
import json
import os
import sys
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


try:
    if mode == "ready":
        status, _ = call("/health")
        if status != 200:
            sys.exit(1)
        _, body = call("/v1/models")
        ids = [m.get("id") for m in json.loads(body).get("data", [])]
        if served not in ids:
            print(f"/v1/models lists {ids}, not {served!r}", file=sys.stderr)
            sys.exit(1)
    elif mode == "smoke":
        body = {"model": served, "max_tokens": 16,
                "messages": [{"role": "user", "content": "spark-vllm smoke test"}]}
        _, text = call("/v1/chat/completions", body, timeout=120.0)
        reply = json.loads(text)["choices"][0]["message"]["content"]
        print(f"smoke request answered: {reply[:200]!r}")
except (OSError, ValueError, KeyError, urllib.error.URLError) as err:
    print(f"{mode}: {err}", file=sys.stderr)
    sys.exit(1)
