"""`spark-vllm status`: is the stack serving, and if not, what is down where.

Reads what Pulumi knows (the stack's outputs: nodes, container ids, endpoint; its config: the
same SSH key and API key the program uses) and asks the nodes what is true now: each
container's state, Ray's own node table, vLLM's /health and one real chat completion (its
HTTP server can answer while generation is dead: vllm#53157). Prints one line per container
and a verdict; exits 0 when serving, 1 when not, 2 when it cannot tell (no stack, no outputs).

`--watch` repairs: every `--interval` s, when the verdict is not serving, it runs
`pulumi up --refresh` (only the dead containers and what depends on them are replaced),
waiting twice as long after each failed repair (up to `--max-backoff`) and giving up, exit 1,
after `--max-repairs` failed repairs in a row, so a node that is gone for good is not retried
forever. Run it under systemd (README, "Day 2").

Needs what `pulumi` needs: the CLI on PATH, the backend and passphrase in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import commands, errors, ssh
from .secret_check import NAMESPACE


def project_dir() -> Path:
    """The Pulumi project the stack belongs to: `spark-vllm --cwd`/the one found upwards (the
    CLI sets SPARK_VLLM_PROJECT), else the current directory."""
    return Path(os.environ.get("SPARK_VLLM_PROJECT") or Path.cwd())

_INSPECT = ("docker inspect --format "
            "'{{.Name}}|{{.Id}}|{{.State.Status}}|{{.State.ExitCode}}|{{.State.StartedAt}}' ")
_RAY_NODES_PY = (
    "import json, ray\n"
    "ray.init(address='auto', logging_level='ERROR', log_to_driver=False)\n"
    "print(json.dumps([{'ip': n['NodeManagerAddress'], 'gpus': n['Resources'].get('GPU', 0)}\n"
    "                  for n in ray.nodes() if n['Alive']]))\n"
)


@dataclass
class ContainerView:
    node: str
    role: str
    name: str
    state: str  # running, exited (137), gone, …
    id: str = ""
    expected_id: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "running"

    def describe(self) -> str:
        # An interrupted `pulumi up` keeps the stack's previous outputs: the next run updates
        # them. A container started by hand under the stack's name shows the same way.
        if self.state == "running" and self.expected_id and self.id != self.expected_id:
            return f"running ({self.id[:12]}; the outputs say {self.expected_id[:12]})"
        return self.state


@dataclass
class Report:
    stack: str
    endpoint: str
    model: str
    containers: list[ContainerView] = field(default_factory=list)
    ray: dict[str, str] = field(default_factory=dict)  # node -> "alive, 1 GPU" / why not
    ray_ok: bool = False
    vllm: str = ""
    vllm_ok: bool = False
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def serving(self) -> bool:
        return (not self.unreachable and self.ray_ok and self.vllm_ok
                and all(c.ok for c in self.containers))

    def problems(self) -> list[str]:
        out = [f"{n}: unreachable ({why})" for n, why in self.unreachable.items()]
        out += [f"{c.node} {c.role}: {c.describe()}" for c in self.containers if not c.ok]
        out += [f"{n}: Ray: {v}" for n, v in self.ray.items() if not v.startswith("alive")]
        if not self.vllm_ok:
            out.append(f"vLLM: {self.vllm}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "serving": self.serving, "endpoint": self.endpoint,
                "containers": [{"node": c.node, "role": c.role, "name": c.name,
                                "state": c.describe(), "ok": c.ok} for c in self.containers],
                "ray": self.ray, "vllm": self.vllm, "unreachable": self.unreachable,
                "problems": self.problems()}

    def text(self) -> str:
        lines = [f"stack {self.stack}: {self.endpoint} (model {self.model})",
                 f"{'NODE':<12}{'CONTAINER':<12}{'STATE':<40}RAY"]
        for c in self.containers:
            ray = self.ray.get(c.node, "") if c.role != commands.VLLM else ""
            lines.append(f"{c.node:<12}{c.role:<12}{c.describe():<40}{ray}")
        for node, why in self.unreachable.items():
            lines.append(f"{node:<12}{'-':<12}{'UNREACHABLE: ' + why}")
        lines.append(f"vLLM: {self.vllm}")
        if self.serving:
            lines.append("verdict: SERVING")
        else:
            lines.append("verdict: NOT SERVING: " + "; ".join(self.problems()))
            lines.append(f"repair: pulumi up --refresh --stack {self.stack}  "
                         "(replaces what died and what depends on it)")
        return "\n".join(lines)


def select_stack(stack_name: str | None) -> Any:
    from pulumi import automation as auto

    work_dir = str(project_dir())
    try:
        ws = auto.LocalWorkspace(work_dir=work_dir)
        if stack_name is None:
            current = ws.stack()
            if current is None:
                raise errors.CliError("no stack selected",
                                      "pass --stack NAME (`pulumi stack ls` lists them)")
            stack_name = current.name
        return auto.select_stack(stack_name=stack_name, work_dir=work_dir)
    except auto.CommandError as err:
        raise errors.from_pulumi(err, f"selecting stack {stack_name or '(selected)'}") from None


def config_secret(stack: Any, key: str) -> str | None:
    from pulumi import automation as auto

    try:
        value = str(stack.get_config(f"{NAMESPACE}:{key}").value)
    except auto.CommandError as err:
        # only "not found" is unset: a wrong passphrase or a backend error is said as it is
        if "not found" in str(err).lower():
            return None
        raise errors.from_pulumi(err, f"reading {NAMESPACE}:{key} of stack {stack.name}") from None
    return value or None  # "" is Pulumi.yaml's default for an unset optional secret


def _node_view(node: dict[str, Any], key: str, expected: dict[str, str],
               head: bool) -> tuple[list[ContainerView], str | None, list[dict[str, Any]] | None]:
    target = ssh.Target(node=node["name"], host=node["host"], port=int(node["port"]),
                        user=node["user"], private_key=key, host_key=node.get("hostKey") or None)
    roles = node["containers"]
    script = "\n".join(
        f"{_INSPECT}{shlex.quote(name)} 2>/dev/null || echo '/{name}||gone||'"
        for name in roles.values())
    if head:
        head_name = shlex.quote(roles[commands.HEAD])
        script += (f"\necho '---ray'\ntimeout 30 docker exec -i {head_name} python3 - "
                   "2>&1 <<'PY' | tail -n 1\n" + _RAY_NODES_PY + "PY\n")
    try:
        proc = ssh.run(target, script, timeout=60)
    except ssh.NodeUnreachableError as err:
        return [], str(err), None
    text, _, ray_text = proc.stdout.partition("---ray\n")
    views = []
    by_name = {line.split("|")[0].lstrip("/"): line.split("|") for line in text.splitlines()
               if "|" in line}
    for role, name in roles.items():
        _, cid, status, code, _ = by_name.get(name, ["", "", "gone", "", ""])
        state = status if status in ("running", "gone") else f"{status} ({code})"
        views.append(ContainerView(node["name"], role, name, state, cid,
                                   expected.get(f"{node['name']}/{role}", "")))
    ray = None
    if head:
        try:
            ray = json.loads(ray_text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            ray = None
    return views, None, ray


def _ask_vllm(endpoint: str, model: str, api_key: str | None) -> tuple[bool, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    base = endpoint.removesuffix("/v1")
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as resp:
            health = resp.status
        body = json.dumps({"model": model, "max_tokens": 8,
                           "messages": [{"role": "user", "content": "spark-vllm status"}]})
        req = urllib.request.Request(endpoint + "/chat/completions", data=body.encode(),
                                     headers=headers)
        t0 = time.monotonic()
        with urllib.request.urlopen(req, timeout=60) as resp:
            json.load(resp)["choices"][0]["message"]["content"]
        return True, f"/health {health}, a chat completion answered in {time.monotonic() - t0:.1f} s"
    except urllib.error.HTTPError as err:
        return False, f"{err.url} answered {err.code}"
    except (OSError, ValueError, KeyError) as err:
        return False, f"{base}: {getattr(err, 'reason', err)}"


def collect(stack: Any) -> Report:
    from pulumi import automation as auto

    # the key first: a wrong passphrase is said here, before anything else is read
    key = config_secret(stack, "sshPrivateKey")
    if key is None:
        raise LookupError(f"stack {stack.name}: {NAMESPACE}:sshPrivateKey is not set; set it "
                          f"with `pulumi config set --secret {NAMESPACE}:sshPrivateKey < KEYFILE`")
    try:
        outputs = {k: v.value for k, v in stack.outputs().items()}
    except auto.CommandError as err:
        raise errors.from_pulumi(err, f"reading the outputs of stack {stack.name}") from None
    if "nodes" not in outputs:
        raise LookupError(f"stack {stack.name} has no `nodes` output: run `pulumi up` first")
    api_key = config_secret(stack, "apiKey")
    nodes = outputs["nodes"]
    expected = outputs.get("containerIds") or {}
    report = Report(stack.name, outputs["endpoint"], outputs["servedModelName"])
    with ThreadPoolExecutor(max_workers=len(nodes) + 1) as pool:
        vllm = pool.submit(_ask_vllm, report.endpoint, report.model, api_key)
        views = list(pool.map(lambda i: _node_view(nodes[i], key, expected, i == 0),
                              range(len(nodes))))
        report.vllm_ok, report.vllm = vllm.result()
    ray_table = None
    for node, (containers, unreachable, ray) in zip(nodes, views, strict=True):
        report.containers += containers
        if unreachable:
            report.unreachable[node["name"]] = unreachable
        if ray is not None:
            ray_table = ray
    alive = {r["ip"]: r["gpus"] for r in ray_table or []}
    for node in nodes:
        ip = node["identityIp"]
        if ray_table is None:
            report.ray[node["name"]] = "unknown (the Ray head does not answer)"
        elif ip in alive:
            report.ray[node["name"]] = f"alive, {alive[ip]:g} GPU ({ip})"
        else:
            report.ray[node["name"]] = f"not in Ray's node table ({ip})"
    report.ray_ok = ray_table is not None and all(v.startswith("alive") for v in report.ray.values())
    return report


def _repair(stack: Any) -> bool:
    from pulumi import automation as auto

    print(f"[status] repairing: pulumi up --refresh --stack {stack.name}", flush=True)
    try:
        stack.up(refresh=True, on_output=lambda line: print(f"    {line}", flush=True))
    except auto.CommandError as err:
        print(f"[status] repair failed: {str(err).strip().splitlines()[-1:]}", flush=True)
        return False
    return True


def watch(stack: Any, interval: float, max_repairs: int, max_backoff: float) -> int:
    failures = 0
    while True:
        report = collect(stack)
        stamp = time.strftime("%F %T")
        if report.serving:
            print(f"[status] {stamp} serving", flush=True)
            failures, wait = 0, interval
        else:
            print(f"[status] {stamp} NOT SERVING: {'; '.join(report.problems())}", flush=True)
            if _repair(stack) and collect(stack).serving:
                print("[status] repaired: serving again", flush=True)
                failures, wait = 0, interval
            else:
                failures += 1
                if failures >= max_repairs:
                    print(f"[status] giving up after {failures} failed repairs in a row",
                          flush=True)
                    return 1
                wait = min(interval * 2 ** failures, max_backoff)
                print(f"[status] next try in {wait:.0f} s ({failures}/{max_repairs})", flush=True)
        time.sleep(wait)


def main(argv: list[str] | None = None, prog: str = "python -m spark_vllm.status") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", help="stack name (default: the selected stack)")
    ap.add_argument("--json", action="store_true", help="machine-readable report")
    ap.add_argument("--watch", action="store_true", help="repair with `pulumi up --refresh`")
    ap.add_argument("--interval", type=float, default=60, help="seconds between checks (60)")
    ap.add_argument("--max-repairs", type=int, default=3,
                    help="failed repairs in a row before giving up (3)")
    ap.add_argument("--max-backoff", type=float, default=900, help="longest wait, s (900)")
    args = ap.parse_args(argv)
    try:
        stack = select_stack(args.stack)
        if args.watch:
            return watch(stack, args.interval, args.max_repairs, args.max_backoff)
        report = collect(stack)
    except LookupError as err:
        print(f"status: {err}", file=sys.stderr)
        return 2
    except errors.CliError as err:
        print(err.text("status"), file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    return 0 if report.serving else 1


if __name__ == "__main__":
    sys.exit(main())
