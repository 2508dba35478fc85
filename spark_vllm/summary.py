"""What a `pulumi preview` of a spark-vllm stack restarts, on which node, and why.

    pulumi preview --json --show-sames --stack S | spark-vllm summary [--format text]

On this stack a restart is expensive (a vLLM restart reloads ~120 GB of weights), so a reviewer
asks one question of every change: what restarts, where, because of which line? Pulumi's own
diff of a `remote.Command` answers it badly (pulumi/pulumi#6203, #8185, #17630). This reads
the preview's JSON digest (pkg/display/json.go: `steps[]` with `op`, `urn`, `oldState`,
`newState`, `diffReasons`, `replaceReasons`, `detailedDiff`) and writes one row per node and
role, with the action, the cause in config terms and the consequence.

What it reads of a step: the container commands' `triggers` ([facts, links]: node.py
`container_command`; the gate's are [links]), the paths of the engine's detailed diff (an
earlier release's links held the apiKey as a secret digest: both sides read "[secret]") and the
*names* of other changed properties. The apiKey is a file of its own on the API server's node
(node.py `api_key_command`): a rotation updates it in place and restarts nothing. Only triggers replace a command; any other change is an update, in
place: a container is kept (nothing restarts), a check runs again.
Facts are non-secret by construction (invariant 3); `stdin` and `connection` carry the secrets
and are only ever named, never shown. Pulumi already prints secrets as "[secret]" in this
JSON; a value still wrapped as a secret is shown as "[secret]" too.

`--show-sames` lists kept resources as steps; without it, kept Ray containers and the gate are
still named through the links of the steps that change. Stdlib only: it runs in CI and by hand
without the program's dependencies.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# pulumi pkg/resource/stack/deployment.go `computedValuePlaceholder`: known only after apply
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
# sdk/go/common/resource/sig: a serialized secret is {SIG_KEY: SECRET_SIG, "ciphertext"|...}
SIG_KEY, SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
SECRET = "[secret]"
COMMAND_TYPE = "command:remote:Command"
LIVENESS_SUFFIX = "-liveness"  # liveness.py: `<command>-liveness`, a dynamic resource
RUNNING = "running"  # liveness.py RUNNING
COMPLETE = "complete"  # liveness.py COMPLETE (a staged model)
PRESENT = "present"  # liveness.py PRESENT (a copied image)

PREFLIGHT, HEAD, WORKER, GATE, VLLM = "preflight", "Ray head", "Ray worker", "gate", "vLLM"
RANK = "vLLM rank"  # backend native: a headless rank (native_group.py); rank 0 is VLLM
API_KEY = "API key"  # node.py api_key_command: the key's file on the API server's node
IMAGES, MODEL, COPY = "image check", "model", "model copy"  # image_check.py, staging.py
IMAGE_COPY = "image copy"  # image_staging.py: the head's image to one node (imageStaging copy)
MEMORY = "memory check"  # memory_check.py
FABRIC = "fabric check"  # fabric_check.py: a dynamic resource, and its gate (no row of its own)
FABRIC_CHECK, FABRIC_GATE = "fabric-check", "fabric-gate"
ROLE_ORDER = (PREFLIGHT, IMAGE_COPY, IMAGES, MODEL, COPY, MEMORY, FABRIC, HEAD, WORKER, GATE, RANK, API_KEY,
              VLLM)
CHECKS = (PREFLIGHT, IMAGES, MEMORY, FABRIC, GATE)  # run again, start nothing
KEEP, CREATE, REPLACE, DELETE, UPDATE = "keep", "create", "replace", "delete", "update"
# pkg/resource/deploy/step.go ops; several steps of one resource fold into the strongest
_ACTION = {
    "same": KEEP, "read": KEEP, "refresh": KEEP, "remove-pending-replace": KEEP,
    "read-replacement": KEEP, "create": CREATE, "import": CREATE, "update": UPDATE,
    "delete": DELETE, "discard": DELETE, "replace": REPLACE, "create-replacement": REPLACE,
    "delete-replaced": REPLACE, "import-replacement": REPLACE, "discard-replaced": REPLACE,
}
_STRENGTH = {KEEP: 0, UPDATE: 1, CREATE: 2, DELETE: 2, REPLACE: 3}

# Env keys the program derives from a node's own fields (spec.OWNED_ENV, commands.node_env):
# a diff of them is shown as the field a user edits, once.
DERIVED_ENV = {
    "VLLM_HOST_IP": "identityIp", "NCCL_SOCKET_IFNAME": "fabricInterface",
    "GLOO_SOCKET_IFNAME": "fabricInterface", "TP_SOCKET_IFNAME": "fabricInterface",
    "UCX_NET_DEVICES": "fabricInterface", "NCCL_IB_HCA": "ibHca",
}
_FACT_ORDER = ("identityIp", "host", "user", "image", "env", "imagePull", "model",
               "servedModelName", "tensorParallelSize", "pipelineParallelSize", "vllmArgs", "port",
               "rayPort")
# node.py `served_files`: what the API server's container runs besides the image
FILE_CAUSES = {"spark_vllm_auth.py": "the API-key middleware changed (spark_vllm_auth.py)",
               "ray_non_carry_over_env_vars.json":
                   "the env keys vLLM keeps from its ranks changed"}
API_KEY_ROTATED = "apiKey rotated: its file is written in place"
API_KEY_IN_PLACE = ("nothing restarts: its file is written in place; the API server reads "
                    "it at its next request")
API_KEY_SET, API_KEY_UNSET = "apiKey set", "apiKey unset"
# the upgrade from a release whose container links held the apiKey's secret digest
API_KEY_MOVED = "the apiKey moved to a file of its own (a rotation restarts nothing from now on)"
API_KEY_FILE_NEW = "the apiKey moves here from the API server's environment"
ARGV = "docker run line"  # a cause of its own only when no named fact explains it
# what the headline repeats after "vLLM reloads the model (node)": what the program owns
# changed, not a config key the reviewer edited
PROGRAM_CAUSES = (*FILE_CAUSES.values(), API_KEY_MOVED, f"{ARGV}:", "its triggers now hold")
SECRET_STDIN = "stdin (secret) changed: a new hfToken, SSH key or program text"
SECRET_CONNECTION = "SSH connection (secret) changed: the new key or host key is stored"
SCRIPTS = "its scripts changed (an upgrade of spark-vllm)"
RECORDED_ONCE = ("its triggers now hold what it is (its docker run line and files): replaced "
                 "once, on the upgrade from a release whose triggers did not")
NODE_ADDED, NODE_REMOVED = "node added", "node removed"
VLLM_RELOADS = "vLLM reloads the model (minutes of downtime on a Spark)"
STAGED_ON_HEAD = ("the model is found in the head's hfCache (downloaded if missing there) and "
                  "hashed where its files changed")
COPIED = "the files this node lacks are copied to it over the fabric; nothing restarts for it"
IMAGE_COPIED = ("the head's image goes to this node over the fabric, only the layers it lacks, "
                "checked by its id (nothing moves where the node holds it); nothing restarts "
                "for it")
WEIGHTS_STAY = "nothing runs: the weights stay in hfCache"
FABRIC_MEASURED = ("the fabric is measured before any container changes (a refusal stops the "
                   "up there); starts nothing")
FABRIC_STORED = "not measured again; nothing restarts"
FABRIC_REFUSED = "its last run refused: measured again"
FABRIC_REACH = "the SSH key, a node's address or the program's text is stored"
MAX_VALUE = 120  # characters of one value in a cause


class NotAPreviewError(ValueError):
    """The input is not a `pulumi preview --json` document; the message says what it is."""


@dataclass(frozen=True)
class Row:
    """One node and role: what the preview does to it, why, and what that costs."""

    node: str
    role: str  # PREFLIGHT, HEAD, WORKER, GATE or VLLM
    action: str  # keep, create, replace, delete (update: in place, nothing restarts)
    causes: tuple[str, ...]  # in config terms; empty when kept
    consequence: str  # what runs again; "" for a kept check

    @property
    def cause(self) -> str:
        return "; ".join(self.causes)


@dataclass(frozen=True)
class Summary:
    stack: str | None
    rows: tuple[Row, ...]
    errors: tuple[str, ...] = ()  # error diagnostics: the preview failed
    other_changes: int = 0  # changing resources that are no row (liveness companions, providers)
    compile_cache: str = ""  # whether a vLLM (re)start finds the nodes' compile caches warm
    backend_before: str = ""  # ray or native, as the state has it ("" when nothing ran)
    backend_after: str = ""  # as the plan has it ("" when nothing runs after)

    def changed(self) -> list[Row]:
        return [r for r in self.rows if r.action != KEEP]

    def ray_nodes(self, *actions: str) -> list[str]:
        return [r.node for r in self.rows if r.role in (HEAD, WORKER) and r.action in actions]

    @property
    def image_copies(self) -> list[str]:
        """The nodes the head's image goes to (imageStaging copy)."""
        return [r.node for r in self.rows if r.role == IMAGE_COPY and r.action in (CREATE, REPLACE)]

    def rank_nodes(self, *actions: str) -> list[str]:
        return [r.node for r in self.rows if r.role == RANK and r.action in actions]

    @property
    def native(self) -> bool:
        """The plan runs backend native (vLLM's own multi-node, no Ray) after it."""
        return self.backend_after == "native"

    @property
    def backend_switch(self) -> tuple[str, str] | None:
        """(old, new) when the plan moves the stack from one backend to the other."""
        if self.backend_before and self.backend_after and \
                self.backend_before != self.backend_after:
            return self.backend_before, self.backend_after
        return None

    @property
    def vllm(self) -> Row | None:
        return next((r for r in self.rows if r.role == VLLM and r.action != KEEP), None)

    @property
    def key_rotated(self) -> Row | None:
        """The API key's file updated in place: a rotation, which restarts nothing."""
        return next((r for r in self.rows if r.role == API_KEY and r.action == UPDATE
                     and API_KEY_ROTATED in r.causes), None)

    @property
    def is_noop(self) -> bool:
        return not self.errors and not self.changed() and not self.other_changes


# ---------------------------------------------------------------------------- reading the JSON

def _refuse(problem: str) -> NotAPreviewError:
    return NotAPreviewError(f"{problem}: expected the output of `pulumi preview --json`")


def load(text: str) -> dict[str, Any]:
    """Parse and check one `pulumi preview --json` document (raises NotAPreviewError)."""
    if not text.strip():
        raise _refuse("empty input")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data" and '"sequence"' in text.lstrip().splitlines()[0]:
            raise _refuse("a stream of engine events (`--json` of up or destroy, or an event "
                          "log), not a preview") from None
        raise _refuse(f"not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    check(doc)
    return doc  # type: ignore[no-any-return]


def check(doc: Any) -> None:
    """Refuse what is not a preview digest, naming what it looks like instead."""
    if not isinstance(doc, dict):
        raise _refuse(f"a JSON {type(doc).__name__}, not an object")
    if "deployment" in doc and "version" in doc:
        raise _refuse("a `pulumi stack export` document, not a preview")
    if not {"steps", "changeSummary", "diagnostics"} & doc.keys():
        raise _refuse("no `steps`, `changeSummary` or `diagnostics` "
                      f"(keys: {', '.join(sorted(doc)) or 'none'})")
    steps = doc.get("steps") or []
    if not isinstance(steps, list):
        raise _refuse("`steps` is not a list")
    for i, step in enumerate(steps):
        if not (isinstance(step, dict) and isinstance(step.get("op"), str)
                and isinstance(step.get("urn"), str)):
            raise _refuse(f"steps[{i}] has no `op` and `urn`")


def _clean(value: Any) -> Any:
    """The value with every secret (a serialized secret object or "[secret]") as SECRET."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return SECRET
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


@dataclass
class _Resource:
    """The steps of one URN, folded."""

    name: str
    type: str
    action: str
    old: dict[str, Any] | None  # inputs
    new: dict[str, Any] | None
    changed: set[str]  # top-level property names the engine says differ
    paths: set[str]  # the detailed diff's paths (e.g. triggers[1].apiKey)
    states: list[Any]  # every `state` output seen (liveness companions)
    last: str | None = None  # the fabric check's outcome in the old state (fabric_check.py)


def _urn_parts(urn: str) -> tuple[str, str, str]:
    """(stack, type, name) of `urn:pulumi:STACK::PROJECT::[PARENT$]TYPE::NAME`."""
    parts = urn.split("::")
    stack = parts[0].removeprefix("urn:pulumi:") if parts else ""
    qualified = parts[2] if len(parts) > 3 else ""
    return stack, qualified.rsplit("$", 1)[-1], parts[-1]


def _top_key(path: str) -> str:
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def _inputs(state: Any) -> dict[str, Any] | None:
    if not isinstance(state, dict):
        return None
    props = state.get("inputs")
    if not isinstance(props, dict) or not props:
        props = state.get("outputs")
    return _clean(props) if isinstance(props, dict) else None


def _fold(steps: list[dict[str, Any]]) -> dict[str, _Resource]:
    out: dict[str, _Resource] = {}
    for step in steps:
        _, typ, name = _urn_parts(step["urn"])
        action = _ACTION.get(step["op"], UPDATE)  # an op unknown to us: assume a change
        res = out.setdefault(step["urn"],
                             _Resource(name, typ, KEEP, None, None, set(), set(), []))
        old, new = _inputs(step.get("oldState")), _inputs(step.get("newState"))
        if _STRENGTH[action] >= _STRENGTH[res.action]:
            res.action = action
            res.old, res.new = old or res.old, new or res.new
        if action != KEEP:
            res.changed |= {str(k) for k in step.get("diffReasons") or []}
            res.changed |= {str(k) for k in step.get("replaceReasons") or []}
            res.changed |= {_top_key(p) for p in step.get("detailedDiff") or {}}
            res.paths |= {str(p) for p in step.get("detailedDiff") or {}}
        for state in (step.get("oldState"), step.get("newState")):
            if isinstance(state, dict) and isinstance(state.get("outputs"), dict):
                res.states.append(_clean(state["outputs"].get("state")))
        old_out = (step.get("oldState") or {}).get("outputs")
        if isinstance(old_out, dict) and isinstance(old_out.get("outcome"), str):
            res.last = old_out["outcome"]
    return out


# ------------------------------------------------------------------------------- what changed

def _role(name: str) -> tuple[str, str | None] | None:
    """Role and node of a command by its name (program.py: nodes' `<node>-preflight`,
    RayCluster "ray", VllmService "vllm"); the head's node comes from its facts."""
    if name.endswith("-preflight"):
        return PREFLIGHT, name.removesuffix("-preflight")
    if name.startswith("ray-worker-"):
        return WORKER, name.removeprefix("ray-worker-")
    if name.startswith("model-copy-"):
        return COPY, name.removeprefix("model-copy-")
    if name.startswith("image-copy-"):
        return IMAGE_COPY, name.removeprefix("image-copy-")
    if name.startswith("vllm-rank-"):
        return RANK, name.removeprefix("vllm-rank-")
    return {"ray-head": (HEAD, None), "ray-gate": (GATE, None), "vllm-serve": (VLLM, None),
            "vllm-leader": (VLLM, None), "vllm-api-key": (API_KEY, None),
            "image-check": (IMAGES, None), "model-stage": (MODEL, None),
            "memory-check": (MEMORY, None), FABRIC_CHECK: (FABRIC, None)}.get(name)


def _split(role: str, props: dict[str, Any] | None) -> tuple[dict[str, Any] | None,
                                                             dict[str, Any]]:
    """(facts, links) of a command's triggers; facts None when not in spark-vllm's shape."""
    triggers = (props or {}).get("triggers")
    if not isinstance(triggers, list):
        return None, {}
    dicts = [t if isinstance(t, dict) else None for t in triggers]
    if role == GATE:
        return {}, (dicts[0] or {}) if dicts else {}
    if role in (IMAGES, MEMORY, FABRIC, API_KEY):
        return (dicts[0] if dicts else None), {}
    facts = dicts[0] if dicts else None
    links = dicts[1] if len(dicts) > 1 and dicts[1] is not None else {}
    return facts, links


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
_MEMORY_NODE = {"ip": "identityIp", "user": "user", "port": "port", "hostKey": "hostKey"}


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
    said = {"nodes", "autoLength", "flags", *_MEMORY_FACTS}
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


# An earlier release's links: the serving container's held the apiKey's secret digest
# (`apiKey`), a native headless rank's rank 0's (`rank0ApiKey`); the engine names the path it
# differs at, the values are both "[secret]". Today's hold neither (node.py api_key_command).
API_KEYS = {"apiKey": API_KEY_MOVED, "rank0ApiKey": API_KEY_MOVED}
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


# fabric_commands.py `triggers`, each node's entry: its keys as the config names them
_FABRIC_NODE = {"identity": "identityIp", "interface": "fabricInterface", "ibHca": "ibHca"}


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


_Command = tuple[str, str | None, _Resource]  # role, node (None: the head's), steps


def _classify(resources: dict[str, _Resource]) -> tuple[list[_Command], dict[str, str], int]:
    """The commands with a role; the containers a refresh saw dead (by command name), from
    their liveness companions; how many other resources change."""
    commands: list[_Command] = []
    dead: dict[str, str] = {}
    other = 0
    for res in resources.values():
        if res.name == FABRIC_GATE:
            continue  # the fabric check's verdict, passed on: said by the check's row
        role = _role(res.name) if res.type == COMMAND_TYPE or res.name == FABRIC_CHECK else None
        if role:
            commands.append((role[0], role[1], res))
            continue
        if res.name.endswith(LIVENESS_SUFFIX) and (state := _dead_state(res.states)):
            dead[res.name.removesuffix(LIVENESS_SUFFIX)] = state
        if res.action != KEEP and res.type != "pulumi:pulumi:Stack":
            other += 1
    return commands, dead, other


def _natural(name: str) -> tuple[Any, ...]:
    """node-2 before node-10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _place(commands: list[_Command]) -> tuple[list[str], dict[tuple[str, str], _Resource | None]]:
    """Nodes in order (the head first, then by name) and every (node, role) seen: by its own
    step, or, for a kept container without one (no --show-sames), by the links of a command
    that changes."""
    head = next((str(facts["node"]) for role, _, res in commands
                 if role in (HEAD, VLLM, API_KEY)
                 for facts in (_split(role, res.new)[0], _split(role, res.old)[0])
                 if facts and facts.get("node")), "head")
    found: dict[tuple[str, str], _Resource | None] = {}
    for role, node, res in commands:
        found[(node or head, role)] = res
        for props in (res.old, res.new):
            for key in _split(role, props)[1]:
                if key in ("rayHead", "gate"):
                    found.setdefault((head, HEAD if key == "rayHead" else GATE), None)
                elif key.startswith("rayWorker@"):
                    found.setdefault((key.removeprefix("rayWorker@"), WORKER), None)
                elif key.startswith("rank@"):
                    found.setdefault((key.removeprefix("rank@"), RANK), None)
    others = sorted({node for node, _ in found} - {head}, key=_natural)
    return [head, *others], found


def summarize(preview: dict[str, Any], stack: str | None = None) -> Summary:
    """Rows per node and role from one `pulumi preview --json` document (NotAPreviewError if
    it is not one)."""
    check(preview)
    resources = _fold(list(preview.get("steps") or []))
    stack = stack or next((_urn_parts(u)[0] for u in resources if _urn_parts(u)[0]), None)
    commands, dead, other = _classify(resources)
    order, found = _place(commands)
    actions: dict[str, set[str]] = {}
    for (node, _), res in found.items():
        actions.setdefault(node, set()).add(res.action if res else KEEP)
    rows: list[Row] = []
    for (node, role), res in found.items():
        action = res.action if res else KEEP
        if role in (PREFLIGHT, IMAGE_COPY, IMAGES, MODEL, COPY, MEMORY, FABRIC, API_KEY) \
                and action == KEEP:
            continue  # a kept check, or weights that stay where they are, say nothing
        causes = causes_of(role, res, dead.get(res.name), actions[node] == {DELETE},
                           actions[node] == {CREATE}) if res else ()
        then = consequence(role, action)
        if role == FABRIC and res and action == UPDATE and not fabric_reruns(res):
            then = FABRIC_STORED
        rows.append(Row(node, role, action, causes, then))
    if any(API_KEY_MOVED in r.causes for r in rows):  # the upgrade that made the key's file
        rows = [Row(r.node, r.role, r.action, (API_KEY_FILE_NEW,), r.consequence)
                if r.role == API_KEY and r.action == CREATE else r for r in rows]
    rows.sort(key=lambda r: (order.index(r.node), ROLE_ORDER.index(r.role)))
    errors = tuple(str(d.get("message", "")).strip() for d in preview.get("diagnostics") or []
                   if isinstance(d, dict) and d.get("severity") == "error")
    vllm = next((res for (_, role), res in found.items() if role == VLLM and res), None)
    before, after = _backends(commands)
    return Summary(stack, tuple(rows), errors, other, cache_note(vllm), before, after)


def _backends(commands: list[_Command]) -> tuple[str, str]:
    """The backend before and after the plan, from the containers' facts (a Ray container's
    facts have no backend: Ray)."""
    def of(props: dict[str, Any] | None, role: str) -> str:
        facts, _ = _split(role, props)
        if not facts:
            return ""
        return str(facts.get("backend") or "ray")

    before = after = ""
    for role, _, res in commands:
        if role not in (HEAD, WORKER, RANK, VLLM):
            continue
        if res.action != CREATE:
            before = before or of(res.old, role)
        if res.action != DELETE:
            after = after or of(res.new, role)
    return before, after


# what vLLM's torch.compile cache keys on, among the facts (vllm/compilation/backends.py: the
# vLLM config's hash covers the model, the parallel layout and the flags)
_COMPILE_KEYS = ("model", "tensorParallelSize", "pipelineParallelSize", "vllmArgs")


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

def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _ranks_stop(nodes: list[str]) -> str:
    return (f"vLLM's headless rank{'s stop' if len(nodes) > 1 else ' stops'} on "
            f"{', '.join(nodes)}")


def headline(s: Summary, markdown: bool = False) -> str:
    """One line: what restarts, loudest first."""
    def loud(text: str) -> str:
        return f"**{text}**" if markdown else text

    if s.errors:
        return loud("The preview failed") + ": no plan, so nothing is known about restarts."
    if s.is_noop:
        return "No change: nothing restarts."
    parts = []
    if (v := s.vllm) and v.action != UPDATE:  # an update keeps it: said below
        what = {REPLACE: "vLLM reloads the model", CREATE: "vLLM loads the model",
                DELETE: "vLLM stops"}.get(v.action, "vLLM changes in place")
        # what the program owns that vLLM runs, said here: no config line of the PR shows it
        why = [c for c in v.causes if c.startswith(PROGRAM_CAUSES)] \
            if v.action == REPLACE else []
        parts.append(f"{loud(what)} ({v.node})" + (f": {'; '.join(why)}" if why else ""))
    if switch := s.backend_switch:
        parts.insert(0, loud(f"The backend changes from {switch[0]} to {switch[1]}")
                     + ": every container is replaced, the old ones stopped on every node first")
    ranks: list[str] = []  # a new node's rank starts (as a Ray worker does): it never ran
    if restarted_ranks := s.rank_nodes(REPLACE):
        ranks.append(f"vLLM's headless ranks restart on {', '.join(restarted_ranks)}")
    if new_ranks := s.rank_nodes(CREATE):
        ranks.append(f"vLLM's headless rank{'s start' if len(new_ranks) > 1 else ' starts'} on "
                     f"{', '.join(new_ranks)}")
    parts += [f"{ranks[0]} (no Ray)", *ranks[1:]] if ranks else []
    if restarted := s.ray_nodes(REPLACE):
        parts.append(f"Ray restarts on {_count(len(restarted), 'node')}")
    if started := s.ray_nodes(CREATE):
        parts.append(f"Ray starts on {', '.join(started)}")
    if stopped := s.ray_nodes(DELETE):
        parts.append(f"Ray stops on {', '.join(stopped)}")
    if gone := s.rank_nodes(DELETE):
        parts.append(_ranks_stop(gone))
    if images := s.image_copies:
        parts.append(f"the head's image is copied to {', '.join(images)}")
    if copies := [r.node for r in s.changed() if r.role == COPY and r.action in (CREATE, REPLACE)]:
        parts.append(f"the model is copied to {', '.join(copies)}")
    elif any(r.role == MODEL and r.action in (CREATE, REPLACE) for r in s.changed()):
        parts.append("the model is staged again on the head")
    if parts and not (restarted or started or stopped) and not s.native:
        parts.append("Ray keeps running")
    rotated = s.key_rotated
    if parts and rotated:
        parts.append(f"the apiKey is rotated in place ({rotated.node})")
    if not parts:
        checks = [r for r in s.changed() if r.role in CHECKS]
        if rotated:
            return (f"Nothing restarts: the apiKey is rotated in place (its file on "
                    f"{rotated.node}; the API server reads it at its next request)"
                    + ("; checks run again." if checks else "."))
        if [r for r in s.changed() if r.action == UPDATE and r.role in (HEAD, WORKER, RANK, VLLM)]:
            return ("Nothing restarts: every container is kept (updated in place)"
                    + ("; checks run again." if checks else "."))
        return ("Nothing restarts: only checks run again." if checks else
                f"Nothing restarts: {_count(s.other_changes, 'resource')} change in place.")
    return " · ".join(parts)


_VLLM_SAYS = {REPLACE: "yes (reloads the model: minutes of downtime on a Spark)",
              CREATE: "yes (loads the model: minutes on a Spark)",
              DELETE: "stops (the endpoint is gone)", UPDATE: "no (changes in place)"}


def what_restarts(s: Summary) -> str:
    ray = s.ray_nodes(REPLACE, CREATE)
    ranks = s.rank_nodes(REPLACE, CREATE)
    if s.native:
        line = (f"What restarts (backend native, no Ray): vLLM's headless ranks on "
                f"{_count(len(ranks), 'node')} ({', '.join(ranks)})" if ranks else
                "What restarts (backend native, no Ray): no headless rank")
    else:
        line = (f"What restarts: Ray on {_count(len(ray), 'node')} ({', '.join(ray)})" if ray
                else "What restarts: Ray on no node")
    v = s.vllm
    line += f"; vLLM: {_VLLM_SAYS.get(v.action, 'yes') if v else 'no'}."
    if stopped := s.ray_nodes(DELETE):
        line += f" Ray stops on {', '.join(stopped)}."
    if gone := s.rank_nodes(DELETE):
        line += f" {_ranks_stop(gone)}."
    if switch := s.backend_switch:
        line += (f" The backend changes from {switch[0]} to {switch[1]}: each node's preflight "
                 f"stops the {switch[0]} backend's containers there before any new one starts.")
    if images := s.image_copies:
        line += (f" The head's image copied to {', '.join(images)} (only the layers they lack; "
                 "nothing where a node holds its id).")
    if copies := [r.node for r in s.changed() if r.role == COPY and r.action in (CREATE, REPLACE)]:
        line += f" Weights copied to {', '.join(copies)} (only the files they lack)."
    if rotated := s.key_rotated:
        line += (f" The apiKey's file on {rotated.node} is written in place: no container "
                 "restarts for it.")
    if s.compile_cache:
        line += " " + s.compile_cache
    return line


_CONFIG_CHANGE = re.compile(r"^(?:--)?[A-Za-z][\w.@\[\]-]*: ")  # a key or a vLLM flag


def _md_cell(text: str, code: bool = False) -> str:
    if not text:
        return "–"
    if code:
        fence = "``" if "`" in text else "`"
        cell = f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"
    else:
        cell = html.escape(text, quote=False)
    return cell.replace("|", "\\|")


def render_markdown(s: Summary) -> str:
    lines = [f"### spark-vllm preview: stack `{s.stack}`", ""] if s.stack else []
    lines.append(headline(s, markdown=True))
    if s.errors:
        for err in s.errors:
            fence = "````" if "```" in err else "```"
            lines += ["", fence, err, fence]
        return "\n".join(lines) + "\n"
    if s.is_noop:
        return "\n".join(lines) + "\n"
    lines += ["", "| node | role | action | cause | consequence |", "|---|---|---|---|---|"]
    for r in s.rows:
        cause = "<br>".join(_md_cell(c, code=bool(_CONFIG_CHANGE.match(c))) for c in r.causes)
        action = r.action if r.action == KEEP else f"**{r.action}**"
        lines.append(f"| {_md_cell(r.node)} | {_md_cell(r.role)} | {action} | {cause or '–'} "
                     f"| {_md_cell(r.consequence)} |")
    lines += ["", what_restarts(s)]
    return "\n".join(lines) + "\n"


def render_text(s: Summary) -> str:
    lines = [f"stack {s.stack}: {headline(s)}" if s.stack else headline(s)]
    if s.errors:
        return "\n".join([*lines, "", *s.errors]) + "\n"
    if s.is_noop:
        return lines[0] + "\n"
    table = [("NODE", "ROLE", "ACTION", "CAUSE", "CONSEQUENCE")]
    table += [(r.node, r.role, r.action, r.cause or "-", r.consequence or "-") for r in s.rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines.append("")
    for row in table:
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                                row[4]]).rstrip())
    lines += ["", what_restarts(s)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, prog: str = "python -m spark_vllm.summary") -> int:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Summarize `pulumi preview --json` of a spark-vllm stack: what restarts, "
                    "on which node, and why. Exit 0: summarized; 2: not a preview document.")
    ap.add_argument("--format", choices=("markdown", "text"), default="markdown")
    ap.add_argument("--stack", help="stack name for the title (default: from the URNs)")
    ap.add_argument("file", nargs="?", default="-",
                    help="the JSON written by `pulumi preview --json` (default: stdin)")
    args = ap.parse_args(argv)
    source = "stdin" if args.file == "-" else args.file
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        summary = summarize(load(text), stack=args.stack)
    except OSError as err:
        print(f"summary: cannot read {source}: {err.strerror or err}", file=sys.stderr)
        return 2
    except (NotAPreviewError, UnicodeDecodeError) as err:
        print(f"summary: {source}: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render_markdown(summary) if args.format == "markdown"
                     else render_text(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
