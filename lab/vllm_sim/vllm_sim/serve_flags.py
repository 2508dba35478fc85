"""V2 mode: `vllm serve`'s command line as vLLM 0.33.0 parses it.

The flags are the real ones (serve_flags_0_33_0.txt, extracted from the 0.33.0 source by
lab/vllm_sim/extract_serve_flags.py). The rules are FlexibleArgumentParser's
(vllm/utils/argparse_utils.py:313-502):
- `--model X` is moved to the front as the positional model, with vLLM's warning (:324-356);
- `--served-model-name` without a positional model is a ValueError (:357-369);
- in every `--long` name, `_` is read as `-` up to the first `.` (:374-394);
- `-O3` / `-O 3` mean `--optimization-level 3` (:395-406);
- `--a.b value` is gathered into `--a '{"b": value}'` (:410-502);
- then plain argparse: unique prefixes of long flags are accepted (allow_abbrev is never turned
  off in vLLM), and an unknown flag is argparse's error, exit code 2.
`--config FILE` (YAML) is accepted as a flag but its content is not read here.
"""

import argparse
import json
import re
from importlib import resources
from typing import Any

from vllm_sim.logger import init_logger

logger = init_logger(__name__)

FLAG_TABLE = "serve_flags_0_33_0.txt"
_INT_FLAGS = {"tensor_parallel_size", "pipeline_parallel_size", "port", "data_parallel_size",
              "nnodes", "max_num_seqs",
              # native multi-node mode (native.py): ints in vLLM too (ParallelConfig fields,
              # FrontendArgs.api_server_count)
              "node_rank", "master_port", "api_server_count", "distributed_timeout_seconds",
              "prefill_context_parallel_size"}
_BACKENDS = ["ray", "mp", "uni", "external_launcher"]
# The real defaults of the flags the simulator acts on (vllm/config/parallel.py:140-142,
# vllm/entrypoints/common/cli_args.py FrontendArgs.port); every other flag defaults to None.
# data_parallel_size and nnodes as real vLLM 0.26.0 parsed them (tests/fixtures/real-vllm).
# max_num_seqs stays None here, as in vLLM (EngineArgs.max_num_seqs: int | None = None): the
# usage context's default (api_server.DEFAULT_MAX_NUM_SEQS) is applied after parsing.
_DEFAULTS: dict[str, Any] = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "port": 8000,
                             "data_parallel_size": 1, "nnodes": 1,
                             # native multi-node mode (native.py; vllm/config/parallel.py:317-326)
                             "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29501}


def load_flag_table(name: str = FLAG_TABLE) -> list[tuple[list[str], str]]:
    text = resources.files("vllm_sim").joinpath(name).read_text()
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        opts, arity = line.split("\t")
        rows.append((opts.split(), arity))
    return rows


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("model_tag", nargs="?", default=None, help="The model tag to serve.")
    for opts, arity in load_flag_table():
        if opts == ["-h", "--help"]:
            continue
        longs = [o for o in opts if o.startswith("--")]
        positives = [o for o in opts if not o.startswith("--no-")]
        negatives = [o for o in longs if o.startswith("--no-")]
        dest = positives[0].lstrip("-").replace("-", "_")
        for o in positives:  # the dest is the first long name, as argparse would pick
            if o.startswith("--"):
                dest = o[2:].replace("-", "_")
                break
        if arity == "0" and negatives:
            serve.add_argument(
                *positives, dest=dest, action=argparse.BooleanOptionalAction, default=None
            )
        elif arity == "0":
            serve.add_argument(*opts, dest=dest, action="store_true", default=None)
        else:
            kwargs: dict[str, Any] = {"dest": dest, "default": _DEFAULTS.get(dest)}
            if arity in ("?", "+"):
                kwargs["nargs"] = arity
            elif arity.isdigit() and arity != "1":
                kwargs["nargs"] = int(arity)
            if dest in _INT_FLAGS:
                kwargs["type"] = int
            if dest == "distributed_executor_backend":
                kwargs["choices"] = _BACKENDS
            if dest == "served_model_name":
                kwargs["nargs"] = "+"
            if dest == "middleware":  # vllm/entrypoints/common/cli_args.py:407-411
                kwargs.update(action="append", default=[])
            serve.add_argument(*opts, **kwargs)


def flexible_argv(args: list[str]) -> list[str]:
    """FlexibleArgumentParser.parse_args's rewriting, before argparse sees the arguments."""
    if args[:1] == ["serve"]:
        idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if idx is not None:
            logger.warning(
                "With `vllm serve`, you should provide the model as a "
                "positional argument or in a config file instead of via "
                "the `--model` option. "
                "The `--model` option will be removed in a future version."
            )
            if args[idx] == "--model":
                tag, rest = args[idx + 1], idx + 2
            else:
                tag, rest = args[idx].removeprefix("--model="), idx + 1
            args = ["serve", tag, *args[1:idx], *args[rest:]]
        if (
            len(args) > 1
            and args[1].startswith("-")
            and not any(re.match(r"^--config(=.+|$)", a) for a in args)
            and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)
        ):
            raise ValueError(
                "`model` should be provided as the first positional argument when "
                "using `vllm serve`. i.e. `vllm serve <model> --<arg> <value>`."
            )

    before_dot = re.compile(r"(?<=--)[^\.]*")
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            key = before_dot.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
            out.append(f"{key}{eq}{value}")
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            out += ["--optimization-level", level]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)

    # Dotted keys become one JSON argument per top-level key.
    delete: set[int] = set()
    dotted: dict[str, dict[str, Any]] = {}
    for i, arg in enumerate(out):
        if i in delete or not arg.startswith("-") or "." not in arg:
            continue
        if "=" in arg:
            name, value_str = arg.split("=", 1)
            if "." not in name:
                continue
        else:
            if i + 1 >= len(out):
                continue
            name, value_str = arg, out[i + 1]
            delete.add(i + 1)
        if name.endswith("+"):
            name, value_str = name[:-1], json.dumps(value_str.split(","))
        key, *keys = name.split(".")
        try:
            value: Any = json.loads(value_str)
        except json.JSONDecodeError:
            value = value_str
        node = dotted.setdefault(key, {})
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
        delete.add(i)
    out = [a for i, a in enumerate(out) if i not in delete]
    for key, value in dotted.items():
        out += [key, json.dumps(value)]
    return out
