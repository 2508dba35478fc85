"""The summary's words (spark_vllm/summary.py): roles, actions, the causes and consequences it
writes, the rows and the plan it builds, and which command a resource is (its name, its
triggers' facts and links)."""

from __future__ import annotations

from dataclasses import dataclass
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
GATEWAY = "gateway"  # gateway.py: several models' one endpoint, on the head
ROLE_ORDER = (PREFLIGHT, IMAGE_COPY, IMAGES, MODEL, COPY, MEMORY, FABRIC, HEAD, WORKER, GATE,
              RANK, API_KEY, VLLM, GATEWAY)
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

    def copied_to(self, role: str) -> list[str]:
        """The nodes a copy (COPY: the weights, IMAGE_COPY: the head's image) runs to."""
        return [r.node for r in self.rows if r.role == role and r.action in (CREATE, REPLACE)]

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
            "memory-check": (MEMORY, None), FABRIC_CHECK: (FABRIC, None),
            "gateway": (GATEWAY, None), "gateway-api-key": (API_KEY, None)}.get(name)


def model_keys(names: list[str]) -> list[str]:
    """The served models of a stack with several (spark_vllm/components/several.py names each
    model's group `vllm-<name>` and its staging `model-<name>`), longest first."""
    keys = {n[len("vllm-"):-len("-leader")] for n in names
            if n.startswith("vllm-") and n.endswith("-leader") and n != "vllm-leader"}
    return sorted(keys, key=len, reverse=True)


def model_role(name: str, keys: list[str]) -> tuple[str, str | None, str | None] | None:
    """Role, node and served model of a command by its name: a model's commands are named as
    a single-model stack's with `<name>-` after their first word."""
    for key in keys:
        for word in ("vllm-", "model-"):
            if name.startswith(f"{word}{key}-"):
                base = _role(word + name[len(word) + len(key) + 1:])
                return (base[0], base[1], key) if base else None
    base = _role(name)
    return (base[0], base[1], None) if base else None


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


_MEMORY_NODE = {"ip": "identityIp", "user": "user", "port": "port", "hostKey": "hostKey"}


# An earlier release's links: the serving container's held the apiKey's secret digest
# (`apiKey`), a native headless rank's rank 0's (`rank0ApiKey`); the engine names the path it
# differs at, the values are both "[secret]". Today's hold neither (node.py api_key_command).
API_KEYS = {"apiKey": API_KEY_MOVED, "rank0ApiKey": API_KEY_MOVED}
# fabric_commands.py `triggers`, each node's entry: its keys as the config names them
_FABRIC_NODE = {"identity": "identityIp", "interface": "fabricInterface", "ibHca": "ibHca"}


_Command = tuple[str, str | None, _Resource]  # role, node (None: the head's), steps


# what vLLM's torch.compile cache keys on, among the facts (vllm/compilation/backends.py: the
# vLLM config's hash covers the model, the parallel layout and the flags)
_COMPILE_KEYS = ("model", "tensorParallelSize", "pipelineParallelSize", "vllmArgs")
