"""What every part of the config's validation shares: the strict model base, the patterns, and
how a problem names its field. Pure: no Pulumi import."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: $ would let "A\n" through
# Control characters (Unicode Cc: C0, DEL, C1) but tab, refused in vllmArgs and env: NUL cannot
# be in an argv or an environment at all (C strings: cut short, or the run fails), and the rest
# would reach the operator's terminal raw in the rendered `docker run` that Pulumi's diffs and
# errors show (a CR or an ESC sequence rewrites what is displayed, a newline splits one argument
# over lines) and could not go into a KEY=value-a-line env-file. A tab is plain whitespace: it
# survives the quoting, displays as itself, and a JSON value or a template may hold one.
CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# huggingface_hub's repo id: namespace/name, each [\w.-] without "--" or ".." (validators.py)
HF_REPO_RE = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}$")


class Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, strict=True
    )


def printable(text: str) -> str:
    """`text` with its control characters escaped (`\\n`), so a problem stays one line."""
    return CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], text)


def control_problem(path: str, text: str) -> str | None:
    m = CONTROL_RE.search(text)
    if m is None:
        return None
    return (f"{path}: contains control character {m.group()!r}; write it on one line of plain "
            "text (tab is fine)")


def config_path(prefix: str, loc: tuple[Any, ...]) -> str:
    out = prefix
    for part in loc:  # pydantic reports the alias (camelCase) the user wrote
        name = printable(str(part))
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + name
    return out


def pydantic_problems(prefix: str, err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (a typo?)"
        elif e["type"] == "model_type":  # pydantic would name the class
            msg = "expected a mapping of its keys (docs/configuration.md)"
        problems.append(f"{config_path(prefix, loc)}: {msg}")
    return problems


def env_numbers(v: Any) -> Any:
    """An `env` map as pydantic should see it: YAML reads `NCCL_DEBUG: 1` as an int; env values
    are strings, so plain numbers are taken as written. Anything else (bools, lists) stays and
    fails strict str with its path. The stack's `env` and each model's use it."""
    if isinstance(v, Mapping):
        return {k: str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x
                for k, x in v.items()}
    return v
