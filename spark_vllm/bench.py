"""`spark-vllm bench`: a serving benchmark of the stack's endpoint, compared with its baseline.

    spark-vllm bench [--stack S] [--profile quick|spark] [--tokenizer T] [--corpus FILE]
                     [--out DIR] [--new-baseline] [--strict]

The load is llama-benchy's (bench_load.py), from this machine to the stack's endpoint, with the
stack's API key (read from the stack's config, kept in memory: never printed, never on a
command line). The first good run of a stack (no failed request) is its baseline; every later
run is compared with it, each regression named with both figures and with what changed in the
stack since (the image, each config key, each env name). Everything goes to
`<project>/bench-results/<stack>/`: `baseline.json` (commit it), and per run `<time>.json`,
`<time>.md` and `<time>.png` (throughput and latency against concurrency, beside the baseline).
Exit 0; 1 with --strict when a figure regressed; 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import bench_load, bench_report, errors
from .components import ssh
from .status import project_dir, select_stack
from .status_report import NAMESPACE, config_secret, node_target

SECRET_KEYS = ("apiKey", "sshPrivateKey", "hfToken")


def deployment(stack: Any, outputs: dict[str, Any]) -> dict[str, Any]:
    """What the stack is now, to tell later what changed: the image (name and id) and every
    non-secret config key of the program; env values only as digests."""
    config = {}
    for key, value in stack.get_all_config().items():
        ns, _, name = key.partition(":")
        if ns != NAMESPACE or name in SECRET_KEYS or value.secret:
            continue
        parsed: Any = value.value
        try:
            parsed = json.loads(value.value)
        except (TypeError, ValueError):
            pass
        if name == "env" and isinstance(parsed, dict):
            parsed = {k: hashlib.sha256(str(v).encode()).hexdigest()[:16]
                      for k, v in parsed.items()}
        config[name] = parsed
    image = outputs.get("image") or {}
    return {"image": {"name": image.get("name"), "id": image.get("id")}, "config": config}


def head_tokenizer(stack: Any, outputs: dict[str, Any], config: dict[str, Any], dest: Path) -> str:
    """The served model's tokenizer.json, read from the head's staged copy over SSH."""
    key = config_secret(stack, "sshPrivateKey")
    head = outputs["nodes"][0]
    model = str(config.get("model") or "")
    revision = str(config.get("revision") or "main")
    hf = str(config.get("hfCache") or "/root/.cache/huggingface").rstrip("/")
    repo = f"{hf}/hub/models--{model.replace('/', '--')}"
    script = (f"r={shlex.quote(repo)}; rev={shlex.quote(revision)}; "
              'c=$(cat "$r/refs/$rev" 2>/dev/null || echo "$rev"); '
              'cat "$r/snapshots/$c/tokenizer.json"')
    try:
        proc = ssh.run(node_target(head, key or ""), script, timeout=60)
    except ssh.NodeUnreachableError as err:
        raise errors.CliError(f"cannot read the model's tokenizer from the head: {err}",
                              "pass --tokenizer PATH (a tokenizer.json, or the model's "
                              "directory, or its Hugging Face name)") from None
    if proc.returncode != 0 or not proc.stdout.strip():
        raise errors.CliError(
            f"no tokenizer.json for {model}@{revision} under {repo} on {head['name']}",
            "pass --tokenizer PATH (a tokenizer.json, or the model's directory, or its "
            "Hugging Face name)")
    dest.write_text(proc.stdout)
    return str(dest)


def _default_text() -> str:
    try:
        return bench_load.default_text()
    except OSError as err:  # requests' errors are OSErrors
        raise errors.CliError(
            f"cannot download llama-benchy's default corpus ({bench_load.DEFAULT_BOOK_URL}): "
            f"{err}", "pass --corpus FILE (any long text: prompts are cut from it)") from None


def main(argv: list[str] | None = None, prog: str = "spark-vllm bench") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", help="stack name (default: the selected stack)")
    ap.add_argument("--profile", default="spark", choices=sorted(bench_load.PROFILES),
                    help="the load (default spark: " +
                         bench_load.PROFILES["spark"].describe() + ")")
    ap.add_argument("--tokenizer", help="tokenizer.json, the model's directory or its Hugging "
                                        "Face name (default: read from the head)")
    ap.add_argument("--corpus", type=Path, help="a text file to cut prompts from (default: "
                                                "llama-benchy's book, downloaded once)")
    ap.add_argument("--out", type=Path, help="default <project>/bench-results/<stack>")
    ap.add_argument("--new-baseline", action="store_true",
                    help="this run becomes the baseline (after an intended change)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a figure regressed")
    args = ap.parse_args(argv)
    try:
        return _bench(args)
    except errors.CliError as err:
        print(err.text("bench"), file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"bench: {err.name or err} is not installed\n  what to do: pip install "
              "'spark-vllm[bench]' (llama-benchy and matplotlib) into spark-vllm's venv",
              file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace) -> int:
    import llama_benchy  # noqa: F401  (named at once when the extra is missing)
    import matplotlib  # noqa: F401

    profile = bench_load.PROFILES[args.profile]
    stack = select_stack(args.stack)
    outputs = {k: v.value for k, v in stack.outputs().items()}
    if "endpoint" not in outputs:
        raise errors.CliError(f"stack {stack.name} has no endpoint output",
                              f"run `pulumi up --stack {stack.name}` first")
    api_key = config_secret(stack, "apiKey")
    now = deployment(stack, outputs)
    out_dir = args.out or project_dir() / "bench-results" / stack.name
    when = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    print(f"bench: stack {stack.name}, {outputs['endpoint']}, profile {profile.describe()}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="spark-vllm-bench-") as tmp:
        tokenizer = args.tokenizer or head_tokenizer(stack, outputs, now["config"],
                                                     Path(tmp) / "tokenizer.json")
        text = args.corpus.read_text() if args.corpus else _default_text()
        try:
            load = bench_load.run(outputs["endpoint"], api_key, outputs["servedModelName"],
                                  tokenizer, text, profile,
                                  progress=lambda s: print(f"bench: {s}", file=sys.stderr,
                                                           flush=True))
        except bench_load.LoadError as err:
            raise errors.CliError(f"the benchmark stopped: {err}",
                                  f"check the endpoint: spark-vllm status --stack {stack.name}"
                                  " (HTTP 401: the stack's apiKey is not what the server has)"
                                  ) from None
    if not load.requests:
        raise errors.CliError("the benchmark made no request",
                              "see llama-benchy's output:\n" + load.log[-2000:])
    run = {"stack": stack.name, "when": when, "endpoint": outputs["endpoint"],
           "model": outputs["servedModelName"], "profile": profile.name,
           "profileText": profile.describe(), "llamaBenchy": load.benchy_version,
           "deployment": now,
           "figures": {str(k): v for k, v in bench_report.figures(load.requests).items()},
           "benchyTable": load.benchy_table,
           "requests": [r.as_dict() for r in load.requests]}
    failed = sum(int(f["errors"]) for f in run["figures"].values())
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline_file = out_dir / "baseline.json"
    baseline = None
    if baseline_file.exists() and not args.new_baseline:
        baseline = json.loads(baseline_file.read_text())
        if baseline.get("profile") != profile.name:
            print(f"bench: the baseline ran profile {baseline.get('profile')}, this run "
                  f"{profile.name}: not compared (--new-baseline to replace it)", file=sys.stderr)
            baseline = None
    found = bench_report.regressions(baseline, run, profile) if baseline else []
    changed = bench_report.changes(baseline["deployment"], now) if baseline else []
    run["regressions"] = [r.text() for r in found]
    run["changedSinceBaseline"] = changed
    (out_dir / f"{when}.json").write_text(json.dumps(run, indent=1) + "\n")
    text_out = bench_report.markdown(run, baseline, found, changed)
    (out_dir / f"{when}.md").write_text(text_out)
    bench_report.chart(run, baseline, out_dir / f"{when}.png")
    if (baseline is None and not baseline_file.exists() or args.new_baseline) and not failed:
        baseline_file.write_text(json.dumps({k: v for k, v in run.items() if k != "requests"},
                                            indent=1) + "\n")
        print(f"bench: this run is the baseline of stack {stack.name}: {baseline_file}")
    elif baseline is None and failed:
        print(f"bench: {failed} requests failed: not kept as the baseline", file=sys.stderr)
    print(text_out)
    print(f"bench: {out_dir / when}.json, .md, .png")
    for r in found:
        print(f"REGRESSION {r.text()}")
    return 1 if found and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
