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
import json
import re
import sys
from pathlib import Path
from typing import Any

from .summary_causes import (
    _dead_state,
    cache_note,
    causes_of,
    consequence,
    fabric_reruns,
    fact_causes,
)
from .summary_model import (
    _ACTION,
    _STRENGTH,
    API_KEY,
    API_KEY_FILE_NEW,
    API_KEY_IN_PLACE,
    API_KEY_MOVED,
    API_KEY_ROTATED,
    COMMAND_TYPE,
    COPIED,
    COPY,
    CREATE,
    DELETE,
    DERIVED_ENV,
    FABRIC,
    FABRIC_CHECK,
    FABRIC_GATE,
    FABRIC_MEASURED,
    FABRIC_REACH,
    FABRIC_REFUSED,
    FABRIC_STORED,
    FILE_CAUSES,
    GATE,
    GATEWAY,
    HEAD,
    IMAGE_COPIED,
    IMAGE_COPY,
    IMAGES,
    KEEP,
    LIVENESS_SUFFIX,
    MEMORY,
    MODEL,
    PREFLIGHT,
    RANK,
    RECORDED_ONCE,
    ROLE_ORDER,
    SECRET,
    SECRET_CONNECTION,
    SECRET_SIG,
    SIG_KEY,
    STAGED_ON_HEAD,
    UNKNOWN,
    UPDATE,
    VLLM,
    VLLM_RELOADS,
    WEIGHTS_STAY,
    WORKER,
    NotAPreviewError,
    Row,
    Summary,
    _Command,
    _Resource,
    _split,
    model_keys,
    model_role,
)
from .summary_render import (
    headline,
    render_markdown,
    render_text,
    what_restarts,
)

# what callers read here (tests, the lab's captures, cli.py): the vocabulary lives in
# summary_model, the causes in summary_causes, the rendering in summary_render
__all__ = [
    "API_KEY",
    "API_KEY_FILE_NEW",
    "API_KEY_IN_PLACE",
    "API_KEY_MOVED",
    "API_KEY_ROTATED",
    "COPIED",
    "DERIVED_ENV",
    "FABRIC_MEASURED",
    "FABRIC_REACH",
    "FABRIC_REFUSED",
    "FABRIC_STORED",
    "FILE_CAUSES",
    "GATE",
    "HEAD",
    "IMAGE_COPIED",
    "MEMORY",
    "NotAPreviewError",
    "RANK",
    "RECORDED_ONCE",
    "Row",
    "SECRET",
    "SECRET_CONNECTION",
    "SECRET_SIG",
    "SIG_KEY",
    "STAGED_ON_HEAD",
    "Summary",
    "UNKNOWN",
    "VLLM",
    "VLLM_RELOADS",
    "WEIGHTS_STAY",
    "WORKER",
    "check",
    "fact_causes",
    "headline",
    "load",
    "main",
    "render_markdown",
    "render_text",
    "summarize",
    "what_restarts",
]


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

def _classify(resources: dict[str, _Resource]) -> tuple[list[_Command], dict[str, str], int]:
    """The commands with a role; the containers a refresh saw dead (by command name), from
    their liveness companions; how many other resources change."""
    commands: list[_Command] = []
    dead: dict[str, str] = {}
    other = 0
    keys = model_keys([r.name for r in resources.values() if r.type == COMMAND_TYPE])
    for res in resources.values():
        if res.name == FABRIC_GATE:
            continue  # the fabric check's verdict, passed on: said by the check's row
        role = model_role(res.name, keys) \
            if res.type == COMMAND_TYPE or res.name == FABRIC_CHECK else None
        if role:
            node, key = role[1], role[2]
            if key is not None:  # one of several models: its node, by name or by its facts
                if node is None:
                    facts = next((f for f in (_split(role[0], res.new)[0],
                                              _split(role[0], res.old)[0]) if f), None)
                    node = str((facts or {}).get("node") or "head")
                node = f"{node} · {key}"
            commands.append((role[0], node, res))
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
    head = next((str(facts["node"]) for role, node, res in commands
                 if node is None and role in (HEAD, VLLM, API_KEY, GATEWAY)
                 for facts in (_split(role, res.new)[0], _split(role, res.old)[0])
                 if facts and facts.get("node")), None) or next(
        # else the memory check's nodes, the head first (memory_check.py `_nodes`)
        (str(facts["nodes"][0]["name"]) for role, node, res in commands if role == MEMORY
         for facts in (_split(role, res.new)[0], _split(role, res.old)[0])
         if facts and isinstance(facts.get("nodes"), list) and facts["nodes"]
         and isinstance(facts["nodes"][0], dict) and facts["nodes"][0].get("name")), "head")
    found: dict[tuple[str, str], _Resource | None] = {}
    for role, node, res in commands:
        found[(node or head, role)] = res
        model = f" · {node.split(' · ', 1)[1]}" if node and " · " in node else ""
        for props in (res.old, res.new):
            for key in _split(role, props)[1]:
                if model and key.startswith("rank@"):  # a model's rank, on its node
                    found.setdefault((key.removeprefix("rank@") + model, RANK), None)
                    continue
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
