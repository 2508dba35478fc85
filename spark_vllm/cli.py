"""`spark-vllm`: the operator's commands, run in a spark-vllm Pulumi project.

    spark-vllm init DIR [--requirement REQ]   a new project of your own in DIR
    spark-vllm status [--stack S] [--json] [--watch …]
    spark-vllm bench [--stack S] [--profile quick|spark] [--new-baseline] [--strict]
    spark-vllm top [--stack S] [--interval 5] [--once]
    spark-vllm summary [--format text] [preview.json]
    spark-vllm teardown --node-gone NODE [--stack S]

The project is the nearest directory at or above the current one that holds a Pulumi.yaml
(or `--cwd DIR`). A failure prints what went wrong and what to do, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata, resources
from pathlib import Path

from . import errors

PROJECT_ENV = "SPARK_VLLM_PROJECT"  # how the subcommands learn the project directory
TEMPLATE_FILES = {"Pulumi.yaml": "Pulumi.yaml", "__main__.py": "__main__.py",
                  "gitignore": ".gitignore", "stack.example.yaml": "stack.example.yaml",
                  "stack.models.example.yaml": "stack.models.example.yaml",
                  "preview.yml": ".github/workflows/spark-vllm-preview.yml"}


def installed_requirement() -> str | None:
    """`spark-vllm @ URL` for where this spark-vllm was installed from (pip's direct_url.json,
    PEP 610): a clone's path or a git URL at its commit. None for an index install."""
    try:
        text = metadata.distribution("spark-vllm").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    info = json.loads(text)
    url = info.get("url", "")
    vcs = info.get("vcs_info")
    if vcs:
        return f"spark-vllm @ {vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}".rstrip("@")
    return f"spark-vllm @ {url}" if url else None


def init(directory: Path, requirement: str | None) -> int:
    requirement = requirement or installed_requirement()
    if not requirement:
        raise errors.CliError(
            "cannot tell where this spark-vllm was installed from",
            "pass the requirement line for it: --requirement 'spark-vllm @ git+https://…@TAG' "
            "(or 'spark-vllm @ file:///path/to/clone')")
    clashes = [name for name in (*TEMPLATE_FILES.values(), "requirements.txt")
               if (directory / name).exists()]
    if clashes:
        raise errors.CliError(f"{directory} already holds {', '.join(clashes)}",
                              "pick an empty directory, or remove them first")
    directory.mkdir(parents=True, exist_ok=True)
    template = resources.files(__package__).joinpath("template")
    for src, dst in TEMPLATE_FILES.items():
        (directory / dst).parent.mkdir(parents=True, exist_ok=True)
        (directory / dst).write_text(template.joinpath(src).read_text())
    (directory / "requirements.txt").write_text(
        "# The program this project runs (pip's direct reference, PEP 508 `name @ url`): pin\n"
        "# a tag or a commit, and change it here to upgrade.\n"
        f"{requirement}\n")
    print(f"""A spark-vllm project is in {directory}. Next:
  cd {directory} && git init
  pulumi login                      # your state backend (file://…, s3://…, …)
  pulumi stack init SITE            # one stack per pair of Sparks
  cp stack.example.yaml Pulumi.SITE.yaml   # then edit: nodes, image, model, TP
  pulumi config set --secret spark-vllm:sshPrivateKey < ~/.ssh/spark-vllm-deploy
  pulumi install && pulumi preview --diff && pulumi up""")
    return 0


def find_project(start: Path) -> Path:
    for d in (start, *start.parents):
        if (d / "Pulumi.yaml").is_file():
            return d
    raise errors.CliError(f"no Pulumi.yaml in {start} or above it",
                          "run this in your spark-vllm project (made by `spark-vllm init DIR`), "
                          "or pass --cwd DIR")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spark-vllm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cwd", type=Path, help="the project directory (default: found upwards)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_init = sub.add_parser("init", help="write a new spark-vllm project into DIR")
    p_init.add_argument("directory", type=Path)
    p_init.add_argument("--requirement",
                        help="the requirements.txt line for spark-vllm (default: where this "
                             "one was installed from)")
    for name, text in (("status", "what runs on every node; --watch repairs"),
                       ("bench", "a serving benchmark of the endpoint, against its baseline"),
                       ("top", "a live view of the nodes, containers and vLLM's metrics"),
                       ("summary", "what a `pulumi preview --json` restarts, and why"),
                       ("teardown", "tear a stack down when a node is gone for good")):
        sub.add_parser(name, help=text, add_help=False)
    args, rest = ap.parse_known_args(argv)
    try:
        if args.command == "init":
            if rest:
                ap.error(f"unrecognized arguments: {' '.join(rest)}")
            return init(args.directory.expanduser().resolve(), args.requirement)
        if args.command != "summary":  # summary reads a file or stdin, no project needed
            os.environ[PROJECT_ENV] = str(find_project((args.cwd or Path.cwd()).resolve()))
        if args.command == "status":
            from . import status
            return status.main(rest, prog="spark-vllm status")
        if args.command == "top":
            from . import top
            return top.main(rest, prog="spark-vllm top")
        if args.command == "bench":
            from . import bench
            return bench.main(rest, prog="spark-vllm bench")
        if args.command == "teardown":
            from . import teardown
            return teardown.main(rest, prog="spark-vllm teardown")
        from . import summary
        return summary.main(rest, prog="spark-vllm summary")
    except errors.CliError as err:
        print(err.text(f"spark-vllm {args.command}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except FileNotFoundError as err:
        if err.filename == "pulumi" or "pulumi" in str(err):
            print(f"spark-vllm {args.command}: the `pulumi` CLI is not on PATH\n"
                  "  what to do: install it (https://www.pulumi.com/docs/install/) and retry",
                  file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

