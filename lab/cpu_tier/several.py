"""The CPU tier's `several` part: two models on the two nodes behind the program's gateway, with
the program's own rendered commands (lab/cpu_tier/runner.py runs it; README.md says what it
recorded).

- `big`: TP 2 across both nodes (a headless rank on n1, rank 0 and its API server on n0);
- `small`: TP 1 on n1 alone (its API server there);
- the gateway (LiteLLM's proxy, render/gateway_commands.py) on n0, the stack's `port`, run by
  the tier's docker shim from a venv of its own (lab/cpu_tier/gateway_venv.sh) under the tag
  GATEWAY_IMAGE, as a node runs the gateway's image.

Each container is started in the order the program's graph allows (components/several.py): a
model's headless ranks, its key file, its rank 0; the gateway's key file and the gateway. Then,
every request made from inside n0 (the node the gateway is on, which reaches n1 over the
fabric): `/v1/models` through the gateway, a chat to each model through it, a streamed one,
which model's server counted each request (vLLM's own `vllm:request_success_total`), the API
key on the gateway and on each model's own server, the env inside every rank of both models
(lab/gpu/envprobe), and each model's liveness read on its node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from lab.gpu import runner as gpu
from spark_vllm.components import spec as specmod
from spark_vllm.components.render import api_key_commands, commands, gateway_commands
from spark_vllm.components.render.backends import native as native_backend

if TYPE_CHECKING:
    from lab.cpu_tier.runner import CpuTier

GATEWAY_IMAGE = "spark-vllm-gateway:cpu-tier"  # the shim maps it to the gateway's venv
# big across both nodes, small on n1 alone: each model's vLLM args are the tier's (VLLM_ARGS)
LAYOUT = (("big", 2, ("n0", "n1")), ("small", 1, ("n1",)))

# One HTTP request from inside a node's namespaces (the machine reaches n0 only): argv[1] is
# {"url", "method", "body", "key", "stream", "timeout"}; prints {"status", "body" | "events"}.
REQUEST = r"""
import json, sys, urllib.error, urllib.request
q = json.loads(sys.argv[1])
headers = {"Content-Type": "application/json"}
if q.get("key"):
    headers["Authorization"] = "Bearer " + q["key"]
data = json.dumps(q["body"]).encode() if q.get("body") is not None else None
req = urllib.request.Request(q["url"], data=data, headers=headers, method=q["method"])
out = {}
try:
    with urllib.request.urlopen(req, timeout=q["timeout"]) as resp:
        out["status"] = resp.status
        if q.get("stream"):
            out["events"] = [ln.decode(errors="replace").strip() for ln in resp
                             if ln.strip().startswith(b"data:")]
        else:
            out["body"] = resp.read().decode(errors="replace")
except urllib.error.HTTPError as err:
    out.update(status=err.code, body=err.read().decode(errors="replace")[:500])
except OSError as err:
    out.update(status=None, error=f"{type(err).__name__}: {err}"[:300])
print(json.dumps(out))
"""


def spec_several(tier: CpuTier) -> specmod.ClusterSpec:
    """The stack with `models:` (docs/configuration.md#several-models) on the tier's nodes."""
    raw = tier.raw2("native")
    model, args = raw.pop("model"), raw.pop("vllmArgs")
    del raw["tensorParallelSize"]
    raw["models"] = [{"name": name, "model": model, "servedModelName": name,
                      "tensorParallelSize": tp, "nodes": list(on), "vllmArgs": args}
                     for name, tp, on in LAYOUT]
    raw["gateway"] = {"image": GATEWAY_IMAGE, "imagePull": "never", "requestTimeout": 120}
    return specmod.parse_spec(raw, "cpu", gpu.SECRETS)


def gateway_image(venv: str) -> dict[str, dict[str, Any]]:
    """The shim's image map entry: the gateway's venv first on PATH, bound into its container
    (it lives under ~/.cache, private in every container), and nothing of vLLM's venv."""
    return {GATEWAY_IMAGE: {
        "env": {"PATH": f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONPATH": "", "VIRTUAL_ENV": venv},
        "dirs": [venv]}}


def request(tier: CpuTier, url: str, method: str = "GET", body: Any = None,
            key: str | None = gpu.API_KEY, stream: bool = False, node: str = "n0",
            timeout: float = 120) -> dict[str, Any]:
    n = tier.nodes[node]
    q = {"url": url, "method": method, "body": body, "key": key, "stream": stream,
         "timeout": timeout}
    start = gpu.now()
    proc = subprocess.run(tier.nodes.argv(n, [sys.executable, "-c", REQUEST, json.dumps(q)]),
                          capture_output=True, text=True, timeout=timeout + 30,
                          env={**os.environ, **tier.nodes.env(n)})
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    out: dict[str, Any] = (json.loads(last) if last else
                           {"status": None, "error": proc.stderr[-300:] or "no output"})
    out["seconds"] = round(gpu.now() - start, 3)
    if out.get("status") == 200 and "body" in out:
        try:
            out["json"] = json.loads(out["body"])
            del out["body"]
        except ValueError:
            pass  # not JSON (/metrics): the text stays in body
    return out


def success_total(tier: CpuTier, v: specmod.ClusterSpec) -> float | None:
    """vLLM's own count of the requests this model's server finished (every finish reason)."""
    r = request(tier, f"http://{v.head.identity_ip}:{v.port}/metrics", timeout=30)
    text = r.get("body") if r.get("status") == 200 else None
    if text is None:
        return None
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("vllm:request_success_total"))


def delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def start_model(tier: CpuTier, v: specmod.ClusterSpec) -> dict[str, Any]:
    """A model's group as NativeGroup starts it: headless ranks, its key file, rank 0."""
    head = v.head.name
    out: dict[str, Any] = {"node": head, "ranks": []}
    for n in v.nodes[1:]:
        r = tier.sh(native_backend.rank_start_script(v, n),
                    commands.secret_env_file(commands.RANK, gpu.HF_TOKEN), node=n.name,
                    timeout=v.join_timeout + 60)
        out["ranks"].append({"node": n.name, "rc": r["rc"], "seconds": r["seconds"],
                             "stderr": r["stderr"][-10:]})
    key = tier.sh(api_key_commands.api_key_script(v, v.head),
                  api_key_commands.api_key_text(gpu.API_KEY), node=head, timeout=60)
    out["api_key"] = {"rc": key["rc"]}
    serve = tier.sh(native_backend.leader_start_script(v), commands.vllm_stdin(gpu.HF_TOKEN),
                    node=head, timeout=v.vllm_timeout + v.join_timeout + 60)
    out.update(rc=serve["rc"], seconds=serve["seconds"], stderr=serve["stderr"][-20:],
               log=tier.node_log(commands.container_name(v, commands.LEADER), head, keep=15))
    return out


def start_gateway(tier: CpuTier, s: specmod.ClusterSpec) -> dict[str, Any]:
    key = tier.sh(api_key_commands.api_key_script(s, s.head),
                  api_key_commands.api_key_text(gpu.API_KEY), node=s.head.name, timeout=60)
    r = tier.sh(gateway_commands.start(s), gateway_commands.stdin(s), node=s.head.name,
                timeout=gateway_commands.READY_TIMEOUT_S + 60)
    name = commands.container_name(s, gateway_commands.GATEWAY)
    log = tier.docker("logs", name, node=s.head.name).stdout.splitlines()
    return {"api_key": {"rc": key["rc"]}, "rc": r["rc"], "seconds": r["seconds"],
            "stderr": r["stderr"][-20:], "log": [ln[:300] for ln in log[-15:]]}


def through_gateway(tier: CpuTier, s: specmod.ClusterSpec) -> dict[str, Any]:
    """/v1/models, a chat to each model and a streamed one, through the gateway; which model's
    server counted each chat."""
    gw = f"http://{s.head.identity_ip}:{s.port}"
    views = {v.model_key: v for v in s.views()}
    listed = request(tier, f"{gw}/v1/models")
    out: dict[str, Any] = {"models": {
        "status": listed.get("status"), "seconds": listed["seconds"],
        "ids": sorted(m["id"] for m in listed.get("json", {}).get("data", []))}}
    for name in views:
        before = {k: success_total(tier, v) for k, v in views.items()}
        body = {"model": name, "max_tokens": 8,
                "messages": [{"role": "user", "content": "spark-vllm several models"}]}
        r = request(tier, f"{gw}/v1/chat/completions", "POST", body)
        after = {k: success_total(tier, v) for k, v in views.items()}
        j = r.get("json") or {}
        out[f"chat_{name}"] = {
            "status": r.get("status"), "seconds": r["seconds"], "model": j.get("model"),
            "completion_tokens": (j.get("usage") or {}).get("completion_tokens"),
            "text": ((j.get("choices") or [{}])[0].get("message") or {}).get("content"),
            "error": r.get("body") if r.get("status") != 200 else None,
            "counted_by": {k: delta(before[k], after[k]) for k in views}}
    body = {"model": "small", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "spark-vllm stream"}]}
    r = request(tier, f"{gw}/v1/chat/completions", "POST", body, stream=True)
    events = r.get("events") or []
    out["stream_small"] = {"status": r.get("status"), "events": len(events),
                           "done": bool(events) and events[-1] == "data: [DONE]",
                           "first": events[0][:300] if events else None}
    return out


def api_keys(tier: CpuTier, s: specmod.ClusterSpec) -> dict[str, Any]:
    """The API key on the gateway (every route but LiteLLM's liveness probe) and on each
    model's own server: the statuses for no key, a wrong one and the stack's."""
    def statuses(url: str, method: str = "GET", body: Any = None) -> dict[str, Any]:
        return {who: request(tier, url, method, body, key=k, timeout=60).get("status")
                for who, k in (("none", None), ("wrong", "sk-wrong"), ("key", gpu.API_KEY))}

    gw = f"http://{s.head.identity_ip}:{s.port}"
    chat = {"model": "big", "max_tokens": 1, "messages": [{"role": "user", "content": "key"}]}
    out: dict[str, Any] = {
        "gateway /v1/models": statuses(f"{gw}/v1/models"),
        "gateway POST /v1/chat/completions": statuses(f"{gw}/v1/chat/completions", "POST", chat),
        "gateway /health/liveliness": request(tier, f"{gw}/health/liveliness",
                                              key=None).get("status")}
    for v in s.views():
        out[f"{v.model_key} /v1/models"] = statuses(
            f"http://{v.head.identity_ip}:{v.port}/v1/models")
    return out


def several_part(tier: CpuTier) -> None:
    s = spec_several(tier)
    views = s.views()
    tier.clear_probe()
    def on(fn: Any, v: specmod.ClusterSpec) -> Any:
        return lambda: fn(v)

    for v in views:
        tier.record(f"several_{v.model_key}_serve", on(lambda w: start_model(tier, w), v))
    tier.record("several_gateway_start", lambda: start_gateway(tier, s))
    tier.record("several_through_gateway", lambda: through_gateway(tier, s))
    tier.record("several_api_keys", lambda: api_keys(tier, s))
    tier.record("several_rank_env", tier.rank_env2)
    for v in views:
        tier.record(f"several_{v.model_key}_liveness",
                    on(lambda w: tier.liveness(w, node=w.head.name), v))

    def cleanup() -> dict[str, Any]:
        out: dict[str, Any] = {"gateway": tier.sh(gateway_commands.remove(s), node=s.head.name,
                                                  timeout=60)}
        for v in views:
            out[f"{v.model_key}-leader"] = tier.sh(
                commands.remove_script(v, v.head, commands.LEADER), node=v.head.name, timeout=60)
            for n in v.nodes[1:]:
                out[f"{v.model_key}-rank-{n.name}"] = tier.sh(
                    commands.remove_script(v, n, commands.RANK), node=n.name, timeout=60)
        return {k: {"rc": r["rc"], "seconds": r["seconds"]} for k, r in out.items()}

    tier.record("several_cleanup", cleanup)
