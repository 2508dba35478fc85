"""Readiness gate, run inside the Ray head container: Ray's own node table against the spec.

argv[1]: JSON {"expected": [{"name", "ip", "gpus"}], "timeout": s, "address": "ip:port",
"preflight": [json, ...]}. The script itself comes on stdin (`python3 - PAYLOAD`), so a failure
message that quotes the command line stays short. Polls Ray's node table until every expected
node is alive under its identity IP with its GPUs and no other node is alive; else fails after
`timeout` with an expected-vs-seen table, instead of vLLM's 1800 s placement-group wait
(vllm/v1/executor/ray_utils.py, PG_WAIT_TIMEOUT). Prints the node table as JSON.
"""
import json
import sys
import time

POLL_S = 0.5
PROGRESS_S = 5


def compare(expected, nodes):
    """Return (ok, rows): rows are (name, ip, gpus expected, what Ray shows)."""
    alive = {}
    for n in nodes:
        if n.get("Alive"):
            alive.setdefault(n["NodeManagerAddress"], []).append(n)
    ok, rows = True, []
    for e in expected:
        seen = alive.pop(e["ip"], [])
        if not seen:
            ok, status = False, "MISSING (no alive Ray node with this address)"
        elif len(seen) > 1:
            ok, status = False, f"{len(seen)} alive Ray nodes with this address"
        else:
            gpus = seen[0].get("Resources", {}).get("GPU", 0)
            status = f"alive, {gpus:g} GPU"
            if gpus != e["gpus"]:
                ok, status = False, status + f" (expected {e['gpus']})"
        rows.append((e["name"], e["ip"], str(e["gpus"]), status))
    for ip, extra in sorted(alive.items()):
        ok = False
        gpus = extra[0].get("Resources", {}).get("GPU", 0)
        rows.append(("(not in spec)", ip, "-",
                     f"alive, {gpus:g} GPU: registered under an address the spec does not use"))
    return ok, rows


def version_problem(preflight):
    seen = {}
    for raw in preflight:
        p = json.loads(raw)
        seen.setdefault((p.get("ray"), p.get("python"), p.get("vllm")), []).append(p.get("node"))
    if len(seen) <= 1:
        return None
    parts = [f"{'/'.join(nodes)}: ray {r}, python {py}, vllm {v}"
             for (r, py, v), nodes in seen.items()]
    return "Ray/Python/vLLM differ between nodes (ray#50511): " + "; ".join(parts)


def table(rows):
    head = ("NODE", "EXPECTED IP", "GPUS", "RAY SEES")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
                     for r in (head, *rows))


def node_table_reader(address):
    """A function returning Ray's node table (what `ray.nodes()` returns).

    Read from the GCS alone (a GCS client, no driver, like `ray status`): `ray.init` would
    register a job, and the head's raylet answers the first job by prestarting Python workers,
    CPU spent while vLLM loads (measured: gate -0.45 s, vLLM +0.35 s on 2 lab nodes, net
    -0.65 s on 4). Ray's private API may move between releases, so any
    error there falls back to a driver (`ray.init`), which is public and slower.
    """
    import ray  # imported late: the pure helpers above are unit-tested without Ray

    try:
        from ray._private import state
        from ray._raylet import GcsClientOptions

        gcs = state.GlobalState()
        gcs._initialize_global_state(GcsClientOptions.create(
            address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))
        gcs.node_table()
        return gcs.node_table
    except Exception as err:  # noqa: BLE001 - any failure of the private path: use the public one
        print(f"[spark-vllm] gate: reading the GCS directly failed ({err!r}); using ray.init",
              file=sys.stderr)
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return ray.nodes


def main():
    payload = json.loads(sys.argv[1])
    expected, timeout = payload["expected"], payload["timeout"]
    mismatch = version_problem(payload.get("preflight", []))
    if mismatch:
        print(f"[spark-vllm] gate: FAILED: {mismatch}", file=sys.stderr)
        sys.exit(1)
    nodes = node_table_reader(payload["address"])
    start = last = time.monotonic()
    while True:
        ok, rows = compare(expected, nodes())
        now = time.monotonic()
        if ok:
            break
        if now - start >= timeout:
            print(f"[spark-vllm] gate: FAILED: Ray's node table does not match the spec after "
                  f"{timeout} s:\n{table(rows)}", file=sys.stderr)
            sys.exit(1)
        if now - last >= PROGRESS_S:
            last = now
            waiting = [r[0] for r in rows if not r[3].startswith("alive")]
            print(f"[spark-vllm] gate: waiting for {', '.join(waiting) or 'table'} "
                  f"({now - start:.0f} s of {timeout} s)", file=sys.stderr)
        time.sleep(POLL_S)
    print(f"[spark-vllm] gate: Ray's node table matches the spec "
          f"({time.monotonic() - start:.1f} s):\n{table(rows)}", file=sys.stderr)
    print(json.dumps([{"name": r[0], "ip": r[1], "gpus": int(r[2])} for r in rows]))


if __name__ == "__main__":
    main()
