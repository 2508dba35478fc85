"""Capture real `pulumi preview --json` documents of the lab stack, one per change kind, for
the summary tool's tests (tests/unit/test_summary.py), or check that today's program still plans
what they hold:

    make captures                    (lab up, deploy, capture every kind, ray and native; down)
    source lab/env.sh && python -m lab.capture_previews [--stack lab] [--out DIR] [KIND ...]
    python -m lab.capture_previews --check [--out DIR]   (writes nothing; the lab suite runs it)

Run it on a lab whose 2-node stack is deployed and serving (`python -m lab up`, then
`pulumi up --stack lab`), with the lab's default subnets, so the captured addresses are the ones
the tests expect. For each kind it changes the stack config with the `pulumi` CLI (`config set`,
`config set-all --json` for structured values, `config set --secret` with the value on stdin),
runs `pulumi preview --json --show-sames` and saves the document whole, as the CLI wrote it
(nothing is stripped), to tests/fixtures/previews/<kind>.json. `--show-sames` makes kept
resources steps of their own, so the summary lists what a change does *not* restart. Never
`--refresh`: a plain preview contacts no node (the program skips its host-key check in a
preview), so nothing on the lab changes.

After each kind, and on any failure or Ctrl-C, the stack file is put back byte for byte (its
secrets' ciphertexts and salt included), then checked against `pulumi config --json` as read
before. Last, every captured file is searched for each secret value (the apiKey before and
after its rotation, the hfToken if set, each line of the SSH key): a file that holds one is
deleted and the run fails, naming the file and which secret (never the value).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import config, envsh, keys
from spark_vllm import summary

NS = "spark-vllm"
OUT_DIR = config.REPO_DIR / "tests" / "fixtures" / "previews"
PREVIEW_TIMEOUT_S = 300  # the engine runs the program; it contacts no node
# node-3 for the "node added" kind: never started, so any free address of the lab's subnets
NODE3_HOST, NODE3_FABRIC_IP = "10.231.0.13", "192.168.231.13"
OTHER_IMAGE = f"{config.INNER_IMAGE}-{config.LEGACY_SIM_VLLM_VERSION}"  # an image the lab has


class CaptureError(RuntimeError):
    """A step of the capture failed; the message names it."""


class Pulumi:
    """The `pulumi` CLI on one stack, in the lab's environment, from the repository root."""

    def __init__(self, stack: str, env: dict[str, str]) -> None:
        self.stack, self.env = stack, env

    def run(self, *args: str, stdin: str = "", timeout: float = 120) -> str:
        proc = subprocess.run(["pulumi", *args, "--stack", self.stack], cwd=config.REPO_DIR,
                              env=self.env, input=stdin, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            # the arguments hold no secret: secret values only ever go through stdin
            raise CaptureError(f"`pulumi {' '.join(args)}` exit {proc.returncode}: "
                               f"{proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def config(self) -> dict[str, Any]:
        """`pulumi config --json`: secrets without their values."""
        data: dict[str, Any] = json.loads(self.run("config", "--json"))
        return data

    def value(self, key: str) -> Any:
        """A non-secret config value, decoded (objects as objects)."""
        entry = self.config().get(f"{NS}:{key}")
        if entry is None:
            return None
        if "objectValue" in entry:
            return entry["objectValue"]
        try:
            return json.loads(entry["value"])
        except (ValueError, TypeError):
            return entry.get("value")

    def secret(self, key: str) -> str | None:
        try:
            return self.run("config", "get", f"{NS}:{key}").rstrip("\n")
        except CaptureError:
            return None  # not set

    def set(self, key: str, value: Any) -> None:
        if isinstance(value, dict | list):
            text = json.dumps(value)
            self.run("config", "set-all", "--json", json.dumps(
                {f"{NS}:{key}": {"value": text, "objectValue": value, "secret": False}}))
        else:
            self.run("config", "set", "--plaintext", f"{NS}:{key}", str(value))

    def set_secret(self, key: str, value: str) -> None:
        self.run("config", "set", "--secret", f"{NS}:{key}", stdin=value)

    def preview(self) -> str:
        return self.run("preview", "--json", "--show-sames", timeout=PREVIEW_TIMEOUT_S)


@dataclass(frozen=True)
class Kind:
    name: str
    what: str
    change: Callable[[Pulumi, dict[str, Any]], None]  # (cli, lab info)


def _env(cli: Pulumi, _lab: dict[str, Any]) -> None:
    cli.set("env", {**(cli.value("env") or {}), "NCCL_DEBUG": "INFO"})


def _identity(cli: Pulumi, lab: dict[str, Any]) -> None:
    nodes = cli.value("nodes")
    nodes[0]["fabricIp"] = lab["nodes"][0]["spareFabricIp"]
    cli.set("nodes", nodes)


def _node_added(cli: Pulumi, _lab: dict[str, Any]) -> None:
    nodes = cli.value("nodes")
    # node-3 never answers (a preview contacts no node): node-2's key stands in for its pin
    template = dict(nodes[-1])
    nodes.append({**template, "name": "node-3", "host": NODE3_HOST, "fabricIp": NODE3_FABRIC_IP})
    cli.set("nodes", nodes)
    cli.set("tensorParallelSize", 3)


def _node_removed(cli: Pulumi, _lab: dict[str, Any]) -> None:
    cli.set("nodes", cli.value("nodes")[:1])
    cli.set("tensorParallelSize", 1)


OTHER_MODEL = "lab/other-model"  # any repo id: a preview stages nothing
ROTATED: dict[str, str] = {}  # the secrets the rotation kinds set, for the secret scan


def _secret_rotated(cli: Pulumi, _lab: dict[str, Any]) -> None:
    ROTATED["apiKey (rotated)"] = secrets.token_urlsafe(24)
    cli.set_secret("apiKey", ROTATED["apiKey (rotated)"])


def _ssh_key_rotated(cli: Pulumi, _lab: dict[str, Any]) -> None:
    """A new deploy key (a preview contacts no node: the nodes need not know it)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "",
                        "-f", f"{d}/key"], check=True, capture_output=True, timeout=30)
        key = Path(d, "key").read_text()
    for i, line in enumerate(key.splitlines()):
        if len(line.strip()) >= 8 and not line.startswith("-----"):
            ROTATED[f"rotated SSH key line {i + 1}"] = line.strip()
    cli.set_secret("sshPrivateKey", key)


KINDS = (
    Kind("noop", "nothing changed", lambda cli, lab: None),
    Kind("env", "env NCCL_DEBUG WARN -> INFO", _env),
    Kind("identity", "nodes[0].fabricIp -> the lab's spare fabric address", _identity),
    Kind("image", f"image -> {OTHER_IMAGE}", lambda cli, lab: cli.set("image", OTHER_IMAGE)),
    Kind("vllm-arg", "vllmArgs = [--max-model-len, 8192]",
         lambda cli, lab: cli.set("vllmArgs", ["--max-model-len", "8192"])),
    Kind("node-added", "node-3 appended, tensorParallelSize 3", _node_added),
    Kind("node-removed", "nodes[1] dropped, tensorParallelSize 1", _node_removed),
    Kind("secret-rotated", "apiKey set to a new random value", _secret_rotated),
    Kind("ssh-key-rotated", "sshPrivateKey set to a new ed25519 key", _ssh_key_rotated),
    Kind("model", f"model -> {OTHER_MODEL} (staged to every node)",
         lambda cli, lab: cli.set("model", OTHER_MODEL)),
)


def preconditions(cli: Pulumi, lab: dict[str, Any]) -> list[str]:
    """What differs from the lab `python -m lab up` writes (the tests expect those values)."""
    problems = []
    nodes = cli.value("nodes") or []
    want = [config.node_addrs(i, config.DEFAULT_MGMT_SUBNET, config.DEFAULT_FABRIC_SUBNET)
            for i in (1, 2)]
    seen = [(n.get("name"), n.get("host"), n.get("fabricIp")) for n in nodes]
    if seen != [(a.name, a.mgmt_ip, a.fabric_ip) for a in want]:
        problems.append(f"nodes are {seen}, not the default 2-node lab "
                        f"{[(a.name, a.mgmt_ip, a.fabric_ip) for a in want]}")
    spare = lab["nodes"][0].get("spareFabricIp") if lab.get("nodes") else None
    if spare != want[0].spare_ip:
        problems.append(f"node-1's spare fabric address is {spare}, not {want[0].spare_ip}")
    if (image := cli.value("image")) != config.INNER_IMAGE:
        problems.append(f"image is {image!r}, not {config.INNER_IMAGE!r}")
    if ((env := cli.value("env")) or {}).get("NCCL_DEBUG") != "WARN":
        problems.append(f"env is {env!r}: NCCL_DEBUG must be WARN")
    if args := cli.value("vllmArgs"):
        problems.append(f"vllmArgs is {args!r}, not empty")
    if str(cli.value("tensorParallelSize")) != "2":
        problems.append(f"tensorParallelSize is {cli.value('tensorParallelSize')!r}, not 2")
    return problems


def check_preview(kind: str, text: str) -> str:
    """The document must be a successful preview; returns the summary's text for the log."""
    doc = summary.load(text)
    result = summary.summarize(doc)
    if result.errors:
        raise CaptureError(f"{kind}: the preview reports errors: {result.errors}")
    if (kind == "noop") != result.is_noop:
        raise CaptureError(f"{kind}: expected {'no' if kind == 'noop' else 'a'} change, got:\n"
                           + summary.render_text(result))
    return summary.render_text(result)


def secret_values(cli: Pulumi, api_key: str | None) -> dict[str, str]:
    """Name -> value of every secret the captured files must not hold."""
    found = {"apiKey": api_key or "", "hfToken": cli.secret("hfToken") or "", **ROTATED}
    key_texts = [keys.client_key().read_text() if keys.client_key().exists() else "",
                 cli.secret("sshPrivateKey") or ""]
    for text in key_texts:
        for i, line in enumerate(text.splitlines()):
            if len(line.strip()) >= 8:
                found[f"SSH key line {i + 1}"] = line.strip()
    return {name: value for name, value in found.items() if value}


def scan(files: list[Path], values: dict[str, str]) -> list[tuple[Path, str]]:
    """(file, secret name) for each secret found in a file, raw or JSON-escaped."""
    leaks = []
    for path in files:
        text = path.read_text()
        for name, value in values.items():
            if value in text or json.dumps(value)[1:-1] in text:
                leaks.append((path, name))
    return leaks


def _lab_info(stack: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "lab", "info", "--json", "--stack", stack],
                          cwd=config.REPO_DIR, env=env, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise CaptureError(f"`python -m lab info --json` failed (is the lab up?): "
                           f"{proc.stderr.strip()[-1000:]}")
    info: dict[str, Any] = json.loads(proc.stdout)
    return info


def plan(text: str) -> list[tuple[str, str]]:
    """What a preview plans: (op, resource name) of every step, sames included, in order."""
    doc = summary.load(text)
    return sorted((s["op"], s["urn"].split("::")[-1]) for s in doc.get("steps", []))


def plan_difference(kind: str, captured: str, now: str) -> str | None:
    """None when today's program plans what the capture holds, else what differs."""
    was, is_ = plan(captured), plan(now)
    if was == is_:
        return None
    gone = sorted(set(was) - set(is_))
    new = sorted(set(is_) - set(was))
    return (f"{kind}: today's program plans another change than its capture:\n"
            + "".join(f"    capture only: {op} {name}\n" for op, name in gone)
            + "".join(f"    today only:   {op} {name}\n" for op, name in new))


def capture(stack: str, kinds: list[Kind], out: Path, check: bool = False) -> list[Path]:
    env = dict(os.environ) if "SPARK_VLLM_TOOLCHAIN_BIN" in os.environ else envsh.sourced()
    cli = Pulumi(stack, env)
    stack_file = config.stack_file(stack)
    if not stack_file.exists():
        raise CaptureError(f"{stack_file} not found: `python -m lab up` writes it")
    lab = _lab_info(stack, env)
    if problems := preconditions(cli, lab):
        raise CaptureError("the lab stack is not the one the tests expect:\n  - "
                           + "\n  - ".join(problems) + "\n(`python -m lab up` rewrites "
                           f"{stack_file.name}; then `pulumi up --stack {stack}`)")
    check_preview("noop", cli.preview())  # deployed == config, before anything is edited
    original, before = stack_file.read_bytes(), cli.config()
    api_key = cli.secret("apiKey")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    stale: list[str] = []
    try:
        for kind in kinds:
            print(f"[capture] {kind.name}: {kind.what}", file=sys.stderr)
            try:
                kind.change(cli, lab)
                text = cli.preview()
            finally:
                stack_file.write_bytes(original)
            report = check_preview(kind.name, text)
            path = out / f"{kind.name}.json"
            if check:
                if not path.exists():
                    stale.append(f"{kind.name}: no capture at {path}")
                elif diff := plan_difference(kind.name, path.read_text(), text):
                    stale.append(diff)
                continue
            path.write_text(text if text.endswith("\n") else text + "\n")
            written.append(path)
            print(report, file=sys.stderr)
    finally:
        stack_file.write_bytes(original)  # whatever happened: the config as it was
    if cli.config() != before or cli.secret("apiKey") != api_key:
        raise CaptureError(f"{stack_file} was put back but `pulumi config` differs from "
                           "before the capture: check it by hand")
    if stale:
        raise CaptureError("the captures are not today's program's plans (regenerate them: "
                           "`make captures`):\n" + "\n".join(stale))
    if leaks := scan(written, secret_values(cli, api_key)):
        for path, _ in leaks:
            path.unlink(missing_ok=True)
        raise CaptureError("SECRET VALUES IN CAPTURED PREVIEWS (those files are deleted):\n  "
                           + "\n  ".join(f"{p.name}: {name}" for p, name in leaks))
    return written


def _terminate(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt  # a `kill` restores the stack file too (capture's finally)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.capture_previews", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", default=config.DEFAULT_STACK)
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--check", action="store_true",
                    help="write nothing: fail when today's program plans, for a kind, another "
                         "change than its committed capture (op per resource, sames included)")
    ap.add_argument("kinds", nargs="*", metavar="KIND",
                    help=f"kinds to capture (default: all): {', '.join(k.name for k in KINDS)}")
    args = ap.parse_args(argv)
    if unknown := set(args.kinds) - {k.name for k in KINDS}:
        ap.error(f"unknown kind(s): {', '.join(sorted(unknown))}")
    kinds = [k for k in KINDS if not args.kinds or k.name in args.kinds]
    signal.signal(signal.SIGTERM, _terminate)
    try:
        written = capture(args.stack, kinds, args.out.resolve(), check=args.check)
    except CaptureError as err:
        print(f"capture_previews: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("capture_previews: interrupted; the stack file is restored", file=sys.stderr)
        return 130
    print("\n".join(map(str, written)) if written else
          f"{len(kinds)} kind(s): today's program plans what each capture holds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
