"""Extract the `vllm serve` flag table from vLLM's SOURCE, statically (no vllm install, no GPU).

    unzip -o -q vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl 'vllm/*.py' -d SRC
    python lab/vllm_sim/extract_serve_flags.py SRC > lab/vllm_sim/vllm_sim/serve_flags_0_33_0.txt

(the wheel from `pip download --no-deps vllm==0.33.0`). It reads, with `ast`, what the real parser
is built from (vllm/entrypoints/common/cli_args.py make_arg_parser):
- make_arg_parser's own add_argument calls (model_tag, --headless, --api-server-count, ...);
- FrontendArgs.add_cli_args: one `--<field>` per dataclass field of FrontendArgs and its bases;
- EngineArgs.add_cli_args (vllm/engine/arg_utils.py): every add_argument call; all of them name
  their option strings as literals; their kwargs are either literals or `**X_kwargs["field"]`
  where `X_kwargs = get_kwargs(ConfigClass)`;
- AsyncEngineArgs.add_cli_args: --enable-log-requests.
Option strings are therefore exact. Arity (does the flag take a value) follows _compute_kwargs
(vllm/engine/arg_utils.py:325-440) applied to the field's annotation as written:
bool | str | None -> "?", any bool -> BooleanOptionalAction (also --no-X, no value),
list/set/tuple[X, ...] -> "+", fixed tuple -> N, else one value; explicit action=/nargs=
keywords and FrontendArgs._customize_cli_kwargs's edits override. Annotations that hide a bool
or a list behind a type alias defined elsewhere are the one way this can be wrong.

Output: one action per line: `<option strings separated by spaces>\t<arity>`, arity one of
`0` (no value), `?`, `1`, `+`, or a number.
"""

import ast
import sys
from pathlib import Path


def _unparse(node: ast.AST | None) -> str:
    return ast.unparse(node) if node is not None else ""


class Index:
    """Classes (fields with annotations, bases) and type aliases across the vllm sources."""

    def __init__(self, root: Path) -> None:
        self.classes: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
        self.aliases: dict[str, str] = {}
        files = sorted(root.glob("vllm/config/*.py")) + sorted(root.glob("vllm/**/*.py"))
        for path in files:
            try:
                tree = ast.parse(path.read_text())
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name not in self.classes:
                    fields = [
                        (st.target.id, _unparse(st.annotation))
                        for st in node.body
                        if isinstance(st, ast.AnnAssign)
                        and isinstance(st.target, ast.Name)
                        and "ClassVar" not in _unparse(st.annotation)
                    ]
                    self.classes[node.name] = ([_unparse(b) for b in node.bases], fields)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    t = node.targets[0]
                    if isinstance(t, ast.Name):
                        self.aliases.setdefault(t.id, _unparse(node.value))
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    if "TypeAlias" in _unparse(node.annotation) and node.value is not None:
                        self.aliases.setdefault(node.target.id, _unparse(node.value))
                elif type(node).__name__ == "TypeAlias":  # `type X = ...` (3.12+)
                    self.aliases.setdefault(node.name.id, _unparse(node.value))  # type: ignore[attr-defined]

    def fields(self, cls: str) -> dict[str, str]:
        bases, own = self.classes[cls]
        out: dict[str, str] = {}
        for base in bases:
            if base in self.classes:
                out.update(self.fields(base))
        out.update(dict(own))
        return out

    def expand(self, annotation: str, depth: int = 0) -> str:
        """Replace bare alias names (not Literal/containers) by their definition, a few times."""
        if depth > 4:
            return annotation
        parts = [p.strip() for p in _top_level_union(annotation)]
        out = []
        for p in parts:
            if p in self.aliases and not p[:1].islower():
                out.append(self.expand(self.aliases[p], depth + 1))
            else:
                out.append(p)
        return " | ".join(out)


def _top_level_union(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    if text.startswith("Optional[") and text.endswith("]"):
        return [*_top_level_union(text[9:-1]), "None"]
    if text.startswith("Union[") and text.endswith("]"):
        text = text[6:-1].replace(",", "|") if "[" not in text[6:-1] else text[6:-1]
    return [p.strip() for p in _split_top(text, "|") if p.strip()]


def arity_of(annotation: str, index: Index) -> str:
    members = _top_level_union(index.expand(annotation))
    names = {m.split("[", 1)[0].strip() for m in members}
    if names == {"bool", "str", "None"}:
        return "?"
    if "bool" in names:
        return "bool"
    if names & {"Literal"}:
        return "1"
    for m in members:
        head = m.split("[", 1)[0].strip()
        if head == "tuple":
            inner = m[len("tuple[") : -1]
            return "+" if "..." in inner else str(len(_split_args(inner)))
    if names & {"list", "set", "List", "Set"}:
        return "+"
    return "1"


def _split_args(inner: str) -> list[str]:
    return [p for p in _split_top(inner, ",") if p.strip()]


def _split_top(text: str, sep: str) -> list[str]:
    """Split `text` at `sep` outside any brackets (a type expression's own nesting)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _explicit_arity(call: ast.Call) -> str | None:
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = _unparse(kw.get("action")) if "action" in kw else None
    if action in ("'store_true'", "'store_false'", "'store_const'", "'count'"):
        return "0"
    if action and "BooleanOptionalAction" in action:
        return "bool"
    if "nargs" in kw:
        value = kw["nargs"]
        return str(value.value) if isinstance(value, ast.Constant) else "1"
    if action == "'append'" or "type" in kw or "choices" in kw or "default" in kw:
        return "1"
    return None


def _emit(options: list[str], arity: str, out: list[tuple[list[str], str]]) -> None:
    if arity == "bool":
        longs = [o for o in options if o.startswith("--")]
        out.append((options + [f"--no-{o[2:]}" for o in longs], "0"))
    else:
        out.append((options, arity))


def extract(root: Path) -> list[tuple[list[str], str]]:
    index = Index(root)
    out: list[tuple[list[str], str]] = [(["-h", "--help"], "0")]

    cli = ast.parse((root / "vllm/entrypoints/common/cli_args.py").read_text())
    funcs = {n.name: n for n in ast.walk(cli) if isinstance(n, ast.FunctionDef)}
    for call in ast.walk(funcs["make_arg_parser"]):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
            opts = [a.value for a in call.args if isinstance(a, ast.Constant)]
            if opts and opts[0].startswith("-"):
                _emit(opts, _explicit_arity(call) or "1", out)

    # FrontendArgs: edits made by _customize_cli_kwargs (nargs removed, action append, ...).
    overrides: dict[str, str] = {}
    for node in ast.walk(cli):
        if isinstance(node, ast.Delete):
            for t in node.targets:
                s = _unparse(t)
                if s.endswith("['nargs']"):
                    overrides[s.split("'")[1]] = "1"
    frontend_fields = index.fields("FrontendArgs")
    for name, annotation in frontend_fields.items():
        arity = overrides.get(name) or arity_of(annotation, index)
        _emit([f"--{name.replace('_', '-')}"], arity, out)

    eng = ast.parse((root / "vllm/engine/arg_utils.py").read_text())
    for fn in (n for n in ast.walk(eng) if isinstance(n, ast.FunctionDef)):
        if fn.name != "add_cli_args":
            continue
        kwargs_class: dict[str, tuple[str, str | None]] = {}
        for st in ast.walk(fn):
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                v = st.value
                sub = None
                if isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Constant):
                    sub, v = v.slice.value, v.value
                if isinstance(v, ast.Call) and getattr(v.func, "id", "") == "get_kwargs":
                    kwargs_class[st.targets[0].id] = (_unparse(v.args[0]), sub)
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument"):
                continue
            opts = [a.value for a in call.args if isinstance(a, ast.Constant)]
            arity = _explicit_arity(call)
            if arity is None:
                # `**X_kwargs["field"]`, also inside `**{**X_kwargs["field"], "default": None}`
                for k in call.keywords:
                    if k.arg is not None:
                        continue
                    for sub in ast.walk(k.value):
                        if (
                            isinstance(sub, ast.Subscript)
                            and isinstance(sub.value, ast.Name)
                            and sub.value.id in kwargs_class
                            and isinstance(sub.slice, ast.Constant)
                        ):
                            cls, _ = kwargs_class[sub.value.id]
                            arity = arity_of(index.fields(cls)[sub.slice.value], index)
                            break
            _emit(opts, arity or "1", out)
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    rows = extract(root)
    seen: set[str] = set()
    print("# vllm serve flag table, extracted from vLLM source by lab/vllm_sim/extract_serve_flags.py")
    print("# <option strings>\\t<arity: 0 none, ? optional, 1 one, + one or more, N exactly N>")
    for opts, arity in rows:
        dup = [o for o in opts if o in seen]
        if dup:
            raise SystemExit(f"duplicate option strings {dup}: the extraction is wrong")
        seen.update(opts)
        print(f"{' '.join(opts)}\t{arity}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
