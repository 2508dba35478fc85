"""The reviewer's summary of a preview (spark_vllm/summary.py) on real `pulumi preview --json
--show-sames` documents of the 2-node lab stack, one per change kind, captured by
`python -m lab.capture_previews` into tests/fixtures/previews/ (never written by hand): for each,
the exact rows (node, role, action, cause, consequence), the headline and what restarts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab import config
from spark_vllm import summary
from spark_vllm.components import spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "previews"
KINDS = ("noop", "env", "identity", "image", "vllm-arg", "node-added", "node-removed",
         "secret-rotated", "model")

# what `python -m lab up` writes and lab.capture_previews changes
NODE1 = config.node_addrs(1, config.DEFAULT_MGMT_SUBNET, config.DEFAULT_FABRIC_SUBNET)
IMAGE, OTHER_IMAGE = config.INNER_IMAGE, f"{config.INNER_IMAGE}-{config.LEGACY_SIM_VLLM_VERSION}"
IDENTITY = f"identityIp: {NODE1.fabric_ip} → {NODE1.spare_ip}"
IMAGE_CHANGE = f"image: {IMAGE} → {OTHER_IMAGE}"
ENV = "env.NCCL_DEBUG: WARN → INFO"
LAB_MODEL = config.LAB_MODEL
MODEL_CHANGE = f"model: {LAB_MODEL} → lab/other-model"

RAY, CHECK, RELOAD = "Ray restarted on this node", "nothing runs (a check)", summary.VLLM_RELOADS
BOTH = "replaced because the Ray head and Ray worker node-2 are"
HEAD_KEPT = ("node-1", "Ray head", "keep", "", "keeps running")
GATE_KEPT = ("node-1", "gate", "keep", "", "")
VLLM_KEPT = ("node-1", "vLLM", "keep", "", "keeps serving")
WORKER_KEPT = ("node-2", "Ray worker", "keep", "", "keeps running")

Rows = list[tuple[str, str, str, str, str]]
EXPECTED: dict[str, Rows] = {
    "noop": [HEAD_KEPT, GATE_KEPT, VLLM_KEPT, WORKER_KEPT],
    "env": [
        ("node-1", "Ray head", "replace", ENV, RAY),
        ("node-1", "gate", "replace", BOTH, CHECK),
        ("node-1", "vLLM", "replace", ENV, RELOAD),
        ("node-2", "Ray worker", "replace", ENV, RAY),
    ],
    "identity": [
        ("node-1", "preflight", "replace", IDENTITY, CHECK),
        ("node-1", "image check", "replace", "a node's address, user or host key changed", CHECK),
        ("node-1", "Ray head", "replace", IDENTITY, RAY),
        ("node-1", "gate", "replace", BOTH, CHECK),
        ("node-1", "vLLM", "replace", IDENTITY, RELOAD),
        ("node-2", "Ray worker", "replace", "replaced because the Ray head is", RAY),
    ],
    "image": [
        ("node-1", "preflight", "replace", IMAGE_CHANGE, CHECK),
        ("node-1", "image check", "replace", IMAGE_CHANGE, CHECK),
        # it downloads with the image when the model is missing: it looks again (hashing
        # nothing that did not change), and no copy runs for it
        ("node-1", "model", "replace", IMAGE_CHANGE, summary.STAGED_ON_HEAD),
        ("node-1", "Ray head", "replace", IMAGE_CHANGE, RAY),
        ("node-1", "gate", "replace", BOTH, CHECK),
        ("node-1", "vLLM", "replace", IMAGE_CHANGE, RELOAD),
        ("node-2", "preflight", "replace", IMAGE_CHANGE, CHECK),
        ("node-2", "Ray worker", "replace", IMAGE_CHANGE, RAY),
    ],
    "vllm-arg": [
        HEAD_KEPT, GATE_KEPT,
        ("node-1", "vLLM", "replace", "vllmArgs: (none) → --max-model-len 8192", RELOAD),
        WORKER_KEPT,
    ],
    "node-added": [
        ("node-1", "image check", "replace", "nodes: node-1 node-2 → node-1 node-2 node-3", CHECK),
        HEAD_KEPT,
        ("node-1", "gate", "replace", "Ray worker node-3 added", CHECK),
        ("node-1", "vLLM", "replace", "tensorParallelSize: 2 → 3; Ray worker node-3 added",
         RELOAD),
        WORKER_KEPT,
        ("node-3", "preflight", "create", "node added", CHECK),
        ("node-3", "model copy", "create", "node added", summary.COPIED),
        ("node-3", "Ray worker", "create", "node added", "Ray starts on this node"),
    ],
    "node-removed": [
        ("node-1", "image check", "replace", "nodes: node-1 node-2 → node-1", CHECK),
        HEAD_KEPT,
        ("node-1", "gate", "replace", "Ray worker node-2 removed", CHECK),
        ("node-1", "vLLM", "replace", "tensorParallelSize: 2 → 1; Ray worker node-2 removed",
         RELOAD),
        ("node-2", "preflight", "delete", "node removed", CHECK),
        ("node-2", "model copy", "delete", "node removed", summary.WEIGHTS_STAY),
        ("node-2", "Ray worker", "delete", "node removed", "Ray stopped on this node"),
    ],
    "secret-rotated": [
        HEAD_KEPT, GATE_KEPT,
        ("node-1", "vLLM", "replace", "secret changed (apiKey or hfToken)", RELOAD),
        WORKER_KEPT,
    ],
    # the one change that moves weights: staged again on the head, copied to node-2, and vLLM
    # reloads; Ray keeps running
    "model": [
        ("node-1", "model", "replace", MODEL_CHANGE, summary.STAGED_ON_HEAD),
        HEAD_KEPT, GATE_KEPT,
        ("node-1", "vLLM", "replace",
         f"{MODEL_CHANGE}; servedModelName: {LAB_MODEL} → lab/other-model", RELOAD),
        ("node-2", "model copy", "replace", MODEL_CHANGE, summary.COPIED),
        WORKER_KEPT,
    ],
}
VLLM_ONLY = "vLLM reloads the model (node-1) · Ray keeps running"
RESTARTS_ALL = "vLLM reloads the model (node-1) · Ray restarts on 2 nodes"
HEADLINES = {
    "noop": "No change: nothing restarts.",
    "env": RESTARTS_ALL, "identity": RESTARTS_ALL,
    "image": f"{RESTARTS_ALL} · the model is staged again on the head",
    "vllm-arg": VLLM_ONLY, "secret-rotated": VLLM_ONLY,
    "node-added": "vLLM reloads the model (node-1) · Ray starts on node-3 · the model is copied "
                  "to node-3",
    "model": "vLLM reloads the model (node-1) · the model is copied to node-2 · Ray keeps running",
    "node-removed": "vLLM reloads the model (node-1) · Ray stops on node-2",
}
RELOADS = "vLLM: yes (reloads the model: minutes of downtime on a Spark)."
WHAT_RESTARTS = {
    "env": f"What restarts: Ray on 2 nodes (node-1, node-2); {RELOADS}",
    "identity": f"What restarts: Ray on 2 nodes (node-1, node-2); {RELOADS}",
    "image": f"What restarts: Ray on 2 nodes (node-1, node-2); {RELOADS}",
    "vllm-arg": f"What restarts: Ray on no node; {RELOADS}",
    "secret-rotated": f"What restarts: Ray on no node; {RELOADS}",
    "node-added": f"What restarts: Ray on 1 node (node-3); {RELOADS} Weights copied to node-3 "
                  "(only the files they lack).",
    "model": f"What restarts: Ray on no node; {RELOADS} Weights copied to node-2 (only the files "
             "they lack).",
    "node-removed": f"What restarts: Ray on no node; {RELOADS} Ray stops on node-2.",
}


def fixture_path(kind: str) -> Path:
    path = FIXTURES / f"{kind}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: capture the previews on the lab with "
                    "`source lab/env.sh && python -m lab.capture_previews` (see its docstring)")
    return path


def preview(kind: str) -> dict[str, Any]:
    return summary.load(fixture_path(kind).read_text())


def rows(s: summary.Summary) -> Rows:
    return [(r.node, r.role, r.action, r.cause, r.consequence) for r in s.rows]


@pytest.mark.parametrize("kind", KINDS)
def test_each_change_kind_gives_its_rows(kind: str) -> None:
    s = summary.summarize(preview(kind))
    assert s.stack == "lab" and s.errors == ()
    assert rows(s) == EXPECTED[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_the_headline_says_what_restarts_loudest_first(kind: str) -> None:
    s = summary.summarize(preview(kind))
    assert summary.headline(s) == HEADLINES[kind]
    if kind != "noop":
        assert summary.headline(s, markdown=True).startswith("**vLLM reloads the model** (node-1)")


@pytest.mark.parametrize("kind", sorted(WHAT_RESTARTS))
def test_what_restarts_counts_ray_nodes_and_says_whether_vllm_reloads(kind: str) -> None:
    assert summary.what_restarts(summary.summarize(preview(kind))) == WHAT_RESTARTS[kind]


@pytest.mark.parametrize("kind", ["vllm-arg", "node-added", "env"])
def test_without_show_sames_kept_containers_are_still_named_by_the_links(kind: str) -> None:
    """`pulumi preview --json` without --show-sames has no step for a kept resource: the kept
    Ray containers and gate come from the links of the commands that change."""
    doc = preview(kind)
    doc["steps"] = [s for s in doc["steps"] if s["op"] != "same"]
    assert rows(summary.summarize(doc)) == [r for r in EXPECTED[kind] if r != VLLM_KEPT]


def test_a_noop_says_so_in_one_line() -> None:
    s = summary.summarize(preview("noop"))
    assert s.is_noop
    assert summary.render_markdown(s) == "### spark-vllm preview: stack `lab`\n\n" \
        "No change: nothing restarts.\n"
    assert summary.render_text(s) == "stack lab: No change: nothing restarts.\n"


def test_markdown_has_one_table_line_per_row_and_code_for_config_changes() -> None:
    s = summary.summarize(preview("env"))
    text = summary.render_markdown(s)
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table[0] == "| node | role | action | cause | consequence |"
    assert len(table) == 2 + len(s.rows)
    assert all(ln.count(" | ") == 4 for ln in table[2:])
    assert "| node-1 | Ray head | **replace** | `env.NCCL_DEBUG: WARN → INFO` |" in text
    assert text.rstrip().endswith(WHAT_RESTARTS["env"])


def test_text_mode_aligns_the_columns() -> None:
    text = summary.render_text(summary.summarize(preview("node-added")))
    lines = [ln for ln in text.splitlines() if ln.startswith(("NODE", "node-"))]
    assert len(lines) == 1 + len(EXPECTED["node-added"])
    col = lines[0].index("ACTION")
    assert all(ln[col:].split()[0] in ("ACTION", "keep", "create", "replace") for ln in lines)


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


def test_fixtures_are_real_previews_of_the_lab_stack() -> None:
    for kind in KINDS:
        doc = json.loads(fixture_path(kind).read_text())
        urns = [s["urn"] for s in doc["steps"]]
        assert all(u.startswith("urn:pulumi:lab::spark-vllm::") for u in urns), kind
        assert "same" in {s["op"] for s in doc["steps"]}, f"{kind}: captured without --show-sames"
