"""Why a command changes, in config terms, and what that costs (spark_vllm/summary.py): its
triggers' facts and links old against new, an update's changed inputs, the fabric check's
verdicts, the compile cache's note."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from .summary_model import (
    _COMPILE_KEYS,
    _FABRIC_NODE,
    _FACT_ORDER,
    _MEMORY_NODE,
    API_KEY,
    API_KEY_IN_PLACE,
    API_KEY_ROTATED,
    API_KEY_SET,
    API_KEY_UNSET,
    API_KEYS,
    ARGV,
    COMPLETE,
    COPIED,
    COPY,
    CREATE,
    DELETE,
    DERIVED_ENV,
    FABRIC,
    FABRIC_MEASURED,
    FABRIC_REACH,
    FABRIC_REFUSED,
    FILE_CAUSES,
    GATE,
    GATEWAY,
    HEAD,
    IMAGE_COPIED,
    IMAGE_COPY,
    IMAGES,
    KEEP,
    MAX_VALUE,
    MEMORY,
    MODEL,
    NODE_ADDED,
    NODE_REMOVED,
    PRESENT,
    RANK,
    RECORDED_ONCE,
    REPLACE,
    RUNNING,
    SCRIPTS,
    SECRET,
    SECRET_CONNECTION,
    SECRET_STDIN,
    STAGED_ON_HEAD,
    UNKNOWN,
    UPDATE,
    VLLM,
    VLLM_RELOADS,
    WEIGHTS_STAY,
    WORKER,
    _Resource,
    _split,
)


def show(value: Any) -> str:
    """A config value as a reviewer reads it; never more than MAX_VALUE characters."""
    if value is None:
        text = "(unset)"
    elif value == UNKNOWN:
        text = "(known after apply)"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, list):
        text = " ".join(show(v) for v in value) if value else "(none)"
    elif isinstance(value, dict):
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    else:
        text = str(value)
    text = " ".join(text.split())  # one line in a table
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 1] + "…"


def _change(key: str, old: Any, new: Any) -> str:
    return f"{key}: {show(old)} → {show(new)}"


def fact_causes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old → new` for every fact that differs, env keys one by one."""
    if "argv" in new and "argv" not in old and old:
        return [RECORDED_ONCE]  # state written before the facts held the docker run line
    keys = [k for k in _FACT_ORDER if k in old or k in new]
    keys += sorted((old.keys() | new.keys()) - set(_FACT_ORDER) - {"node"})
    causes: list[str] = []
    for key in keys:
        if old.get(key) == new.get(key) or key == "argv":
            continue
        old_env, new_env = old.get(key) or {}, new.get(key) or {}
        if key == "env" and isinstance(old_env, dict) and isinstance(new_env, dict):
            causes += _env_causes(old_env, new_env, causes)
        elif key == "files" and isinstance(old_env, dict) and isinstance(new_env, dict):
            causes += [FILE_CAUSES.get(f, f"{f} changed")
                       for f in sorted(old_env.keys() | new_env.keys())
                       if old_env.get(f) != new_env.get(f)]
        else:
            causes.append(_change(key, old.get(key), new.get(key)))
    if not causes and old.get("argv") != new.get("argv"):
        causes.append(argv_cause(old.get("argv"), new.get("argv")))
    return causes


def argv_cause(old: Any, new: Any) -> str:
    """The container's `docker run` line changed and no named fact says why (an upgrade of
    spark-vllm that runs the container differently): the words it lost and gained."""
    if not isinstance(old, list) or not isinstance(new, list):
        return _change(ARGV, old, new)
    lost = [w for w in old if w not in new]
    gained = [w for w in new if w not in old]
    return f"{ARGV}: " + show([*(f"-{w}" for w in lost), *(f"+{w}" for w in gained)]
                              or ["(reordered)"])


# memory_check.py `payload`: its keys as the config (or vLLM, for a flag) names them
_MEMORY_FACTS = {"model": "model", "revision": "modelRevision", "hf": "hfCache",
                 "tp": "tensorParallelSize", "pp": "pipelineParallelSize",
                 "utilization": "--gpu-memory-utilization"}
def node_causes(old: dict[str, Any], new: dict[str, Any], labels: dict[str, str],
                once: bool = False) -> list[str]:
    """A check's `nodes` (objects with a `name`) in config terms: the list when nodes come or
    go, then each node's changed field as `nodes[NAME].FIELD: old → new` (`labels`: a fact's
    name as the config spells it), an `env` map key by key (a derived key said as its field,
    once). `once`: a change seen on every node is said once, without the node. Shown whole,
    the objects would be cut off past MAX_VALUE."""
    def by_name(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
        nodes = facts.get("nodes")
        return {str(n.get("name")): n for n in nodes if isinstance(n, dict)} \
            if isinstance(nodes, list) else {}

    old_nodes, new_nodes = by_name(old), by_name(new)
    causes = [_change("nodes", list(old_nodes), list(new_nodes))] \
        if list(old_nodes) != list(new_nodes) else []
    per_node: dict[str, list[str]] = {}
    for name in (n for n in new_nodes if n in old_nodes):
        was, now = old_nodes[name], new_nodes[name]
        said = per_node.setdefault(name, [])
        for key in sorted(was.keys() | now.keys()):
            if was.get(key) == now.get(key):
                continue
            if key == "env" and isinstance(was.get(key), dict) and isinstance(now.get(key), dict):
                said += [c for c in _env_causes(was[key], now[key], [])
                         if not c.startswith(tuple(f"{f}:" for f in labels.values()))]
            else:
                said.append(_change(labels.get(key, key), was.get(key), now.get(key)))
    for name, said in per_node.items():
        for c in said:
            everywhere = once and len(per_node) > 1 and all(c in o for o in per_node.values())
            text = c if everywhere else f"nodes[{name}].{c}"
            causes += [text] if text not in causes else []
    return causes


def memory_causes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The memory check's facts in config terms: its nodes by name (node_causes), a vLLM flag
    as vLLM spells it."""
    causes = node_causes(old, new, _MEMORY_NODE)
    for key, label in _MEMORY_FACTS.items():
        if old.get(key) != new.get(key):
            causes.append(_change(label, old.get(key), new.get(key)))
    if bool(old.get("autoLength")) != bool(new.get("autoLength")):
        causes.append(_change("maxModelLen", "auto" if old.get("autoLength") else "(not auto)",
                              "auto" if new.get("autoLength") else "(not auto)"))
    old_flags, new_flags = (f if isinstance(f := facts.get("flags"), dict) else {}
                            for facts in (old, new))
    for key in sorted(old_flags.keys() | new_flags.keys()):  # memory_check.py FLAGS
        if old_flags.get(key) != new_flags.get(key):
            causes.append(_change("--" + key.replace("_", "-"), old_flags.get(key),
                                  new_flags.get(key)))
    # several models (memory_check.py `_model`): each model's facts, said as its own
    old_models, new_models = ({str(m.get("key")): m for m in ms if isinstance(m, dict)}
                              if isinstance(ms := facts.get("models"), list) else {}
                              for facts in (old, new))
    if list(old_models) != list(new_models):
        causes.append(_change("models", list(old_models), list(new_models)))
    for key in (k for k in new_models if k in old_models):
        causes += [f"models[{key}].{c}" for c in memory_causes(old_models[key], new_models[key])
                   if not c.startswith("containers:")]
    said = {"nodes", "autoLength", "flags", "models", *_MEMORY_FACTS}
    causes += [_change(k, old.get(k), new.get(k))
               for k in sorted((old.keys() | new.keys()) - said) if old.get(k) != new.get(k)]
    return causes


def _env_causes(old: dict[str, Any], new: dict[str, Any], already: list[str]) -> list[str]:
    out: list[str] = []
    for key in sorted(old.keys() | new.keys()):
        if old.get(key) == new.get(key):
            continue
        if key in DERIVED_ENV:  # say it once, as the node field
            field = DERIVED_ENV[key]
            if not any(c.startswith(field + ":") for c in (*already, *out)):
                out.append(_change(field, old.get(key), new.get(key)))
        else:
            out.append(_change(f"env.{key}", old.get(key), new.get(key)))
    return out


def _link_label(key: str) -> str:
    if key == "rayHead":
        return "the Ray head"
    if key == "gate":
        return "the gate"
    if key.startswith("rayWorker@"):
        return f"Ray worker {key.removeprefix('rayWorker@')}"
    if key == "headCopy":
        return "the head's copy of the model"
    if key.startswith("rank@"):
        return f"vLLM rank on {key.removeprefix('rank@')}"
    if key.startswith("liveness@vllm-rank-"):  # native: the group goes as one
        return f"the group's rank on {key.removeprefix('liveness@vllm-rank-')} (seen dead)"
    if key == "liveness@vllm-leader":
        return "the group's rank 0 (seen dead)"
    if key == "rank0":
        return "rank 0"
    return key


def _member(key: str) -> str:
    """The native group's `liveness@<member>` link of a member added or removed as the member's
    own link (`rank@<node>`): its liveness was not seen dead, it is new or gone."""
    if key.startswith("liveness@vllm-rank-"):
        return f"rank@{key.removeprefix('liveness@vllm-rank-')}"
    return "rank0" if key == "liveness@vllm-leader" else key


def _link_order(key: str) -> tuple[int, str]:
    return ({"rayHead": 0, "gate": 2, "liveness": 3}.get(key, 1), key)


def link_causes(old: dict[str, Any], new: dict[str, Any], dead: str | None,
                seen: str = "container was") -> tuple[list[str], list[str], list[str]]:
    """From the ids a command's triggers hold: (its container died: the liveness companion is
    replaced, workers added or removed, what it is replaced with)."""
    died: list[str] = []
    moved: list[str] = []
    cascade: list[str] = []
    for key in sorted(old.keys() | new.keys(), key=_link_order):
        if key in API_KEYS:  # a secret digest: its change is read from the diff's paths
            continue
        if old.get(key) == new.get(key) and new.get(key) != UNKNOWN:
            continue
        if key == "liveness":
            died.append(f"{seen} {dead}" if dead else "its liveness check is replaced")
        elif key not in old or key not in new:  # a member of the native group: by its rank
            said = f"{_link_label(_member(key))} {'added' if key not in old else 'removed'}"
            moved += [said] if said not in moved else []
        else:
            cascade.append(_link_label(key))
    if len(cascade) > 1 and "the gate" in cascade:
        cascade.remove("the gate")  # the gate is replaced only because a Ray container is
    return died, moved, cascade


def _because(items: list[str]) -> str:
    said = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return f"replaced because {said} {'is' if len(items) == 1 else 'are'}"


_API_KEY_PATH = re.compile(r"\b(apiKey|rank0ApiKey)\b")


def update_causes(role: str, res: _Resource) -> tuple[str, ...]:
    """Why a command changes in place: what it is did not change (its triggers), so nothing
    restarts; a container is kept, a check runs again with the new inputs."""
    causes = []
    for key in sorted(res.changed):
        if key == "connection":
            causes.append(SECRET_CONNECTION)
        elif key == "stdin" and role == API_KEY:  # its stdin is the key, nothing else
            causes.append(API_KEY_ROTATED)
        elif key == "stdin":
            causes.append(SECRET_STDIN if role not in (IMAGES, MEMORY, COPY, IMAGE_COPY) else
                          "stdin (secret) changed: the SSH key, how the head reaches the "
                          "nodes, or its program")
        elif key == "create" and role == GATE:  # gate_script holds the preflights' reports
            causes.append("the preflights' reports it compares are read again")
        elif key in ("create", "update", "delete"):
            causes += [SCRIPTS] if SCRIPTS not in causes else []
        else:
            causes.append(f"{key} changed")
    return tuple(causes) or ("changed in place",)


def causes_of(role: str, res: _Resource, dead: str | None, node_gone: bool,
              node_new: bool) -> tuple[str, ...]:
    """Why `res` is created, replaced or deleted, in the user's terms: a dead container, the
    config keys that changed, a rotated secret, workers added or removed; and only when none
    of those, the chain ("replaced because the Ray head is") or the script that changed."""
    if res.action == KEEP:
        return ()
    if res.action == CREATE:
        return (NODE_ADDED,) if node_new else (API_KEY_SET,) if role == API_KEY else \
            ("new in the program",)
    if res.action == DELETE:
        return (NODE_REMOVED,) if node_gone else (API_KEY_UNSET,) if role == API_KEY else \
            ("removed from the program",)
    if role == FABRIC and res.action == UPDATE:
        return fabric_causes(res)
    if res.action == UPDATE:
        return update_causes(role, res)
    old_facts, old_links = _split(role, res.old)
    new_facts, new_links = _split(role, res.new)
    if old_facts is None or new_facts is None:
        return ("triggers changed shape (an upgrade of spark-vllm)",)
    seen = ("the node's copy was" if role in (MODEL, COPY) else
            "the node's image was" if role == IMAGE_COPY else "container was")
    died, moved, cascade = link_causes(old_links, new_links, dead, seen)
    if dead and not died:
        died.append(f"{seen} {dead}")
    facts = memory_causes if role == MEMORY else fact_causes
    causes = [*died, *facts(old_facts, new_facts)]
    if cascade and causes and all(c.startswith(f"{ARGV}:") for c in causes[len(died):]):
        del causes[len(died):]  # its line names what it runs on (the head's address): moved
    causes += sorted({API_KEYS[m.group(1)] for p in res.paths
                      if (m := _API_KEY_PATH.search(p))})
    causes += moved
    if not causes and cascade:
        causes.append(_because(cascade))
    if not causes:
        named = sorted(res.changed - {"triggers"})
        causes += ["start script changed (an upgrade of spark-vllm)" if k == "create"
                   else f"{k} changed" for k in named]
    return tuple(causes) or ("replaced (the preview does not say why)",)


def fabric_reruns(res: _Resource) -> bool:
    """Whether the fabric check's update measures again (fabric_check.py `reruns`)."""
    return res.last == "refuse" or (res.old or {}).get("triggers") != (res.new or {}).get(
        "triggers")


def fabric_causes(res: _Resource) -> tuple[str, ...]:
    """Why the fabric check changes in place, in config terms: what it measures changed (then
    it measures again), its last run refused, or only how it reaches the nodes."""
    if not fabric_reruns(res):
        return (FABRIC_REACH,)
    old, _ = _split(FABRIC, res.old)
    new, _ = _split(FABRIC, res.new)
    if old is None or new is None:
        return ("triggers changed shape (an upgrade of spark-vllm)",)
    causes = [FABRIC_REFUSED] if res.last == "refuse" else []
    causes += node_causes(old, new, _FABRIC_NODE, once=True)
    settings: list[dict[str, Any]] = [
        v if isinstance(v := f.get("settings"), dict) else {} for f in (old, new)]
    causes += [_change(f"fabricCheck.{k}", settings[0].get(k), settings[1].get(k))
               for k in sorted(settings[0].keys() | settings[1].keys())
               if settings[0].get(k) != settings[1].get(k)]
    if old.get("script") != new.get("script"):
        causes.append("its script changed (an upgrade of spark-vllm)")
    causes += [_change(k, old.get(k), new.get(k))
               for k in sorted((old.keys() | new.keys()) - {"nodes", "settings", "script"})
               if old.get(k) != new.get(k)]
    return tuple(causes) or ("measured again",)


def consequence(role: str, action: str) -> str:
    if role in (HEAD, WORKER):
        return {KEEP: "keeps running", CREATE: "Ray starts on this node",
                REPLACE: "Ray restarted on this node", DELETE: "Ray stopped on this node",
                UPDATE: "nothing restarts"}[action]
    if role == RANK:
        return {KEEP: "keeps running", CREATE: "a headless vLLM rank loads its part (no Ray)",
                REPLACE: "its headless vLLM rank restarts and reloads its part (no Ray)",
                DELETE: "its vLLM rank stops", UPDATE: "nothing restarts"}[action]
    if role == API_KEY:
        return {KEEP: "", CREATE: "the key's file is written (0600) before vLLM starts",
                REPLACE: "the key's file is written again", DELETE: "the key's file is removed",
                UPDATE: API_KEY_IN_PLACE}[action]
    if role == GATEWAY:
        return {KEEP: "keeps routing", CREATE: "the gateway starts (seconds)",
                REPLACE: "the gateway restarts (seconds); the models keep serving",
                DELETE: "the gateway stops: the endpoint is gone",
                UPDATE: "nothing restarts"}[action]
    if role == VLLM:
        return {KEEP: "keeps serving", CREATE: "vLLM loads the model (minutes on a Spark)",
                REPLACE: VLLM_RELOADS, DELETE: "vLLM stops: the endpoint is gone",
                UPDATE: "nothing restarts"}[action]
    # an update runs `create` again with the new inputs (no `update`: node.py node_command)
    if role == MODEL:
        return {KEEP: "", CREATE: STAGED_ON_HEAD, REPLACE: STAGED_ON_HEAD,
                DELETE: WEIGHTS_STAY, UPDATE: STAGED_ON_HEAD}[action]
    if role == COPY:
        return {KEEP: "", CREATE: COPIED, REPLACE: COPIED, DELETE: WEIGHTS_STAY,
                UPDATE: COPIED}[action]
    if role == IMAGE_COPY:
        return {KEEP: "", CREATE: IMAGE_COPIED, REPLACE: IMAGE_COPIED,
                DELETE: "the image stays on the node", UPDATE: IMAGE_COPIED}[action]
    if role == FABRIC:
        return {KEEP: "", CREATE: FABRIC_MEASURED, REPLACE: FABRIC_MEASURED,
                UPDATE: FABRIC_MEASURED, DELETE: "nothing runs (a check)"}[action]
    if role == MEMORY and action in (CREATE, REPLACE, UPDATE):
        return "vLLM's memory is estimated again against each node's free memory, first"
    if action == UPDATE:
        return "runs again (a check); nothing restarts"
    return "" if action == KEEP else "nothing runs (a check)"


def _dead_state(states: Iterable[Any]) -> str | None:
    return next((s for s in states if isinstance(s, str)
                 and s not in (RUNNING, COMPLETE, PRESENT, SECRET)), None)


def cache_note(res: _Resource | None) -> str:
    """Warm or cold: what a vLLM that starts finds in the nodes' compileCache."""
    if res is None or res.action not in (CREATE, REPLACE):
        return ""
    new, _ = _split(VLLM, res.new)
    old, _ = _split(VLLM, res.old)
    if not new or "compileCache" not in new:
        return ""
    cache = new["compileCache"]
    if cache == "none":
        return "vLLM starts cold: compileCache is none (the caches live in the containers)."
    if res.action == CREATE or not old:
        return f"Compile caches: kept in {cache} on each node from this start on."
    if old.get("image") != new.get("image") or old.get("imageDigest") != new.get("imageDigest"):
        return (f"vLLM starts cold: the image changes, so each node's compile cache ({cache}) "
                "is cleared.")
    if old.get("compileCache") != cache:
        return f"vLLM starts cold: compileCache moves to {cache}."
    if keys := [k for k in _COMPILE_KEYS if old.get(k) != new.get(k)]:
        return (f"vLLM compiles again for the new {', '.join(keys)} (its cache keys on them); "
                f"what else it needs is warm in {cache}.")
    return f"Warm restart: each node's compile cache ({cache}) is kept."


# ---------------------------------------------------------------------------------- rendering
