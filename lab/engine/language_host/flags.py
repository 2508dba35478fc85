"""Command line of the stand-in, parsed the way Go's `flag` package parses the real host's.

The CLI launches a language plugin as::

    pulumi-language-python [--logtostderr] [-v=N] [--tracing ENDPOINT] ENGINE_ADDRESS

(`buildPluginArguments` in sdk/go/common/resource/plugin/plugin.go: the log flags only with
`--logflow`; the engine address is the last, positional argument). The real host also declares
the obsolete `-virtualenv`, `-root`, `-typechecker`, `-toolchain` (runtime options now come in
each request's ProgramInfo) and `-use-executor`. Go's rules: `-name` and `--name` are the same,
`-name=value` or `-name value` for non-boolean flags, `-name` / `-name=false` for booleans,
parsing stops at the first non-flag argument or after `--`, and an undefined flag is an error
(exit 2).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

# name -> is boolean
_FLAGS: dict[str, bool] = {
    # the real host's own flags
    "tracing": False,
    "virtualenv": False,  # obsolete
    "root": False,  # obsolete
    "typechecker": False,  # obsolete
    "toolchain": False,  # obsolete
    "use-executor": False,
    # the logging flags every Pulumi Go binary accepts (glog-style)
    "logtostderr": True,
    "alsologtostderr": True,
    "logflow": True,
    "v": False,
    "stderrthreshold": False,
    "vmodule": False,
    "log_dir": False,
    "log_backtrace_at": False,
    # stand-in only: the directory of the wrapper script (the real host looks for its exec
    # script beside its own executable, os.Executable(); the wrapper passes its directory here)
    "stand-in-bin-dir": False,
}


class UsageError(Exception):
    pass


@dataclass
class Args:
    values: dict[str, str] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def flag(self, name: str) -> bool:
        return self.values.get(name, "false").lower() in ("1", "t", "true")

    @property
    def verbosity(self) -> int:
        try:
            return int(self.values.get("v", "0"))
        except ValueError:
            return 0


def parse(argv: list[str]) -> Args:
    out = Args()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        name = a[2:] if a.startswith("--") else a[1:]
        if not name or name.startswith("-") or name.startswith("="):
            raise UsageError(f"bad flag syntax: {a}")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        if name not in _FLAGS:
            raise UsageError(f"flag provided but not defined: -{name}")
        if _FLAGS[name]:
            if value is None:
                value = "true"
            if value.lower() not in ("1", "0", "t", "f", "true", "false"):
                raise UsageError(f'invalid boolean value "{value}" for -{name}')
        elif value is None:
            i += 1
            if i >= len(argv):
                raise UsageError(f"flag needs an argument: -{name}")
            value = argv[i]
        out.values[name] = value
        i += 1
    out.positional = list(argv[i:])
    return out


def usage(prog: str) -> str:
    return (f"Usage of {prog}:\n"
            "  -tracing string\n\tEmit tracing to a Zipkin-compatible tracing endpoint\n"
            "  -use-executor string\n\tUse the given program as the executor instead of looking "
            "for one on PATH\n"
            "  -virtualenv, -root, -typechecker, -toolchain string\n\t[obsolete]\n")


def parse_or_exit(argv: list[str], prog: str = "pulumi-language-python") -> Args:
    try:
        return parse(argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        print(usage(prog), file=sys.stderr, end="")
        sys.exit(2)
