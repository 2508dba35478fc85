"""Pulumi property values on the wire (google.protobuf.Struct) and the diff the real provider
computes from them.

The engine talks to a provider that accepts secrets in Struct values where a secret is the object
``{SIG: SECRET_SIG, "value": v}`` and an unknown (preview) is the string ``UNKNOWN``. Here they
become :class:`Secret` and :data:`COMPUTED`, so that the provider can keep every input's secret
bit when it echoes inputs back as outputs (what pulumi-go-provider's ``infer`` does), and so that
:func:`reveal` gives the plain values the commands need. Other special objects (resource
references, assets, output values) stay opaque dicts and compare as wholes.

:func:`diff_inputs` gives the diff pulumi-command documents: a change to any input is an update
(``create`` "will also be run when the resource's inputs are modified" when there is no
``update``), a change to ``triggers`` is a replace ("If the `update` command was provided the
resource will be updated, otherwise it will be replaced using the `create` command"; the SDK's
Command class adds ``replace_on_changes=["triggers[*]"]``): pulumi_command 1.2.1's
``remote/command.py`` docstrings. The detailed-diff paths are the engine's own notation
(``triggers[0]``, ``connection.host``), as ``pulumi preview --diff`` shows them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, struct_pb2

SIG = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


@dataclass(frozen=True)
class Secret:
    """A value the engine marked secret (kept as such when echoed back)."""

    value: Any

    def __repr__(self) -> str:  # never print the value (logs, tracebacks)
        return "Secret([secret])"


class _Computed:
    """An unknown value (preview): ``pulumi.Output`` not resolved yet."""

    _instance: _Computed | None = None

    def __new__(cls) -> _Computed:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<computed>"


COMPUTED = _Computed()


# --- wire <-> python ---------------------------------------------------------------------------
def _decode(v: Any) -> Any:
    if isinstance(v, str):
        return COMPUTED if v == UNKNOWN else v
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return int(v)
    if isinstance(v, list):
        return [_decode(e) for e in v]
    if isinstance(v, dict):
        if v.get(SIG) == SECRET_SIG:
            return Secret(_decode(v.get("value")))
        if SIG in v:  # resource reference, asset, archive, output value: opaque
            return v
        # SkipNulls, as pulumi-go-provider unmarshals: a null field is an absent field.
        return {k: _decode(e) for k, e in v.items() if e is not None}
    return v


def _encode(v: Any) -> Any:
    if v is COMPUTED:
        return UNKNOWN
    if isinstance(v, Secret):
        return {SIG: SECRET_SIG, "value": _encode(v.value)}
    if isinstance(v, list):
        return [_encode(e) for e in v]
    if isinstance(v, dict):
        return {k: _encode(e) for k, e in v.items()}
    return v


def from_struct(s: struct_pb2.Struct | None) -> dict[str, Any]:
    if s is None:
        return {}
    d = json_format.MessageToDict(s)
    out = _decode(d)
    assert isinstance(out, dict)
    return out


def to_struct(d: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(_encode(dict(d)))
    return s


# --- secrets and unknowns ------------------------------------------------------------------------
def reveal(v: Any) -> Any:
    """The plain value: secret wrappers removed at every depth (unknowns stay)."""
    if isinstance(v, Secret):
        return reveal(v.value)
    if isinstance(v, list):
        return [reveal(e) for e in v]
    if isinstance(v, dict) and SIG not in v:
        return {k: reveal(e) for k, e in v.items()}
    return v


def is_secret(v: Any) -> bool:
    """True if the value or anything inside it is a secret."""
    if isinstance(v, Secret):
        return True
    if isinstance(v, list):
        return any(is_secret(e) for e in v)
    if isinstance(v, dict) and SIG not in v:
        return any(is_secret(e) for e in v.values())
    return False


def has_computed(v: Any) -> bool:
    if v is COMPUTED:
        return True
    if isinstance(v, Secret):
        return has_computed(v.value)
    if isinstance(v, list):
        return any(has_computed(e) for e in v)
    if isinstance(v, dict) and SIG not in v:
        return any(has_computed(e) for e in v.values())
    return False


# --- diff (port of resource.PropertyMap.Diff + plugin.NewDetailedDiffFromObjectDiff) -------------
ADD, DELETE, UPDATE = "ADD", "DELETE", "UPDATE"
_IDENT = re.compile(r"^[a-zA-Z_$][a-zA-Z0-9_$]*$")


def _path(parts: Iterable[str | int]) -> str:
    """resource.PropertyPath.String(): ``a.b``, ``a[0]``, ``a["odd key"]``."""
    out = ""
    for i, p in enumerate(parts):
        if isinstance(p, int):
            out += f"[{p}]"
        elif _IDENT.match(p):
            out += p if i == 0 else "." + p
        else:
            out += '["' + p.replace("\\", "\\\\").replace('"', '\\"') + '"]'
    return out


def _is_object(v: Any) -> bool:
    return isinstance(v, dict) and SIG not in v


def _has_value(v: Any) -> bool:
    return v is not None


def _value_diff(old: Any, new: Any, path: list[str | int], acc: dict[str, str]) -> bool:
    """Record the detailed diff of old -> new under path; False if they are equal."""
    if isinstance(old, list) and isinstance(new, list):
        changed = False
        for i in range(len(old), len(new)):
            acc[_path([*path, i])] = ADD
            changed = True
        for i in range(len(new), len(old)):
            acc[_path([*path, i])] = DELETE
            changed = True
        for i in range(min(len(old), len(new))):
            if _value_diff(old[i], new[i], [*path, i], acc):
                changed = True
        return changed
    if _is_object(old) and _is_object(new):
        return _object_diff(old, new, path, acc)
    if old == new:  # primitives, secrets (deep, by value), opaque objects, computed
        return False
    if old is None:
        acc[_path(path)] = ADD
    elif new is None:
        acc[_path(path)] = DELETE
    else:
        acc[_path(path)] = UPDATE
    return True


def _object_diff(old: Mapping[str, Any], new: Mapping[str, Any], path: list[str | int],
                 acc: dict[str, str]) -> bool:
    changed = False
    for k, o in old.items():
        if k in new:
            n = new[k]
            sub: dict[str, str] = {}
            if _value_diff(o, n, [*path, k], sub):
                changed = True
                if not _has_value(o):
                    acc[_path([*path, k])] = ADD
                elif not _has_value(n):
                    acc[_path([*path, k])] = DELETE
                else:
                    acc.update(sub)
        elif _has_value(o):
            acc[_path([*path, k])] = DELETE
            changed = True
    for k, n in new.items():
        if k not in old and _has_value(n):
            acc[_path([*path, k])] = ADD
            changed = True
    return changed


@dataclass
class DiffResult:
    changed: bool
    detailed: dict[str, tuple[str, bool]]  # path -> (ADD|DELETE|UPDATE, replace?)

    @property
    def replaces(self) -> list[str]:
        return sorted(k for k, (_, r) in self.detailed.items() if r)


def diff_inputs(old_state: Mapping[str, Any], news: Mapping[str, Any], input_keys: Iterable[str],
                replace_keys: Iterable[str], ignore_changes: Iterable[str] = ()) -> DiffResult:
    """infer's default Diff: old *state* restricted to the input keys vs the new inputs.

    ``replace_keys`` are compared with the full detailed-diff path, as infer does
    (``schema.InputProperties[path].ReplaceOnChanges``): a change inside ``triggers`` is reported
    as ``triggers[0]`` UPDATE; the Python SDK adds ``replace_on_changes=["triggers[*]"]`` so the
    engine replaces anyway.
    """
    news = dict(news)
    for k in ignore_changes:  # infer: req.News[ignored] = req.Olds[ignored] (top level only)
        if k in old_state:
            news[k] = old_state[k]
        else:
            news.pop(k, None)
    olds = {k: old_state[k] for k in input_keys if k in old_state}
    acc: dict[str, str] = {}
    changed = _object_diff(olds, news, [], acc)
    rk = set(replace_keys)
    return DiffResult(changed, {k: (kind, k in rk) for k, kind in acc.items()})


# --- Go's %q -------------------------------------------------------------------------------------
_GO_ESC = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
           "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def go_quote(s: str) -> str:
    """strconv.Quote (what ``fmt.Errorf("%q", cmd)`` prints in the real provider's errors)."""
    out = ['"']
    for ch in s:
        if ch in _GO_ESC:
            out.append(_GO_ESC[ch])
        elif ch.isprintable() and (ch == " " or not ch.isspace()):
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)
