"""spark-vllm's memory admission, run on the head with its python3 (stdlib only) after the
model is staged and before any container starts: `python3 PROGRAM KEYFILE`, the program
preceded by `PAYLOAD = {…}` (the layout, vLLM's memory flags, how the head reaches each node)
and `HELPERS = {…}` (the sources of spark_vllm/memory_model.py, memory_profile.py,
memory_estimate.py, node_memory.py and scripts/image_check.py, whose code it runs rather than
repeats; loaded as the modules of one package, in that order, so that their relative imports
resolve).

Reads the model's own files in the head's hfCache (config.json, the safetensors headers),
estimates what each rank holds (memory_estimate.estimate), asks every node now how much GPU
memory is free and CUDA's total (node_memory.SCRIPT: CUDA's total through libcuda, nvidia-smi's
free, or MemAvailable on unified memory; a node
without nvidia-smi is not checked), and refuses, with a per-node table and the largest
--max-model-len that fits, what vLLM would refuse minutes into its load. The stack's own
running vLLM holds `--gpu-memory-utilization` x total on every node until the replacement
stops it: that is counted as free. Prints one JSON line: the estimate and each node's numbers.
(No `from __future__` import: the PAYLOAD line comes first.)
"""

import json
import os
import subprocess
import sys
import tempfile
import types
from typing import Any

PACKAGE = "spark_vllm_helpers"  # the helpers' package here, so their relative imports resolve


def load(name: str) -> types.ModuleType:
    """A helper's source as the module PACKAGE.name (dataclasses look their module up)."""
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = []
        sys.modules[PACKAGE] = package
    mod = types.ModuleType(f"{PACKAGE}.{name}")
    mod.__package__ = PACKAGE
    sys.modules[mod.__name__] = mod
    exec(compile(globals()["HELPERS"][name], f"{name}.py", "exec"), mod.__dict__)
    return mod


def node_memory_of(ssh: Any, key: str, tmp: str, node: dict[str, Any], script: str,
                   local: bool) -> tuple[str, str]:
    """("ok", the script's output) or ("unreachable", why)."""
    proc = ssh.run_on(key, tmp, node, script, local)
    if proc is None:
        return "unreachable", "no answer within 60 s"
    if proc.returncode != 0:
        return "unreachable", (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return "ok", proc.stdout


def tightest_gpu(ssh: Any, key: str, tmp: str, i: int, node: dict[str, Any], script: str,
                 nm: Any, unreachable: list[str], report: dict[str, Any]) -> Any:
    """(A node's GPU with the least free memory, the script's output), or None, said in
    `unreachable` (the node does not answer) or `report` (no nvidia-smi: not checked)."""
    state, out = node_memory_of(ssh, key, tmp, node, script, local=i == 0)
    if state != "ok":
        unreachable.append(f"the head cannot reach {node['name']} at {node['ip']} to read its "
                           f"free memory: {out}")
        return None
    gpus = nm.parse(out)
    if gpus is None:
        report[node["name"]] = "not checked (no nvidia-smi)"
        return None
    return min(gpus, key=lambda g: g.free_mib), out


def running_utilization(container: str, default: float, nm: Any) -> float | None:
    """--gpu-memory-utilization of the stack's vLLM when it runs now (None: it does not)."""
    proc = subprocess.run(["docker", "inspect", "--format",
                           "{{.State.Running}} {{json .Args}}", container],
                          capture_output=True, text=True)
    running, _, args = proc.stdout.strip().partition(" ")
    if proc.returncode != 0 or running != "true":
        return None
    try:
        return float(nm.flag_value(json.loads(args), "--gpu-memory-utilization") or default)
    except ValueError:
        return default


def estimate_of(me: Any, hf: str, p: dict[str, Any]) -> Any:
    """The model's estimate from its files in the head's hfCache (raises when unreadable)."""
    snapshot = os.path.join(hf, "hub", "models--" + p["model"].replace("/", "--"), "snapshots")
    try:
        with open(os.path.join(os.path.dirname(snapshot), "refs", p["revision"])) as f:
            commit = f.read().strip()
    except OSError:
        commit = p["revision"]
    model = me.read_model(os.path.join(snapshot, commit))
    return me.estimate(model, p["tp"], p["pp"], **p["flags"])


def main(key: str, p: dict[str, Any]) -> int:
    load("memory_model")
    load("memory_profile")
    me, nm, ssh = load("memory_estimate"), load("node_memory"), load("image_check")
    if "models" in p:
        return several(key, p, me, nm, ssh)
    try:
        est = estimate_of(me, p["hf"], p)
    except (OSError, ValueError, KeyError) as err:
        print(f"[spark-vllm] memory: not checked: cannot read {p['model']} in {p['hf']} on the "
              f"head ({type(err).__name__}: {err})", file=sys.stderr)
        print(json.dumps({"checked": False, "why": str(err)}))
        return 0
    util = p["utilization"]
    held = running_utilization(p["vllmContainer"], nm.DEFAULT_UTILIZATION, nm)
    rows: list[Any] = []
    unreachable: list[str] = []
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, node in enumerate(p["nodes"]):
            read = tightest_gpu(ssh, key, tmp, i, node, nm.SCRIPT, nm, unreachable, report)
            if read is None:
                continue
            g = read[0]
            total, free = g.total_bytes, g.free_bytes  # CUDA's total where the node says it
            if held is not None:  # the stack's vLLM, stopped before the new one starts
                free = min(total, free + int(held * total))
            # auto: vLLM fits the context at load; what must fit now is one short request
            f = me.fit(est, total, free, util,
                       est.len_step if p.get("autoLength") else p["flags"].get("max_model_len"))
            rows.append((node["name"], f))
            report[node["name"]] = {"source": g.source, "total": total, "free": free,
                                    "weights": f.weights, "kvNeeded": f.kv_needed,
                                    "kvAvailable": f.kv_available, "left": f.left,
                                    "maxModelLen": f.max_model_len, "tokens": f.tokens}
    if unreachable:
        print("\n".join(unreachable), file=sys.stderr)
        return 1
    longest = min((f.max_model_len for _, f in rows), default=0)
    summary = {"checked": bool(rows),
               "maxModelLen": longest if p.get("autoLength") and rows else est.max_model_len,
               "weightsPerRank": max(est.weights), "kvPerToken": est.kv_bytes_per_token(),
               "utilization": util, "nodes": report}
    bad = [(n, f) for n, f in rows if not f.ok]
    asked = "auto" if p.get("autoLength") else est.max_model_len
    if bad:
        lines = [f"vLLM would not fit at --gpu-memory-utilization {util} with --max-model-len "
                 f"{asked} (estimated from {p['model']}'s own files, GiB):",
                 *("  " + line for line in me.table(rows)),
                 *(f"  {n}: {f.reason}" for n, f in bad),
                 (f"The largest --max-model-len that fits on every node: {longest}. Set it in "
                  "vllmArgs (or maxModelLen: auto), raise --gpu-memory-utilization, or free "
                  "memory on the node." if longest else
                  "Nothing fits: free memory on the node, raise --gpu-memory-utilization, or "
                  "spread the model over more ranks.")]
        print("\n".join(lines), file=sys.stderr)
        return 1
    for n, f in rows:
        what = (f"--max-model-len auto: about {f.max_model_len} tokens fit" if p.get("autoLength")
                else f"KV for {est.max_model_len} tokens {f.kv_needed / 2**30:.2f} GiB")
        print(f"[spark-vllm] memory: {n}: fits: {f.free / 2**30:.1f} GiB free, weights "
              f"{f.weights / 2**30:.2f} GiB, {what} of {f.kv_available / 2**30:.2f} GiB "
              f"({f.tokens} tokens in the KV cache)", file=sys.stderr)
    print(json.dumps(summary, sort_keys=True))
    return 0


HELD_SH = ("for c in {names}; do docker inspect --format '{{{{.State.Running}}}} "
           "{{{{json .Args}}}}' \"$c\" 2>/dev/null | sed \"s|^|held $c |\" || true; done")


def held_on(out: str, nm: Any) -> dict[str, float]:
    """The stack's models running on a node now: container -> its --gpu-memory-utilization."""
    held = {}
    for line in out.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0] == "held" and parts[2] == "true":
            try:
                held[parts[1]] = float(nm.flag_value(json.loads(parts[3]),
                                                     "--gpu-memory-utilization")
                                       or nm.DEFAULT_UTILIZATION)
            except ValueError:
                held[parts[1]] = nm.DEFAULT_UTILIZATION
    return held


def several(key: str, p: dict[str, Any], me: Any, nm: Any, ssh: Any) -> int:
    """Several models (`models:`): per node, every model placed there in start order, each
    seeing the free memory the ones before it left (node_memory.start_order_free), and its own
    KV cache in its own share (where the head holds its files)."""
    import shlex
    ests: dict[str, Any] = {}
    for m in p["models"]:
        try:
            ests[m["key"]] = estimate_of(me, p["hf"], m)
        except (OSError, ValueError, KeyError) as err:
            print(f"[spark-vllm] memory: {m['key']}: its KV cache not checked: cannot read "
                  f"{m['model']} in {p['hf']} on the head ({type(err).__name__}); its share "
                  "of each node is", file=sys.stderr)
    report: dict[str, Any] = {}
    unreachable: list[str] = []
    refusals: list[str] = []
    rows: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, node in enumerate(p["nodes"]):
            placed = [m for m in p["models"] if node["name"] in m["containers"]]
            if not placed:
                continue
            names = " ".join(shlex.quote(m["containers"][node["name"]]) for m in placed)
            read = tightest_gpu(ssh, key, tmp, i, node,
                                nm.SCRIPT + HELD_SH.format(names=names) + "\n", nm,
                                unreachable, report)
            if read is None:
                continue
            g, out = read
            total, free = g.total_bytes, g.free_bytes
            held = sum(held_on(out, nm).values())
            shares = [(m["key"], m["utilization"]) for m in placed]
            starts = dict(nm.start_order_free(total, free, held, shares))
            node_bad = False
            models: dict[str, Any] = {}
            for m in placed:
                util, at_start = m["utilization"], starts[m["key"]]
                est = ests.get(m["key"])
                if est is None:
                    ok = at_start >= util * total
                    models[m["key"]] = {"utilization": util, "freeAtStart": at_start,
                                        "kv": "not checked"}
                    if not ok:
                        node_bad = True
                        refusals.append(f"  {node['name']} {m['key']}: {at_start / 2**30:.1f} "
                                        f"GiB free at its start; vLLM needs {util:g} × total = "
                                        f"{util * total / 2**30:.1f} GiB free to start")
                    continue
                f = me.fit(est, total, at_start, util,
                           est.len_step if m["autoLength"] else m["flags"].get("max_model_len"))
                rows.append((f"{node['name']} {m['key']}", f))
                models[m["key"]] = {"utilization": util, "freeAtStart": at_start,
                                    "weights": f.weights, "kvNeeded": f.kv_needed,
                                    "kvAvailable": f.kv_available, "maxModelLen": f.max_model_len,
                                    "tokens": f.tokens, "fits": f.ok}
                if not f.ok:
                    node_bad = True
                    refusals.append(f"  {node['name']} {m['key']}: {f.reason}")
            report[node["name"]] = {"source": g.source, "total": total, "free": free,
                                    "held": held, "models": models}
            if node_bad:  # the node's shares first, then what each model ran into
                mine = [r for r in refusals if r.startswith(f"  {node['name']} ")]
                refusals = [r for r in refusals if r not in mine] + [
                    "  " + line for line in nm.share_lines(node["name"], total, free, held,
                                                            shares)] + mine
    if unreachable:
        print("\n".join(unreachable), file=sys.stderr)
        return 1
    if refusals:
        print("\n".join(["The models do not fit together (each node's models in start order; "
                         "estimated from each model's own files, GiB):", *refusals,
                         *(["  " + line for line in me.table(rows)] if rows else []),
                         "Lower a model's --gpu-memory-utilization (its share), place it on "
                         "other nodes, or serve fewer models."]), file=sys.stderr)
        return 1
    for node, r in report.items():
        if isinstance(r, dict):
            parts = ", ".join(f"{k} {v['utilization']:g}" for k, v in r["models"].items())
            print(f"[spark-vllm] memory: {node}: fits: {parts} of "
                  f"{r['total'] / 2**30:.1f} GiB ({r['free'] / 2**30:.1f} GiB free)",
                  file=sys.stderr)
    print(json.dumps({"checked": bool(report), "nodes": report}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(globals()["PAYLOAD"])))
