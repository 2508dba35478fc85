"""`spark-vllm teardown --node-gone NODE`: destroy a stack one of whose nodes is gone
for good (dead disk, returned hardware), removing everything on every node that answers.

`pulumi destroy` cannot remove a container on a node it cannot reach, and stops there (after
its SSH dial bound, naming the node and address). This finishes the job without editing the
state by hand, with Pulumi's own commands only:

  1. it checks that NODE really does not answer (if it does, `pulumi destroy` is the tool);
  2. for each container command of NODE, deepest first (vLLM, the API key's file, then the
     Ray head; or the worker): `pulumi destroy --target` the resources that depend on it (they live on nodes
     that answer, or delete nothing), then `pulumi state delete` the command itself: Pulumi
     forgets a container that went with its node;
  3. `pulumi destroy` for the rest (other nodes' containers, preflights, liveness checks).

The state ends empty and every node that answers is clean. Needs what `pulumi` needs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from . import errors, status
from .components import ssh
from .components.render import commands

CMD = "command:remote:Command"


def _name(urn: str) -> str:
    return urn.split("::")[-1]


def container_commands(nodes: list[dict[str, Any]], node: str) -> list[str]:
    """Resource names of the container commands on `node`, deepest first."""
    names = [n["name"] for n in nodes]
    if node not in names:
        raise LookupError(f"no node {node!r} in the stack's outputs (nodes: {', '.join(names)})")
    roles = next(n for n in nodes if n["name"] == node).get("containers") or {}
    if names.index(node) == 0:  # vLLM's container first: it depends on the others
        # then the API key's file (node.py api_key_command): its delete needs the node too
        if commands.LEADER in roles:
            return ["vllm-leader", "vllm-api-key"]
        return ["vllm-serve", "vllm-api-key", "ray-head"]
    if commands.RANK in roles:
        return [f"vllm-rank-{node}"]
    return [f"ray-worker-{node}"]


def dependents(resources: list[dict[str, Any]], urn: str) -> list[str]:
    """Every resource in the state that depends on `urn`, directly or not."""
    found: list[str] = []
    frontier = [urn]
    while frontier:
        cur = frontier.pop()
        for r in resources:
            deps = set(r.get("dependencies") or [])
            for prop in (r.get("propertyDependencies") or {}).values():
                deps |= set(prop)
            if cur in deps and r["urn"] not in found:
                found.append(r["urn"])
                frontier.append(r["urn"])
    return found


def _resources(stack: Any) -> list[dict[str, Any]]:
    return status.state_resources(stack)


def teardown(stack: Any, node: str, say: Any = print) -> None:
    outputs = {k: v.value for k, v in stack.outputs().items()}
    nodes = outputs.get("nodes")
    if not nodes:
        raise LookupError(f"stack {stack.name} has no `nodes` output: nothing to tear down "
                          "this way (pulumi destroy)")
    order = container_commands(nodes, node)
    info = next(n for n in nodes if n["name"] == node)
    key = status.config_secret(stack, "sshPrivateKey") or ""
    target = ssh.Target(node=node, host=info["host"], port=int(info["port"]), user=info["user"],
                        private_key=key, host_key=info.get("hostKey") or None)
    try:
        ssh.run(target, "true", timeout=30)
    except ssh.NodeUnreachableError as err:
        say(f"[teardown] {err}: forgetting what ran there")
    else:
        raise LookupError(f"{node} answers at {info['host']}: `pulumi destroy` removes its "
                          "containers itself")

    def echo(line: str) -> None:
        say(f"    {line}")

    for name in order:
        by_name = {_name(r["urn"]): r for r in _resources(stack) if r["type"] == CMD}
        if name not in by_name:
            continue
        urn = by_name[name]["urn"]
        deps = dependents(_resources(stack), urn)
        if deps:
            say(f"[teardown] destroying what depends on {name}: "
                f"{', '.join(_name(d) for d in deps)}")
            stack.destroy(target=deps, on_output=echo)
        say(f"[teardown] forgetting {name} (it ran on {node})")
        proc = subprocess.run(["pulumi", "state", "delete", urn, "--yes", "--stack", stack.name],
                              capture_output=True, text=True, cwd=str(status.project_dir()))
        if proc.returncode != 0:
            raise RuntimeError(f"pulumi state delete {name}: "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")
    say("[teardown] destroying the rest")
    stack.destroy(on_output=echo)
    left = _resources(stack)
    if left:
        raise RuntimeError(f"{len(left)} resource(s) left in the state: "
                           f"{', '.join(_name(r['urn']) for r in left)}")
    say(f"[teardown] done: stack {stack.name} is empty; {node} was forgotten, not cleaned: "
        "if it ever comes back, remove its spark-vllm containers by hand "
        f"(docker rm -f $(docker ps -aq --filter label=spark-vllm.stack={stack.name}))")


def main(argv: list[str] | None = None, prog: str = "python -m spark_vllm.teardown") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", help="stack name (default: the selected stack)")
    ap.add_argument("--node-gone", required=True, metavar="NODE",
                    help="the node that will not come back (its name in the config)")
    args = ap.parse_args(argv)
    from pulumi import automation as auto

    try:
        teardown(status.select_stack(args.stack), args.node_gone)
    except auto.CommandError as err:
        print(errors.from_pulumi(err, "teardown").text("teardown"), file=sys.stderr)
        return 1
    except errors.CliError as err:
        print(err.text("teardown"), file=sys.stderr)
        return 1
    except (LookupError, RuntimeError) as err:
        print(f"teardown: {str(err).strip()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
