"""A vLLM rank on a node, killed or frozen, the same way for every contender; and "serving" as
a request that gets tokens, not only /health.

A rank is whatever process holds a TP rank on that node, whichever tool started it:
- on Ray (spark-vllm's default backend, Ray's cluster launcher, the bare path): the Ray actor
  process, titled `ray::RayWorkerProc` (vLLM's V2 Ray executor) or `ray::RaySimWorker`
  (vllm-sim's legacy V1) in its argv (lab/faults.py RANK_PATTERN);
- on vLLM's native multi-node (spark-vllm's `backend: native`, sparkrun's default
  `vllm-distributed`): the headless `vllm serve … --headless` process of that node.

The node's dockerd runs every container's processes in child PID namespaces of the node, so
one scan of the node's /proc finds them whatever container holds them. SIGKILL is a crash;
SIGSTOP a wedge (as the GPU tier froze a rank of real vLLM 0.26.0: /health stays 200, no token
comes). A rank killed or frozen while idle leaves /health at 200 on every contender (vllm-sim
plays vLLM's own behaviour: lab/vllm_sim/vllm_sim/native.py), so serving again is checked with
a completion that must return tokens.
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.error
import urllib.request

from bench.common import API_PORT, BenchError, Lab, Node, on_nodes, ssh
from lab.faults import RANK_PATTERN

# On the node: argv SIGNAL; one line "pid title" per rank process signalled; exit 4 if none.
# SIGNAL "LIST" sends nothing (signal 0): which processes are ranks.
SIGNAL_RANKS_PY = r"""
import os, re, signal, sys
ray = re.compile(PATTERN)
sig = 0 if sys.argv[1] == "LIST" else getattr(signal, sys.argv[1])
found = 0
for e in os.listdir("/proc"):
    if not e.isdigit() or int(e) == os.getpid():
        continue
    try:
        argv = open("/proc/%s/cmdline" % e, "rb").read().split(b"\0")
    except OSError:
        continue
    words = [a.decode(errors="replace") for a in argv if a]
    title = " ".join(words)
    headless = "--headless" in words and any(w.endswith("vllm") for w in words[:2]) and "serve" in words
    if not (ray.match(title) or headless):
        continue
    try:
        os.kill(int(e), sig)
    except OSError:
        continue
    found += 1
    print(e, title[:200])
sys.exit(0 if found else 4)
""".replace("PATTERN", repr(RANK_PATTERN))


def signal_ranks(node: Node, sig: str) -> list[str]:
    """SIGKILL / SIGSTOP every rank process on the node; the lines "pid title" signalled.
    Raises when there was none (the scenario would measure nothing)."""
    res = ssh(node, f"python3 -c {shlex.quote(SIGNAL_RANKS_PY)} {sig}", timeout=30)
    lines = [x for x in res.out.splitlines() if x.strip()]
    if res.rc == 4 or not lines:
        raise BenchError(f"{node.name}: no vLLM rank process to {sig} ({res.tail(3)})")
    if not res.ok:
        raise BenchError(f"{node.name}: {sig} of the ranks failed: {res.tail(3)}")
    return lines


def thaw_all(lab: Lab) -> None:
    """SIGCONT every rank on every node (untimed, best effort): nothing stays frozen after a
    scenario, whatever the contender did."""
    on_nodes(lab.nodes, lambda n: f"python3 -c {shlex.quote(SIGNAL_RANKS_PY)} SIGCONT || true",
             timeout=30)


def _json(url: str, body: dict | None, timeout: float) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def tokens_once(lab: Lab, timeout: float = 10.0) -> str | None:
    """One completion of 4 tokens from the head's endpoint; None when it came back with
    tokens, else why not."""
    base = f"http://{lab.head.mgmt_ip}:{API_PORT}/v1"
    try:
        model = _json(f"{base}/models", None, timeout)["data"][0]["id"]
        out = _json(f"{base}/completions", {"model": model, "prompt": "The bench asks",
                                            "max_tokens": 4, "temperature": 0}, timeout)
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as e:
        return f"{type(e).__name__}: {e}"
    got = (out.get("usage") or {}).get("completion_tokens") or 0
    return None if got >= 1 else f"no tokens in {str(out)[:200]}"


def wait_tokens(lab: Lab, deadline: float) -> tuple[bool, str]:
    """Until a completion returns tokens or time.monotonic() passes `deadline`."""
    last = "not tried"
    while time.monotonic() < deadline:
        left = deadline - time.monotonic()
        why = tokens_once(lab, timeout=max(1.0, min(10.0, left)))
        if why is None:
            return True, ""
        last = why
        time.sleep(0.25)
    return False, last
