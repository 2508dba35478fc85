"""The reviewer's summary of a preview (spark_vllm/summary.py) on real `pulumi preview --json
--show-sames` documents of the 2-node lab stack, one per change kind and backend, captured by
`make captures` (lab/captures.sh: `python -m lab.capture_previews`) into
tests/fixtures/previews/ (backend ray) and tests/fixtures/previews/native/ (backend native:
rank 0 'vLLM' on node-1, a headless 'vLLM rank' on every other node, no Ray), never written by
hand: for each, the exact rows (node, role, action, cause, consequence), the headline, what
restarts, the memory check and whether vLLM starts warm or cold. Every expected row is also
held to the capture's own steps (test_the_expected_rows_are_the_captures_plan)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from lab import config
from spark_vllm import summary
from spark_vllm.components import spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "previews"
BACKENDS = ("ray", "native")
KINDS = ("noop", "env", "identity", "image", "vllm-arg", "node-added", "node-removed",
         "secret-rotated", "ssh-key-rotated", "model")
BOTH_BACKENDS = [(b, k) for b in BACKENDS for k in KINDS]

# what `python -m lab up` writes and lab.capture_previews changes
NODE1 = config.node_addrs(1, config.DEFAULT_MGMT_SUBNET, config.DEFAULT_FABRIC_SUBNET)
IMAGE, OTHER_IMAGE = config.INNER_IMAGE, f"{config.INNER_IMAGE}-{config.LEGACY_SIM_VLLM_VERSION}"
IDENTITY = f"identityIp: {NODE1.fabric_ip} → {NODE1.spare_ip}"
IMAGE_CHANGE = f"image: {IMAGE} → {OTHER_IMAGE}"
ENV = "env.NCCL_DEBUG: WARN → INFO"
LAB_MODEL = config.LAB_MODEL
MODEL_CHANGE = f"model: {LAB_MODEL} → lab/other-model"
SERVED_CHANGE = f"servedModelName: {LAB_MODEL} → lab/other-model"
MAX_LEN = "vllmArgs: (none) → --max-model-len 8192"
NODES_ADDED = "nodes: node-1 node-2 → node-1 node-2 node-3"
NODES_REMOVED = "nodes: node-1 node-2 → node-1"
TP_3, TP_1 = "tensorParallelSize: 2 → 3", "tensorParallelSize: 2 → 1"
# backend native: rank 0's address (masterPort's default, spec.py), in every member's facts
MASTER = f"master: {NODE1.fabric_ip}:29501 → {NODE1.spare_ip}:29501"

RAY, CHECK, RELOAD = "Ray restarted on this node", "nothing runs (a check)", summary.VLLM_RELOADS
RANK = "its headless vLLM rank restarts and reloads its part (no Ray)"
BOTH = "replaced because the Ray head and Ray worker node-2 are"
HEAD_KEPT = ("node-1", "Ray head", "keep", "", "keeps running")
GATE_KEPT = ("node-1", "gate", "keep", "", "")
VLLM_KEPT = ("node-1", "vLLM", "keep", "", "keeps serving")
WORKER_KEPT = ("node-2", "Ray worker", "keep", "", "keeps running")
RANK_KEPT = ("node-2", "vLLM rank", "keep", "", "keeps running")
# an update in place (node.py node_command): a check runs again, a container is kept
AGAIN, KEPT = "runs again (a check); nothing restarts", "nothing restarts"
CONN = summary.SECRET_CONNECTION
HEAD_STDIN = "stdin (secret) changed: the SSH key, how the head reaches the nodes, or its program"
IMAGES_AGAIN = ("node-1", "image check", "update", HEAD_STDIN, AGAIN)
KEY_ROTATED = ("node-1", "API key", "update", summary.API_KEY_ROTATED, summary.API_KEY_IN_PLACE)
ROTATED_IN_PLACE = ("Nothing restarts: the apiKey is rotated in place (its file on node-1; "
                    "the API server reads it at its next request).")


def ssh_key_rotated(*containers: tuple[str, str]) -> Rows:
    """A new deploy key: every command is updated in place, nothing restarts."""
    return [
        ("node-1", "preflight", "update", CONN, AGAIN),
        ("node-1", "image check", "update", f"{CONN}; {HEAD_STDIN}", AGAIN),
        ("node-1", "model", "update", CONN, summary.STAGED_ON_HEAD),
        ("node-1", "memory check", "update", f"{CONN}; {HEAD_STDIN}", MEMORY_AGAIN),
        FABRIC_KEY,
        *[(node, role, "update", CONN if role != "gate" else
           f"{CONN}; the preflights' reports it compares are read again",
           AGAIN if role == "gate" else summary.API_KEY_IN_PLACE if role == "API key" else KEPT)
          for node, role in containers if node == "node-1"],
        ("node-2", "preflight", "update", CONN, AGAIN),
        ("node-2", "model copy", "update", f"{CONN}; {HEAD_STDIN}", summary.COPIED),
        *[(node, role, "update", CONN, KEPT) for node, role in containers if node == "node-2"],
    ]

# The memory check (components/memory_check.py) re-runs when what it estimates changes (the
# model, vLLM's memory flags, the nodes and their layout), first, on the head; it is in no
# container's triggers, so it starts nothing. Its cause is said in config terms, per node.
MEMORY_AGAIN = "vLLM's memory is estimated again against each node's free memory, first"
MEMORY_CAUSES = {  # the kinds whose capture plans it, both backends
    "identity": f"nodes[node-1].identityIp: {NODE1.fabric_ip} → {NODE1.spare_ip}",
    "vllm-arg": "--max-model-len: (unset) → 8192",
    "node-added": f"{NODES_ADDED}; {TP_3}",
    "node-removed": f"{NODES_REMOVED}; {TP_1}",
    "model": MODEL_CHANGE,
}


def memory_row(kind: str) -> tuple[str, str, str, str, str]:
    return ("node-1", "memory check", "replace", MEMORY_CAUSES[kind], MEMORY_AGAIN)


# The fabric check (components/fabric_check.py) is updated in place, on the head's row: it
# measures again when what it measures changes (the nodes' env, identities, the image, the
# nodes), before any container changes; it starts nothing. One node left: nothing to check.
def fabric_row(cause: str) -> tuple[str, str, str, str, str]:
    return ("node-1", "fabric check", "update", cause, summary.FABRIC_MEASURED)


FABRIC_GONE = ("node-1", "fabric check", "delete", "removed from the program", CHECK)
FABRIC_KEY = ("node-1", "fabric check", "update", summary.FABRIC_REACH, summary.FABRIC_STORED)


Rows = list[tuple[str, str, str, str, str]]
EXPECTED: dict[str, Rows] = {
    "noop": [HEAD_KEPT, GATE_KEPT, VLLM_KEPT, WORKER_KEPT],
    "env": [
        fabric_row(ENV),
        ("node-1", "Ray head", "replace", ENV, RAY),
        ("node-1", "gate", "replace", BOTH, CHECK),
        ("node-1", "vLLM", "replace", ENV, RELOAD),
        ("node-2", "Ray worker", "replace", ENV, RAY),
    ],
    "identity": [
        ("node-1", "preflight", "replace", IDENTITY, CHECK),
        IMAGES_AGAIN,  # where it asks the nodes is its stdin: it runs again
        memory_row("identity"),
        fabric_row(f"nodes[node-1].{IDENTITY}"),
        ("node-1", "Ray head", "replace", IDENTITY, RAY),
        ("node-1", "gate", "replace", BOTH, CHECK),
        ("node-1", "vLLM", "replace", IDENTITY, RELOAD),
        ("node-2", "Ray worker", "replace", "replaced because the Ray head is", RAY),
    ],
    # the memory check estimates no image: it is kept
    "image": [
        ("node-1", "preflight", "replace", IMAGE_CHANGE, CHECK),
        ("node-1", "image check", "replace", IMAGE_CHANGE, CHECK),
        # it downloads with the image when the model is missing: it looks again (hashing
        # nothing that did not change), and no copy runs for it
        ("node-1", "model", "replace", IMAGE_CHANGE, summary.STAGED_ON_HEAD),
        fabric_row(IMAGE_CHANGE),
        ("node-1", "Ray head", "replace", IMAGE_CHANGE, RAY),
        ("node-1", "gate", "replace", BOTH, CHECK),
        ("node-1", "vLLM", "replace", IMAGE_CHANGE, RELOAD),
        ("node-2", "preflight", "replace", IMAGE_CHANGE, CHECK),
        ("node-2", "Ray worker", "replace", IMAGE_CHANGE, RAY),
    ],
    "vllm-arg": [
        memory_row("vllm-arg"),
        HEAD_KEPT, GATE_KEPT,
        ("node-1", "vLLM", "replace", MAX_LEN, RELOAD),
        WORKER_KEPT,
    ],
    "node-added": [
        ("node-1", "image check", "replace", NODES_ADDED, CHECK),
        memory_row("node-added"),
        fabric_row(NODES_ADDED),
        HEAD_KEPT,
        ("node-1", "gate", "replace", "Ray worker node-3 added", CHECK),
        ("node-1", "vLLM", "replace", f"{TP_3}; Ray worker node-3 added", RELOAD),
        WORKER_KEPT,
        ("node-3", "preflight", "create", "node added", CHECK),
        ("node-3", "model copy", "create", "node added", summary.COPIED),
        ("node-3", "Ray worker", "create", "node added", "Ray starts on this node"),
    ],
    "node-removed": [
        ("node-1", "image check", "replace", NODES_REMOVED, CHECK),
        memory_row("node-removed"),
        FABRIC_GONE,
        HEAD_KEPT,
        ("node-1", "gate", "replace", "Ray worker node-2 removed", CHECK),
        ("node-1", "vLLM", "replace", f"{TP_1}; Ray worker node-2 removed", RELOAD),
        ("node-2", "preflight", "delete", "node removed", CHECK),
        ("node-2", "model copy", "delete", "node removed", summary.WEIGHTS_STAY),
        ("node-2", "Ray worker", "delete", "node removed", "Ray stopped on this node"),
    ],
    # the key's file is written in place (node.py api_key_command): no container restarts
    "secret-rotated": [
        HEAD_KEPT, GATE_KEPT, KEY_ROTATED, VLLM_KEPT, WORKER_KEPT,
    ],
    "ssh-key-rotated": ssh_key_rotated(("node-1", "Ray head"), ("node-1", "gate"),
                                       ("node-1", "API key"), ("node-1", "vLLM"),
                                       ("node-2", "Ray worker")),
    # the one change that moves weights: staged again on the head, copied to node-2, and vLLM
    # reloads; Ray keeps running
    "model": [
        ("node-1", "model", "replace", MODEL_CHANGE, summary.STAGED_ON_HEAD),
        memory_row("model"),
        HEAD_KEPT, GATE_KEPT,
        ("node-1", "vLLM", "replace", f"{MODEL_CHANGE}; {SERVED_CHANGE}", RELOAD),
        ("node-2", "model copy", "replace", MODEL_CHANGE, summary.COPIED),
        WORKER_KEPT,
    ],
}
# Backend native: the group goes as one (native_group.py), so every kind that replaces rank 0
# replaces the headless rank too, and no Ray row is ever there.
NATIVE_EXPECTED: dict[str, Rows] = {
    "noop": [VLLM_KEPT, RANK_KEPT],
    "env": [
        fabric_row(ENV),
        ("node-1", "vLLM", "replace", ENV, RELOAD),
        ("node-2", "vLLM rank", "replace", ENV, RANK),
    ],
    # rank 0's address moves: the headless rank follows it (its `master`)
    "identity": [
        ("node-1", "preflight", "replace", IDENTITY, CHECK),
        IMAGES_AGAIN,
        memory_row("identity"),
        fabric_row(f"nodes[node-1].{IDENTITY}"),
        ("node-1", "vLLM", "replace", f"{IDENTITY}; {MASTER}", RELOAD),
        ("node-2", "vLLM rank", "replace", MASTER, RANK),
    ],
    "image": [
        ("node-1", "preflight", "replace", IMAGE_CHANGE, CHECK),
        ("node-1", "image check", "replace", IMAGE_CHANGE, CHECK),
        ("node-1", "model", "replace", IMAGE_CHANGE, summary.STAGED_ON_HEAD),
        fabric_row(IMAGE_CHANGE),
        ("node-1", "vLLM", "replace", IMAGE_CHANGE, RELOAD),
        ("node-2", "preflight", "replace", IMAGE_CHANGE, CHECK),
        ("node-2", "vLLM rank", "replace", IMAGE_CHANGE, RANK),
    ],
    # every rank runs vLLM's engine arguments
    "vllm-arg": [
        memory_row("vllm-arg"),
        ("node-1", "vLLM", "replace", MAX_LEN, RELOAD),
        ("node-2", "vLLM rank", "replace", MAX_LEN, RANK),
    ],
    "node-added": [
        ("node-1", "image check", "replace", NODES_ADDED, CHECK),
        memory_row("node-added"),
        fabric_row(NODES_ADDED),
        ("node-1", "vLLM", "replace", f"{TP_3}; nnodes: 2 → 3; vLLM rank on node-3 added",
         RELOAD),
        ("node-2", "vLLM rank", "replace", f"{TP_3}; nnodes: 2 → 3; vLLM rank on node-3 added",
         RANK),
        ("node-3", "preflight", "create", "node added", CHECK),
        ("node-3", "model copy", "create", "node added", summary.COPIED),
        ("node-3", "vLLM rank", "create", "node added",
         "a headless vLLM rank loads its part (no Ray)"),
    ],
    "node-removed": [
        ("node-1", "image check", "replace", NODES_REMOVED, CHECK),
        memory_row("node-removed"),
        FABRIC_GONE,
        ("node-1", "vLLM", "replace", f"{TP_1}; nnodes: 2 → 1; vLLM rank on node-2 removed",
         RELOAD),
        ("node-2", "preflight", "delete", "node removed", CHECK),
        ("node-2", "model copy", "delete", "node removed", summary.WEIGHTS_STAY),
        ("node-2", "vLLM rank", "delete", "node removed", "its vLLM rank stops"),
    ],
    # rank 0 serves the API, and a group forms once: the key is no part of any member, so
    # its rotation restarts none (the key's file is written in place)
    "secret-rotated": [KEY_ROTATED, VLLM_KEPT, RANK_KEPT],
    "ssh-key-rotated": ssh_key_rotated(("node-1", "API key"), ("node-1", "vLLM"),
                                       ("node-2", "vLLM rank")),
    "model": [
        ("node-1", "model", "replace", MODEL_CHANGE, summary.STAGED_ON_HEAD),
        memory_row("model"),
        ("node-1", "vLLM", "replace", f"{MODEL_CHANGE}; {SERVED_CHANGE}", RELOAD),
        ("node-2", "model copy", "replace", MODEL_CHANGE, summary.COPIED),
        ("node-2", "vLLM rank", "replace", f"{MODEL_CHANGE}; {SERVED_CHANGE}", RANK),
    ],
}
TABLES = {"ray": EXPECTED, "native": NATIVE_EXPECTED}

VLLM_ONLY = "vLLM reloads the model (node-1) · Ray keeps running"
NOTHING_RESTARTS = ("Nothing restarts: every container is kept (updated in place); checks run "
                    "again.")
RESTARTS_ALL = "vLLM reloads the model (node-1) · Ray restarts on 2 nodes"
HEADLINES = {
    "noop": "No change: nothing restarts.",
    "env": RESTARTS_ALL, "identity": RESTARTS_ALL,
    "image": f"{RESTARTS_ALL} · the model is staged again on the head",
    "vllm-arg": VLLM_ONLY,
    "secret-rotated": ROTATED_IN_PLACE,
    "ssh-key-rotated": NOTHING_RESTARTS,
    "node-added": "vLLM reloads the model (node-1) · Ray starts on node-3 · the model is copied "
                  "to node-3",
    "model": "vLLM reloads the model (node-1) · the model is copied to node-2 · Ray keeps running",
    "node-removed": "vLLM reloads the model (node-1) · Ray stops on node-2",
}
GROUP = "vLLM reloads the model (node-1) · vLLM's headless ranks restart on node-2 (no Ray)"
NATIVE_HEADLINES = {
    "noop": "No change: nothing restarts.",
    "env": GROUP, "identity": GROUP, "vllm-arg": GROUP,
    "secret-rotated": ROTATED_IN_PLACE,
    "ssh-key-rotated": NOTHING_RESTARTS,
    "image": f"{GROUP} · the model is staged again on the head",
    "node-added": f"{GROUP} · vLLM's headless rank starts on node-3 · the model is copied to "
                  "node-3",
    "node-removed": "vLLM reloads the model (node-1) · vLLM's headless rank stops on node-2",
    "model": f"{GROUP} · the model is copied to node-2",
}

# Whether a vLLM that starts finds the compile cache (compileCache unset: beside the default
# hfCache, per stack) warm: its key is the model, the layout and vLLM's flags (summary.py
# _COMPILE_KEYS), so env, an address or a secret keep it; a new image clears it.
CACHE = "/root/.cache/spark-vllm-compile/lab"
WARM = f"Warm restart: each node's compile cache ({CACHE}) is kept."


def compiles_again(key: str) -> str:
    return (f"vLLM compiles again for the new {key} (its cache keys on them); what else it "
            f"needs is warm in {CACHE}.")


CACHE_NOTES = {  # the same for both backends
    "noop": "", "ssh-key-rotated": "",  # nothing starts
    "env": WARM, "identity": WARM, "secret-rotated": "",  # nothing starts
    "image": f"vLLM starts cold: the image changes, so each node's compile cache ({CACHE}) is "
             "cleared.",
    "vllm-arg": compiles_again("vllmArgs"),
    "node-added": compiles_again("tensorParallelSize"),
    "node-removed": compiles_again("tensorParallelSize"),
    "model": compiles_again("model"),
}

RELOADS = "vLLM: yes (reloads the model: minutes of downtime on a Spark)."
KEY_IN_PLACE = " The apiKey's file on node-1 is written in place: no container restarts for it."
WHAT_RESTARTS = {
    "noop": "What restarts: Ray on no node; vLLM: no.",
    "ssh-key-rotated": "What restarts: Ray on no node; vLLM: no (changes in place).",
    "env": f"What restarts: Ray on 2 nodes (node-1, node-2); {RELOADS} {WARM}",
    "identity": f"What restarts: Ray on 2 nodes (node-1, node-2); {RELOADS} {WARM}",
    "image": f"What restarts: Ray on 2 nodes (node-1, node-2); {RELOADS} {CACHE_NOTES['image']}",
    "vllm-arg": f"What restarts: Ray on no node; {RELOADS} {CACHE_NOTES['vllm-arg']}",
    "secret-rotated": f"What restarts: Ray on no node; vLLM: no.{KEY_IN_PLACE}",
    "node-added": f"What restarts: Ray on 1 node (node-3); {RELOADS} Weights copied to node-3 "
                  f"(only the files they lack). {CACHE_NOTES['node-added']}",
    "model": f"What restarts: Ray on no node; {RELOADS} Weights copied to node-2 (only the files "
             f"they lack). {CACHE_NOTES['model']}",
    "node-removed": f"What restarts: Ray on no node; {RELOADS} Ray stops on node-2. "
                    f"{CACHE_NOTES['node-removed']}",
}
NATIVE = "What restarts (backend native, no Ray):"
RANK_2 = f"{NATIVE} vLLM's headless ranks on 1 node (node-2); {RELOADS}"
NATIVE_WHAT_RESTARTS = {
    "noop": f"{NATIVE} no headless rank; vLLM: no.",
    "ssh-key-rotated": f"{NATIVE} no headless rank; vLLM: no (changes in place).",
    "env": f"{RANK_2} {WARM}",
    "identity": f"{RANK_2} {WARM}",
    "image": f"{RANK_2} {CACHE_NOTES['image']}",
    "vllm-arg": f"{RANK_2} {CACHE_NOTES['vllm-arg']}",
    "secret-rotated": f"{NATIVE} no headless rank; vLLM: no.{KEY_IN_PLACE}",
    "node-added": f"{NATIVE} vLLM's headless ranks on 2 nodes (node-2, node-3); {RELOADS} "
                  f"Weights copied to node-3 (only the files they lack). "
                  f"{CACHE_NOTES['node-added']}",
    "node-removed": f"{NATIVE} no headless rank; {RELOADS} vLLM's headless rank stops on node-2. "
                    f"{CACHE_NOTES['node-removed']}",
    "model": f"{RANK_2} Weights copied to node-2 (only the files they lack). "
             f"{CACHE_NOTES['model']}",
}


def fixture_path(kind: str, backend: str = "ray") -> Path:
    path = FIXTURES / ("native" if backend == "native" else "") / f"{kind}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: capture the previews on the lab with `make captures` "
                    "(lab/captures.sh; python -m lab.capture_previews, see its docstring)")
    return path


def preview(kind: str, backend: str = "ray") -> dict[str, Any]:
    return summary.load(fixture_path(kind, backend).read_text())


def summarized(kind: str, backend: str = "ray") -> summary.Summary:
    return summary.summarize(preview(kind, backend))


def rows(s: summary.Summary | Iterable[summary.Row]) -> Rows:
    return [(r.node, r.role, r.action, r.cause, r.consequence)
            for r in (s.rows if isinstance(s, summary.Summary) else s)]


@pytest.mark.parametrize("kind", KINDS)
def test_each_change_kind_gives_its_rows(kind: str) -> None:
    s = summarized(kind)
    assert s.stack == "lab" and s.errors == ()
    assert (s.backend_before, s.backend_after, s.native) == ("ray", "ray", False)
    assert rows(s) == EXPECTED[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_each_native_kind_gives_its_rows(kind: str) -> None:
    """Rank 0 ('vLLM', node-1) and the headless ranks ('vLLM rank', one per other node) named;
    no Ray row, no gate."""
    s = summarized(kind, "native")
    assert s.stack == "lab" and s.errors == ()
    assert (s.backend_before, s.backend_after, s.native) == ("native", "native", True)
    assert s.backend_switch is None
    assert rows(s) == NATIVE_EXPECTED[kind]
    assert not {r.role for r in s.rows} & {summary.HEAD, summary.WORKER, summary.GATE}


# resource name of a row (components/program.py and the components' names)
_RESOURCE = {"preflight": "{node}-preflight", "image check": "image-check",
             "model": "model-stage", "model copy": "model-copy-{node}",
             "memory check": "memory-check", "fabric check": "fabric-check",
             "Ray head": "ray-head",
             "Ray worker": "ray-worker-{node}", "gate": "ray-gate",
             "vLLM rank": "vllm-rank-{node}", "API key": "vllm-api-key"}
_ROW_ACTION = {"same": "keep", "replace": "replace", "create": "create", "delete": "delete",
               "update": "update"}


@pytest.mark.parametrize(("backend", "kind"), BOTH_BACKENDS)
def test_the_expected_rows_are_the_captures_plan(backend: str, kind: str) -> None:
    """Read apart from the summary: every command the capture plans to run again, create or
    delete is a row with that action, and every row's resource has that op in the capture (a
    kept check, model or copy is no row)."""
    steps = json.loads(fixture_path(kind, backend).read_text())["steps"]
    # the commands, and the fabric check (a dynamic resource: its gate is no row of its own)
    ops = {s["urn"].split("::")[-1]: s["op"] for s in steps
           if s["urn"].split("::")[2].endswith("command:remote:Command")
           or s["urn"].endswith("::fabric-check")}
    ops.pop("fabric-gate", None)
    vllm = "vllm-leader" if backend == "native" else "vllm-serve"
    expected = TABLES[backend][kind]
    named: dict[str, str] = {}  # resource name -> the row's action
    for node, role, action, _, _ in expected:
        name = vllm if role == "vLLM" else _RESOURCE[role].format(node=node)
        assert _ROW_ACTION[ops[name]] == action, (name, ops[name])
        named[name] = action
    assert {n for n, op in ops.items() if op != "same"} == \
        {n for n, action in named.items() if action != "keep"}
    assert (named.get("memory-check") == "replace") == (kind in MEMORY_CAUSES)


@pytest.mark.parametrize("kind", KINDS)
def test_the_headline_says_what_restarts_loudest_first(kind: str) -> None:
    s = summarized(kind)
    assert summary.headline(s) == HEADLINES[kind]
    if kind not in ("noop", "ssh-key-rotated", "secret-rotated"):
        assert summary.headline(s, markdown=True).startswith("**vLLM reloads the model** (node-1)")


@pytest.mark.parametrize("kind", KINDS)
def test_the_native_headline_names_the_headless_ranks_and_no_ray(kind: str) -> None:
    s = summarized(kind, "native")
    assert summary.headline(s) == NATIVE_HEADLINES[kind]
    assert "Ray" not in NATIVE_HEADLINES[kind].replace("(no Ray)", "")
    if kind not in ("noop", "ssh-key-rotated", "secret-rotated"):
        assert summary.headline(s, markdown=True).startswith("**vLLM reloads the model** (node-1)")


@pytest.mark.parametrize("kind", KINDS)
def test_what_restarts_counts_ray_nodes_and_says_whether_vllm_reloads(kind: str) -> None:
    assert summary.what_restarts(summarized(kind)) == WHAT_RESTARTS[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_native_what_restarts_counts_headless_ranks_and_says_no_ray(kind: str) -> None:
    assert summary.what_restarts(summarized(kind, "native")) == NATIVE_WHAT_RESTARTS[kind]


@pytest.mark.parametrize(("backend", "kind"), BOTH_BACKENDS)
def test_the_memory_check_runs_again_first_where_its_estimate_changes(backend: str,
                                                                      kind: str) -> None:
    """On the head, before every container's row; its cause in config terms (a node's field by
    node, vLLM's flag as vLLM spells it), never the check's own payload."""
    s = summarized(kind, backend)
    checks = [r for r in s.rows if r.role == summary.MEMORY and r.action != "update"]
    if kind not in MEMORY_CAUSES:  # nothing it estimates changed: kept or updated, no restart
        assert checks == []
        return
    assert rows(checks) == [memory_row(kind)]
    containers = [r for r in s.rows if r.role in (summary.HEAD, summary.WORKER, summary.GATE,
                                                 summary.RANK, summary.VLLM)]
    assert s.rows.index(checks[0]) < min(s.rows.index(r) for r in containers)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_memory_check_alone_starts_nothing(backend: str) -> None:
    """An upgrade of spark-vllm that changes only the check's program (its stdin) is an update:
    the check runs again and restarts nothing: the noop capture with that one step updated."""
    doc = preview("noop", backend)
    step = next(s for s in doc["steps"] if s["urn"].endswith("::memory-check"))
    step.update(op="update", diffReasons=["stdin"])
    s = summary.summarize(doc)
    assert [r for r in rows(s) if r[2] != "keep"] == [
        ("node-1", "memory check", "update",
         "stdin (secret) changed: the SSH key, how the head reaches the nodes, or its program",
         MEMORY_AGAIN)]
    assert summary.headline(s) == "Nothing restarts: only checks run again."
    assert summary.what_restarts(s) == (NATIVE_WHAT_RESTARTS if backend == "native"
                                        else WHAT_RESTARTS)["noop"]
    assert s.compile_cache == ""


def _vllm_replaced(backend: str, change: Any) -> summary.Summary:
    """The noop capture with the API server's container replaced: `change(old, new)` edits
    a copy of its triggers' facts into the new state's."""
    import copy

    doc = preview("noop", backend)
    name = "::vllm-leader" if backend == "native" else "::vllm-serve"
    step = next(s for s in doc["steps"] if s["urn"].endswith(name))
    new_state = copy.deepcopy(step["newState"])
    facts = new_state["inputs"]["triggers"][0]
    change(facts)
    step.update(op="replace", newState=new_state, diffReasons=["triggers"],
                replaceReasons=["triggers"], detailedDiff={"triggers[0]": {"kind": "update"}})
    return summary.summarize(doc)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_middleware_says_so_in_the_row_and_the_headline(backend: str) -> None:
    s = _vllm_replaced(backend, lambda f: f["files"].update({"spark_vllm_auth.py": "0" * 16}))
    (vllm,) = [r for r in s.changed() if r.role == summary.VLLM]
    assert vllm.causes == (summary.FILE_CAUSES["spark_vllm_auth.py"],)
    assert summary.headline(s).startswith(
        "vLLM reloads the model (node-1): the API-key middleware changed (spark_vllm_auth.py)")


def test_a_new_docker_run_line_alone_names_the_words_it_changed() -> None:
    def argv(f: dict[str, Any]) -> None:
        f["argv"] = [w for w in f["argv"] if w != "--ipc"] + ["--ulimit", "memlock=-1"]
    s = _vllm_replaced("ray", argv)
    (vllm,) = [r for r in s.changed() if r.role == summary.VLLM]
    assert vllm.causes == ("docker run line: ---ipc +--ulimit +memlock=-1",)
    assert "docker run line" in summary.headline(s)


def test_state_from_before_the_docker_run_line_was_recorded_says_it_is_replaced_once() -> None:
    import copy

    doc = preview("noop")
    step = next(s for s in doc["steps"] if s["urn"].endswith("::vllm-serve"))
    old_state = copy.deepcopy(step["oldState"])
    for key in ("argv", "files", "user"):
        old_state["inputs"]["triggers"][0].pop(key, None)
    step.update(op="replace", oldState=old_state, diffReasons=["triggers"])
    s = summary.summarize(doc)
    (vllm,) = [r for r in s.changed() if r.role == summary.VLLM]
    assert vllm.causes == (summary.RECORDED_ONCE,)


@pytest.mark.parametrize(("backend", "kind"), BOTH_BACKENDS)
def test_the_compile_cache_note_says_warm_or_cold_and_why(backend: str, kind: str) -> None:
    """Warm where the compile key is the same (env, an address, a secret); cold when the image
    changes (the cache is cleared); compiles again for a new model, layout or vLLM flag."""
    s = summarized(kind, backend)
    assert s.compile_cache == CACHE_NOTES[kind]
    if CACHE_NOTES[kind]:
        assert summary.what_restarts(s).endswith(f" {CACHE_NOTES[kind]}")
        assert summary.render_markdown(s).rstrip().endswith(CACHE_NOTES[kind])
        assert summary.render_text(s).rstrip().endswith(CACHE_NOTES[kind])


@pytest.mark.parametrize("kind", ["vllm-arg", "node-added", "env"])
def test_without_show_sames_kept_containers_are_still_named_by_the_links(kind: str) -> None:
    """`pulumi preview --json` without --show-sames has no step for a kept resource: the kept
    Ray containers and gate come from the links of the commands that change."""
    doc = preview(kind)
    doc["steps"] = [s for s in doc["steps"] if s["op"] != "same"]
    assert rows(summary.summarize(doc)) == [r for r in EXPECTED[kind] if r != VLLM_KEPT]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_api_key_rotation_without_show_sames_names_the_head_and_restarts_nothing(
        backend: str) -> None:
    """The one step of a rotation is the key's file (an update): the head is named from its
    facts, and the headline says nothing restarts."""
    doc = preview("secret-rotated", backend)
    doc["steps"] = [s for s in doc["steps"] if s["op"] != "same"]
    s = summary.summarize(doc)
    assert [r for r in rows(s) if r[1] == "API key"] == [KEY_ROTATED]
    assert not [r for r in s.changed() if r.role != summary.API_KEY]
    assert summary.headline(s) == ROTATED_IN_PLACE


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_upgrade_from_the_api_key_digest_in_the_links_says_where_it_went(
        backend: str) -> None:
    """An earlier release's API server (and native ranks) held the apiKey's secret digest in
    their links: the upgrade that drops it names the move, in the row and the headline."""
    import copy

    doc = preview("noop", backend)
    name = "vllm-serve" if backend == "ray" else "vllm-leader"
    step = next(s for s in doc["steps"] if s["urn"].endswith(f"::{name}"))
    old_state = copy.deepcopy(step["oldState"])
    old_state["inputs"]["triggers"][1]["apiKey"] = "[secret]"
    step.update(op="replace", oldState=old_state, diffReasons=["triggers"],
                detailedDiff={"triggers[1].apiKey": {"kind": "delete"}})
    key = next(s for s in doc["steps"] if s["urn"].endswith("::vllm-api-key"))
    key.update(op="create", oldState=None)  # the earlier release had no key's file
    s = summary.summarize(doc)
    (vllm,) = [r for r in s.changed() if r.role == summary.VLLM]
    assert vllm.causes == (summary.API_KEY_MOVED,)
    assert [r.causes for r in s.changed() if r.role == summary.API_KEY] == [
        (summary.API_KEY_FILE_NEW,)]
    assert summary.headline(s).startswith(
        f"vLLM reloads the model (node-1): {summary.API_KEY_MOVED}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_noop_says_so_in_one_line(backend: str) -> None:
    s = summarized("noop", backend)
    assert s.is_noop and s.other_changes == 0
    assert summary.render_markdown(s) == "### spark-vllm preview: stack `lab`\n\n" \
        "No change: nothing restarts.\n"
    assert summary.render_text(s) == "stack lab: No change: nothing restarts.\n"


def test_markdown_has_one_table_line_per_row_and_code_for_config_changes() -> None:
    s = summarized("env")
    text = summary.render_markdown(s)
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table[0] == "| node | role | action | cause | consequence |"
    assert len(table) == 2 + len(s.rows)
    assert all(ln.count(" | ") == 4 for ln in table[2:])
    assert "| node-1 | Ray head | **replace** | `env.NCCL_DEBUG: WARN → INFO` |" in text
    assert text.rstrip().endswith(WHAT_RESTARTS["env"])


def test_markdown_shows_the_memory_checks_causes_as_code() -> None:
    text = summary.render_markdown(summarized("vllm-arg", "native"))
    assert "| node-1 | memory check | **replace** | `--max-model-len: (unset) → 8192` |" in text
    assert "| node-2 | vLLM rank | **replace** | `vllmArgs: (none) → --max-model-len 8192` |" \
        in text
    text = summary.render_markdown(summarized("node-added"))
    assert (f"| node-1 | memory check | **replace** | `{NODES_ADDED}`<br>`{TP_3}` |") in text


def test_text_mode_aligns_the_columns() -> None:
    text = summary.render_text(summarized("node-added"))
    lines = [ln for ln in text.splitlines() if ln.startswith(("NODE", "node-"))]
    assert len(lines) == 1 + len(EXPECTED["node-added"])
    col = lines[0].index("ACTION")
    assert all(ln[col:].split()[0] in ("ACTION", "keep", "create", "replace", "update")
               for ln in lines)


@pytest.mark.parametrize("kind", KINDS)
def test_the_cli_prints_no_secret_and_no_placeholder(kind: str) -> None:
    raw = fixture_path(kind).read_text()
    assert "PRIVATE KEY" not in raw  # the capture also scanned for every secret value
    for fmt in ("markdown", "text"):
        out = subprocess.run([sys.executable, "-m", "spark_vllm.summary", "--format", fmt,
                              str(fixture_path(kind))], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        assert summary.SECRET not in out and summary.UNKNOWN not in out
        assert HEADLINES[kind] in out.replace("**", "")


@pytest.mark.parametrize("kind", KINDS)
def test_the_native_summary_prints_no_secret_and_no_placeholder(
        kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """As the CLI test above, in this process (the CLI's process is proven there)."""
    path = fixture_path(kind, "native")
    assert "PRIVATE KEY" not in path.read_text()
    for fmt in ("markdown", "text"):
        assert summary.main(["--format", fmt, str(path)]) == 0
        out = capsys.readouterr().out
        assert summary.SECRET not in out and summary.UNKNOWN not in out
        assert NATIVE_HEADLINES[kind] in out.replace("**", "")


def test_stdin_and_stack_option() -> None:
    out = subprocess.run([sys.executable, "-m", "spark_vllm.summary", "--format", "text",
                          "--stack", "spark-duo", "-"], input=fixture_path("vllm-arg").read_text(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith(f"stack spark-duo: {VLLM_ONLY}\n")


@pytest.mark.parametrize(("text", "problem"), [
    ("", "empty input"),
    ("not json", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"deployment": {}, "version": 3}', "`pulumi stack export`"),
    ('{"hello": 1}', "no `steps`, `changeSummary` or `diagnostics`"),
    ('{"steps": [{"op": "same"}]}', "steps[0] has no `op` and `urn`"),
    ('{"sequence": 0, "timestamp": 1}\n{"sequence": 1, "timestamp": 2}\n', "engine events"),
])
def test_what_is_not_a_preview_exits_2_naming_the_problem(tmp_path: Path, text: str,
                                                          problem: str) -> None:
    path = tmp_path / "in.json"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "spark_vllm.summary", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc
    assert problem in proc.stderr and proc.stdout == ""


def test_a_missing_file_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "spark_vllm.summary", "/nonexistent.json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "cannot read /nonexistent.json" in proc.stderr


def test_a_value_still_wrapped_as_a_secret_is_shown_as_secret() -> None:
    wrapped = {summary.SIG_KEY: summary.SECRET_SIG, "ciphertext": "v1:abc"}
    assert summary._clean({"a": [wrapped], "b": "plain"}) == {"a": ["[secret]"], "b": "plain"}


def test_derived_env_keys_are_the_programs_own() -> None:
    """An env change of a program-owned key is shown as the node field behind it."""
    assert set(summary.DERIVED_ENV) <= set(spec.OWNED_ENV)
    causes = summary.fact_causes({"identityIp": "a", "env": {"VLLM_HOST_IP": "a"}},
                                 {"identityIp": "b", "env": {"VLLM_HOST_IP": "b"}})
    assert causes == ["identityIp: a → b"]


# the component types each backend's program registers (components/*.py)
_TYPES = {"ray": {"spark-vllm:ray:RayCluster", "spark-vllm:vllm:VllmService"},
          "native": {"spark-vllm:native:NativeGroup"}}


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixtures_are_real_previews_of_the_lab_stack(backend: str) -> None:
    """Every kind: the lab stack's URNs, captured with --show-sames, from today's program (its
    memory check is in every plan) and of the backend its folder says."""
    for kind in KINDS:
        doc = json.loads(fixture_path(kind, backend).read_text())
        urns = [s["urn"] for s in doc["steps"]]
        assert all(u.startswith("urn:pulumi:lab::spark-vllm::") for u in urns), kind
        assert "same" in {s["op"] for s in doc["steps"]}, f"{kind}: captured without --show-sames"
        types = {u.split("::")[2].split("$")[0] for u in urns}
        assert "spark-vllm:memory:MemoryCheck" in types, f"{kind}: captured before the memory check"
        assert _TYPES[backend] <= types, kind
        assert not types & _TYPES["native" if backend == "ray" else "ray"], kind


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fabric_check_that_refused_runs_again_and_says_why(backend: str) -> None:
    """The noop capture with the fabric check updated because its last run refused (its
    triggers unchanged): it measures again, first; nothing restarts; its gate is no row."""
    doc = preview("noop", backend)
    step = next(s for s in doc["steps"] if s["urn"].endswith("::fabric-check"))
    step["op"] = "update"
    step["oldState"]["outputs"]["outcome"] = "refuse"
    gate = next(s for s in doc["steps"] if s["urn"].endswith("::fabric-gate"))
    gate.update(op="update", diffReasons=["create"])
    s = summary.summarize(doc)
    assert [r for r in rows(s) if r[2] != "keep"] == [
        ("node-1", "fabric check", "update", summary.FABRIC_REFUSED, summary.FABRIC_MEASURED)]
    assert s.other_changes == 0
    assert summary.headline(s) == "Nothing restarts: only checks run again."
