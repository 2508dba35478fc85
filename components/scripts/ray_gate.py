"""Readiness gate, run inside the Ray head container: Ray's own node table against the spec;
and, in `placement` mode, whether a placement group vLLM waits for can be placed at all.

argv[1]: JSON {"expected": [{"name", "ip", "gpus"}], "timeout": s, "address": "ip:port",
"preflight": [json, ...]}. The script itself comes on stdin (`python3 - PAYLOAD`), so a failure
message that quotes the command line stays short. Polls Ray's node table until every expected
node is alive under its identity IP with its GPUs and no other node is alive; else fails after
`timeout` with an expected-vs-seen table, instead of vLLM's 1800 s placement-group wait
(vllm/v1/executor/ray_utils.py, PG_WAIT_TIMEOUT). Prints the node table as JSON.

`python3 ray_gate.py placement PAYLOAD LINE` (the vLLM command, while vLLM logs "Waiting for
creating a placement group ... specs=[...]": vLLM prints it after any 10 s wait and goes on
waiting): reads Ray's state from the GCS (its nodes with their total and available resources,
the placement groups with their state and the jobs that made them, the jobs) and decides
(`placement_verdict`). Exit 3 with the reason when the group can never be placed as things
stand: a `node:` bundle no node has, more GPUs (or a bundle larger) than the cluster's nodes
have, or GPUs held by another live job's placement group. Exit 0 with what Ray says
otherwise: the caller keeps waiting, within its bound.
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


def _gpus(resources):
    return float((resources or {}).get("GPU", 0))


def _fits(bundle, resources):
    return all(float(resources.get(k, 0)) >= float(v) for k, v in bundle.items())


def placement_verdict(specs, state):
    """("cannot", why) or ("wait", what Ray says) for the group of `specs` vLLM waits for.

    `state`: {"nodes": ray.nodes() (NodeID, Alive, NodeManagerAddress, Resources = totals),
    "available": {node id: resources}, "groups": {id: placement_group_table() entry, with
    "creator_job"}, "jobs": [{"JobID", "IsDead", "DriverIPAddress"}]}."""
    nodes = [n for n in state["nodes"] if n.get("Alive")]
    totals = {n["NodeID"]: n.get("Resources") or {} for n in nodes}
    where = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}
    described = ", ".join(f"{where[i]} ({_gpus(totals[i]):g} GPU)" for i in sorted(where))
    for bundle in specs:
        for key in bundle:
            if key.startswith("node:") and not any(key in t for t in totals.values()):
                return "cannot", (
                    f"vLLM pins its placement group to {key} (its VLLM_HOST_IP, {key[5:]}) and "
                    f"Ray has no node with that address: Ray's nodes are {described or 'none'}")
    asked, have = sum(_gpus(b) for b in specs), sum(_gpus(t) for t in totals.values())
    if asked > have:
        return "cannot", (f"vLLM asks Ray for {asked:g} GPUs and Ray's cluster has {have:g}: "
                          f"{described or 'no node'}")
    for bundle in specs:
        if not any(_fits(bundle, t) for t in totals.values()):
            return "cannot", (f"no Ray node has the resources of the bundle {bundle}: "
                              f"Ray's nodes are {described}")
    groups = list(state["groups"].values())
    mine = [g for g in groups if g["state"] == "PENDING"
            and sorted(map(sorted, (b.items() for b in g["bundles"].values())))
            == sorted(map(sorted, (b.items() for b in specs)))]
    if not mine:
        return "wait", "Ray has placed the group (no pending group of these specs)"
    jobs = {j["JobID"]: j for j in state.get("jobs", [])}
    live, ending = [], []
    for g in groups:
        held = sum(_gpus(b) for b in g["bundles"].values())
        if g["state"] in ("CREATED", "PREPARED", "RESCHEDULING") and held:
            job = jobs.get(g.get("creator_job") or "", {})
            (ending if job.get("IsDead") else live).append((g, held, job))
    if have - sum(h for _, h, _ in live) < asked:
        names = "; ".join(
            f"placement group {g.get('name') or '(unnamed)'} ({g['placement_group_id']}, "
            f"{h:g} GPU) of job {g.get('creator_job') or '?'}"
            + (f" (driver {job['DriverIPAddress']})" if job.get("DriverIPAddress") else "")
            for g, h, job in live)
        return "cannot", (f"the {asked:g} GPUs vLLM asks for are held by another job: {names}. "
                          "Another vLLM on this Ray cluster? Stop it, or give this stack "
                          "other nodes")
    free = {i: _gpus(state["available"].get(i)) for i in totals}
    pending = mine[0].get("stats") or {}
    said = [f"GPUs free: {', '.join(f'{where[i]} {free[i]:g}/{_gpus(totals[i]):g}' for i in sorted(where))}",
            f"the group is PENDING ({pending.get('scheduling_state', '?')}, attempt "
            f"{pending.get('scheduling_attempt', '?')})"]
    if ending:
        said.append("GPUs still held by the group of a finished job, which Ray is removing: "
                    + ", ".join(g["placement_group_id"] for g, _, _ in ending))
    elif sum(free.values()) < asked:
        said.append("GPUs in use outside placement groups (tasks or actors) or not yet "
                    "reported free by their raylets")
    return "wait", "; ".join(said)


def parse_specs(line):
    """The bundles of vLLM's line "... specs=[{'GPU': 1.0, 'node:10.0.0.1': 0.001}, ...]"."""
    import ast

    return ast.literal_eval(line.split("specs=", 1)[1].split("]", 1)[0] + "]")


def cluster_state(address):
    """Ray's state for placement_verdict, from the GCS alone (as node_table_reader)."""
    from ray._private import state
    from ray._raylet import GcsClientOptions

    gcs = state.GlobalState()
    gcs._initialize_global_state(GcsClientOptions.create(
        address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))
    groups = gcs.placement_group_table()
    try:  # the job that made each group: in the GCS's record, not in the table's summary
        from ray.core.generated import gcs_pb2

        for raw in gcs._connect_and_get_accessor().get_placement_group_table():
            data = gcs_pb2.PlacementGroupTableData.FromString(raw)
            if data.placement_group_id.hex() in groups:
                groups[data.placement_group_id.hex()]["creator_job"] = data.creator_job_id.hex()
    except Exception:  # noqa: BLE001 - without it every holder counts as live
        pass
    jobs = [{"JobID": j.get("JobID"), "IsDead": bool(j.get("IsDead")),
             "DriverIPAddress": j.get("DriverIPAddress")} for j in gcs.job_table()]
    return {"nodes": gcs.node_table(), "available": gcs.available_resources_per_node(),
            "groups": groups, "jobs": jobs}


CANNOT_RC = 3  # any other failure (a traceback exits 1) means: could not tell


def placement(payload, line):
    """Exit CANNOT_RC with the reason when vLLM's group cannot be placed; else print what Ray
    says (exit 0)."""
    verdict, why = placement_verdict(parse_specs(line), cluster_state(payload["address"]))
    print(why)
    sys.exit(CANNOT_RC if verdict == "cannot" else 0)


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
    if sys.argv[1] == "placement":
        placement(json.loads(sys.argv[2]), sys.argv[3])
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
