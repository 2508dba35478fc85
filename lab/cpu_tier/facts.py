"""What the program depends on in multi-node vLLM, read out of the CPU tier's observations
(real vLLM or vllm-sim): tests/cpu_tier/test_sim_fidelity.py runs the tier's runner against
vllm-sim and asserts `facts(sim) == facts(real)` fact by fact, as the GPU tier's facts do for
one node (lab/gpu/facts.py). Times are the hardware's: only the bounds the program's waits rely
on are facts (the gate within rayTimeout, the incident stopped before vllmTimeout).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# the env keys of a rank that say which node's fabric it uses, and who holds secrets
RANK_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
             "VLLM_HOST_IP", "VLLM_API_KEY", "SPARK_VLLM_API_KEY_FILE", "HF_TOKEN",
             "VLLM_RPC_BASE_PATH")


def load(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _err(r: dict) -> str:
    return "\n".join(line for _, line in r.get("stderr", []))


def _state(s: str | None) -> str:
    """A liveness state without its numbers: "wedged: no token for the canary in 10 s, …"
    -> "wedged"; "exited (1)" stays (the exit code is behaviour)."""
    if not s:
        return str(s)
    return s.split(":", 1)[0]


def _ranks(procs: list[dict]) -> dict[str, list[dict]]:
    """Per node, the distinct envs of vLLM's processes there (their count is the
    implementation's: real vLLM has an API server, an engine core and workers)."""
    out: dict[str, list[dict]] = {}
    for p in procs:
        if not p.get("alive"):  # ended before it was read: its node is not known
            continue
        env = {k: p["env"].get(k) for k in RANK_KEYS}
        if env not in out.setdefault(str(p["node"]), []):
            out[str(p["node"])].append(env)
    return {n: sorted(v, key=lambda e: json.dumps(e, sort_keys=True)) for n, v in out.items()}


def facts(obs: dict[str, Any]) -> dict[str, Any]:
    sc = obs["scenarios"]
    f: dict[str, Any] = {}
    if "incident_vllm_v1" in sc:
        r, gate = sc["incident_vllm_v1"], sc["incident_gate"]
        err, gerr = _err(r), _err(gate)
        pinned = re.findall(r"'node:([0-9.]+)': 0\.001", err)
        f["incident: the seeds' Ray starts"] = (sc["incident_head_start"]["rc"],
                                                 sc["incident_worker_start"]["rc"])
        f["incident: V1 executor, VLLM_HOST_IP not Ray's: vLLM serves"] = r["rc"] == 0
        f["incident: vLLM waits for a placement group"] = (
            "Waiting for creating a placement group" in err)
        f["incident: the group pins node:<VLLM_HOST_IP>"] = sorted(set(pinned)) == [
            r.get("vllm_host_ip")]
        # the program's words changed when its verdict moved from the waiting line to Ray's
        # state (the committed real recording has the former): the fact is that its failure
        # says vLLM's pin, VLLM_HOST_IP, is no Ray node's address
        f["incident: the program names the pinned IP"] = (
            "the IP vLLM pins (VLLM_HOST_IP) is not a Ray node" in err
            or f"vLLM pins its placement group to node:{r.get('vllm_host_ip')} (its "
               f"VLLM_HOST_IP, {r.get('vllm_host_ip')}) and Ray has no node with that address"
            in err)
        f["incident: stopped before vllmTimeout"] = r["seconds"] < 120
        f["incident: the gate passes"] = gate["rc"] == 0
        f["incident: the gate names the missing fabric addresses"] = sorted(
            re.findall(r"(10\.99\.0\.\d+) .*MISSING", gerr))
        f["incident: the gate names Ray's registrations"] = sorted(
            re.findall(r"(10\.98\.0\.\d+) .*registered under an address the spec does not use",
                       gerr))
        f["incident: the gate within rayTimeout"] = gate["seconds"] <= 15 + 15
    for b in ("ray", "native"):
        if f"{b}_serve" not in sc:
            continue
        chat = sc[f"{b}_chat"]
        f[f"{b}: TP 2 across the nodes serves"] = sc[f"{b}_serve"]["rc"] == 0
        f[f"{b}: a chat answers"] = chat.get("status")
        f[f"{b}: liveness while serving"] = sc[f"{b}_liveness_serving"].get("state")
        if f"{b}_key_rotation" in sc:  # statuses for no key, the first key, the rotated one
            kr = sc[f"{b}_key_rotation"]
            for step in ("before", "rotated", "back"):
                f[f"{b}: apiKey file {step}: 401/200 for none, first, rotated"] = (
                    kr[step].get("none"), kr[step].get("first"), kr[step].get("rotated"),
                    kr[step].get("write_rc", 0))
            f[f"{b}: apiKey rotation restarts the API container"] = (
                kr["started_before"] != kr["started_after"])
        f[f"{b}: the env each node's ranks see"] = _ranks(
            sc[f"{b}_rank_env"]["processes"])
        fr = sc[f"{b}_frozen_remote_rank"]
        f[f"{b}: frozen rank's node"] = fr.get("rank", {}).get("node")
        f[f"{b}: /health while a remote rank is frozen"] = fr.get("health_while_frozen")
        f[f"{b}: liveness while a remote rank is frozen"] = _state(
            fr.get("liveness_while_frozen", {}).get("state"))
        f[f"{b}: a canary after SIGCONT answers"] = (
            fr.get("canary_after_sigcont", {}).get("first_token_s") is not None)
        k = sc[f"{b}_killed_remote_rank"]
        f[f"{b}: killed remote rank: the API container ends"] = (k.get("final") or [None, ""])[1]
        f[f"{b}: killed remote rank: liveness"] = _state(k.get("liveness_after"))
        if b == "native":
            f["native: killed remote rank: the headless container"] = (
                k.get("rank_container", "").split(" ")[0])
        f[f"{b}: removes succeed"] = all(v["rc"] == 0 for v in sc[f"{b}_cleanup"].values()
                                             if isinstance(v, dict))
    return f


def several_facts(obs: dict[str, Any]) -> dict[str, Any]:
    """The `several` part (lab/cpu_tier/several.py): two models behind the gateway."""
    sc = obs["scenarios"]
    f: dict[str, Any] = {}
    if "several_gateway_start" not in sc:
        return f
    models = sorted(k.split("_")[1] for k in sc if k.startswith("several_")
                    and k.endswith("_serve"))
    for m in models:
        r = sc[f"several_{m}_serve"]
        f[f"several: {m}: its ranks and rank 0 start"] = (
            [(x["node"], x["rc"]) for x in r["ranks"]], r["api_key"]["rc"], r["rc"])
        f[f"several: {m}: liveness on its node"] = _state(sc[f"several_{m}_liveness"].get("state"))
    f["several: the gateway starts"] = (sc["several_gateway_start"]["api_key"]["rc"],
                                        sc["several_gateway_start"]["rc"])
    g = sc["several_through_gateway"]
    f["several: /v1/models through the gateway"] = (g["models"]["status"], g["models"]["ids"])
    for m in models:
        c = g[f"chat_{m}"]
        f[f"several: a chat to {m} through the gateway"] = (
            c["status"], c["model"], (c["completion_tokens"] or 0) > 0)
        f[f"several: the chat to {m} is counted by"] = c["counted_by"]
    st = g["stream_small"]
    f["several: a stream through the gateway"] = (st["status"], st["events"] > 1, st["done"])
    f["several: API key statuses"] = {k: v for k, v in sc["several_api_keys"].items()
                                      if k != "scenario_seconds"}
    f["several: the env each node's ranks see"] = _ranks(sc["several_rank_env"]["processes"])
    f["several: removes succeed"] = all(v["rc"] == 0 for v in sc["several_cleanup"].values()
                                        if isinstance(v, dict))
    return f
