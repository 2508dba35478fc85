"""The Ray backend: a `ray start` container per node (the head first), a gate on Ray's own node
table, and `vllm serve` as a Ray driver on the head, in its own container.

Builders only (no Pulumi): the components are ray_cluster.py and vllm_service.py.
"""

from __future__ import annotations

import json
import shlex

from ...spec import ClusterSpec, NodeSpec
from ..api_key_commands import api_key_args
from ..commands import (
    _VLLM_ENTRY_SH,
    HEAD,
    LISTENING_SH,
    TCP_CONNECT_PY,
    VLLM,
    VLLM_CONFIG_ROOT,
    VLLM_FILES_DIR,
    WORKER,
    _wait_loop,
    container_name,
    docker_run_argv,
    prelude,
    script_text,
    serve_ready_lines,
    start_script,
    vllm_serve_args,
)
from ..start_clocks import ENGINE_READY_ENV, execute_model_timeout, start_bound_lines

NAME = "ray"
# vLLM's own flag for this backend (the rest of `vllm serve` is commands.vllm_serve_args)
EXECUTOR = ["--distributed-executor-backend", "ray"]

# The head's readiness test reads /proc only, and workers wait for it: poll it more often.
HEAD_POLL_INTERVAL_S = 0.2

# `ray start` prints this once its raylet is up (and, on workers, joined the GCS).
RAY_STARTED_MARK = "Ray runtime started"

# vLLM's initialize_ray_cluster logs this after any 10 s its placement group is not ready, and
# goes on waiting (PG_WAIT_TIMEOUT, 1800 s). The line alone is no evidence: a group slow to
# place (a raylet whose resources reach the GCS late, a GPU an actor still holds) prints it too.
# So while it is in vLLM's log, every PG_CHECK_EVERY_S the vLLM command asks Ray itself
# (scripts/ray_gate.py `placement`, copied into the head with vLLM's files) and fails only
# when Ray's state shows the group can never be placed (the outage's `node:` pin on an address
# Ray does not have, more GPUs than the cluster, GPUs held by another live job's group).
PG_WAITING_MARK = "Waiting for creating a placement group"
PG_CHECK_EVERY_S = 10
PG_CANNOT_RC = 3  # ray_gate.py placement: the group cannot be placed (other codes: cannot tell)
PG_CHECK_S = 60  # the check's bound: a GCS read, seconds on a busy head
PLACED = "Ray has placed the group"  # ray_gate.placement_verdict's word for it
# A worker's `ray start` logs this 5 s into a GCS connection that has not completed, then keeps
# retrying for minutes. The head is up by then (its command waited for it), so either the path
# from this node to the head's identity IP is broken (the fabric, a route or a firewall) or the
# GCS is slow to answer (a head that just restarted on a busy node): a TCP connect from the node
# to the GCS port tells the two apart, and only a path that fails it twice in a row, probes
# GCS_PROBE_EVERY_S apart, fails the worker (one lost SYN on a loaded node is not a cut fabric).
GCS_UNREACHABLE_MARK = "Failed to connect to GCS at address"
# how often (seconds) the worker's wait re-checks the GCS port while that line is in its log
GCS_PROBE_EVERY_S = 3
# how many failed connects in a row name the path as broken
GCS_PROBE_FAILS = 2
# the connect's bound (seconds): a fabric or a LAN answers a SYN in milliseconds
GCS_CONNECT_S = 2


# Ray's memory monitor kills workers once the node's memory passes memory_usage_threshold
# (0.95), checked every memory_monitor_refresh_ms (250); 0 turns it off (Ray 2.56.1
# src/ray/common/ray_config_def.h; the raylet's own log: "To disable worker killing, set the
# environment variable `RAY_memory_monitor_refresh_ms` to zero"). On a GB10 the GPU's
# allocations are the node's memory: a load that fills it as planned (gpu-memory-utilization)
# is what the monitor takes for a leak, and it kills the vLLM ranks. NVIDIA's two-Spark
# playbook starts both Ray containers with it off (github.com/NVIDIA/dgx-spark-playbooks,
# nvidia/vllm/README.md, "Run on two Sparks", steps 4 and 5: -e RAY_memory_monitor_refresh_ms=0).
MEMORY_MONITOR_ENV = {"RAY_memory_monitor_refresh_ms": "0"}
# Ray's GCS health-checks every raylet: a check every period_ms, each waiting timeout_ms for
# an answer, and the node is dead after failure_threshold failures in a row (Ray 2.56.1
# src/ray/common/ray_config_def.h health_check_period_ms 3000, health_check_timeout_ms 10000,
# health_check_failure_threshold 5, read from the 2.56.1 wheel's ray._raylet.Config;
# src/ray/gcs/gcs_health_check_manager.cc). So a raylet that stops answering, as one on a
# Spark under memory pressure during a load does, is dead after 5 x (10 + 3) = 65 s and Ray
# kills the vLLM actors there, while a raylet that is gone (refused at once) is dead in
# 5 x 3 = 15 s. The program gives each check the time for Ray to wait as long as vLLM's own
# per-step limit before it calls a node dead (timeout = limit / threshold: 60 s, 5 x 63 =
# 315 s >= 300 s), and keeps the period and the threshold: a dead raylet is still found in
# 15 s. An operator's value in env for any of these is honoured (docs/configuration.md).
RAY_HEALTH_CHECK_PERIOD_MS = 3000
RAY_HEALTH_CHECK_FAILURE_THRESHOLD = 5
HEALTH_CHECK_TIMEOUT_ENV = "RAY_health_check_timeout_ms"
HEALTH_CHECK_THRESHOLD_ENV = "RAY_health_check_failure_threshold"
# every Ray setting the program sets, each one an operator may set in env instead
RAY_ENV_KEYS = (*MEMORY_MONITOR_ENV, HEALTH_CHECK_TIMEOUT_ENV)


def ray_env(spec: ClusterSpec) -> dict[str, str]:
    """What the program sets in every Ray container (head and workers), less what the
    operator set in env (which docker_run_argv passes as written)."""
    threshold = int(spec.user_env.get(HEALTH_CHECK_THRESHOLD_ENV)
                    or RAY_HEALTH_CHECK_FAILURE_THRESHOLD)
    timeout_ms = -(-execute_model_timeout(spec) * 1000 // max(threshold, 1))
    env = {**MEMORY_MONITOR_ENV, HEALTH_CHECK_TIMEOUT_ENV: str(timeout_ms)}
    return {k: v for k, v in env.items() if k not in spec.user_env}


def _ray_env_args(spec: ClusterSpec) -> list[str]:
    return [arg for k, v in ray_env(spec).items() for arg in ("--env", f"{k}={v}")]


def roles(index: int) -> tuple[str, ...]:
    """The Ray head and vLLM (the driver) on nodes[0]; a Ray worker on every other node."""
    return (HEAD, VLLM) if index == 0 else (WORKER,)


def ray_head_args(spec: ClusterSpec) -> list[str]:
    node = spec.head
    return ["start", "--head", f"--node-ip-address={node.identity_ip}",
            f"--port={spec.ray_port}", f"--num-gpus={node.gpus}", "--block"]


def ray_worker_args(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    return ["start", f"--address={spec.head.identity_ip}:{spec.ray_port}",
            f"--node-ip-address={node.identity_ip}", f"--num-gpus={node.gpus}", "--block"]


def head_run_argv(spec: ClusterSpec) -> list[str]:
    # /tmp/ray is an anonymous volume so the vLLM container can share the head's Ray session
    # (raylet and object-store sockets); see vllm_run_argv.
    return docker_run_argv(spec, spec.head, HEAD, "ray", ray_head_args(spec),
                           extra=["--volume", "/tmp/ray", *_ray_env_args(spec)])


def worker_run_argv(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    # No restart policy, here or on any container (invariant 7): a worker that restarts alone
    # joins as a new Ray node under a vLLM whose ranks died with the old one, and a Ray head
    # restarted alone does not take its workers back (Ray's GCS fault-tolerance docs); Docker's policies
    # have no ordering between containers, and a loop on the GPU can wedge a Spark (eugr#257).
    # A dead container stays dead and visible: `pulumi up --refresh` replaces it and its
    # dependents in order.
    return docker_run_argv(spec, node, WORKER, "ray", ray_worker_args(spec, node),
                           extra=_ray_env_args(spec))


def vllm_run_argv(spec: ClusterSpec) -> list[str]:
    # vLLM is a Ray *driver* on the head node, in its own container so it can be replaced
    # alone. A Ray 2.60 driver finds its node by looking for local raylet processes (`ps`,
    # services.find_node_ids) and connects through the session's sockets under /tmp/ray: so it
    # shares the head container's PID namespace and /tmp/ray, and the host's IPC and network.
    head = container_name(spec, HEAD)
    extra = ["--pid", f"container:{head}", "--volumes-from", head,
             "--env", f"RAY_ADDRESS={spec.head.identity_ip}:{spec.ray_port}",
             "--env", f"VLLM_CONFIG_ROOT={VLLM_CONFIG_ROOT}",
             # the start's bound, computed on the node (start_bound_lines), taken by name
             "--env", ENGINE_READY_ENV,
             # the API key's directory, read-only: the middleware reads the key there
             *api_key_args(spec)]
    return docker_run_argv(spec, spec.head, VLLM, "sh",
                           ["-c", _VLLM_ENTRY_SH, "vllm", *vllm_serve_args(spec, EXECUTOR)], extra=extra)

def head_start_script(spec: ClusterSpec) -> str:
    """The head's container; ready once its GCS listens on rayPort."""
    listening = LISTENING_SH.format(port=spec.ray_port)
    node = spec.head
    return start_script(
        spec, node, HEAD, head_run_argv(spec), cache=True,
        # Anything else on rayPort (a Redis listens on 6379 by default) would pass the
        # readiness test below while Ray's GCS fails to bind: refuse it by name first.
        before_run=[f'if {listening}; then fail "port {spec.ray_port} (rayPort) is already in '
                    f'use on {node.name} by a process outside this stack"; fi'],
        ready=_wait_loop(listening, spec.ray_timeout,
                         f"the Ray head's GCS to listen on port {spec.ray_port}", [],
                         sleep_s=HEAD_POLL_INTERVAL_S))


def worker_start_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """A worker's container; ready once it joined the head."""
    # A worker waits here, on the node that sees why, for its join: a blocked fabric is
    # reported in ~6 s with the worker's own log, not after the gate's rayTimeout.
    gcs = f"{spec.head.identity_ip}:{spec.ray_port}"
    probe = (f"python3 -c {shlex.quote(TCP_CONNECT_PY)} {spec.head.identity_ip} "
             f"{spec.ray_port} {GCS_CONNECT_S} 2>&1")

    def verdict(before: str, refused: str, tried: str) -> str:
        """The failed connect's `elif`/`else` (its outcome in $why): a refusal names the head's
        Ray as stopped, anything else the path from this node."""
        return (
            'elif case "$why" in refused*) true ;; *) false ;; esac; then '
            f'fail "{before}the Ray head {spec.head.name} at {gcs} refused {refused}: nothing '
            "listens on its GCS port although it did when the head's command returned, so the "
            'head\'s Ray stopped since (its log says why: spark-vllm status)"; '
            f'else fail "cannot reach the Ray head {spec.head.name} at {gcs} from '
            f'{node.identity_ip} ({tried}: $why): check the fabric link, routes and firewall '
            'between the two"; fi')

    unreachable = (
        f"if has {shlex.quote(GCS_UNREACHABLE_MARK)} && "
        f'[ $(( $(date +%s) - ${{gcs_probed:-0}} )) -ge {GCS_PROBE_EVERY_S} ]; then '
        "gcs_probed=$(date +%s); "
        f"if why=$({probe}); then gcs_fails=0; "
        f'[ -n "${{gcs_slow:-}}" ] || log "the Ray head\'s GCS at {gcs} answers but has not '
        'taken this worker yet (a busy or just restarted head): waiting"; gcs_slow=1; '
        "else gcs_fails=$(( ${gcs_fails:-0} + 1 )); "
        f'if [ "$gcs_fails" -lt {GCS_PROBE_FAILS} ]; then '
        f'log "the Ray head\'s GCS at {gcs} did not take a TCP connect from this node ($why): '
        f'trying again in {GCS_PROBE_EVERY_S} s"; '
        # refused: the head's address answers, with nothing on the port: its Ray stopped
        # after its command returned (the fabric is not what failed)
        + verdict("", f"this worker's connection {GCS_PROBE_FAILS} times, {GCS_PROBE_EVERY_S} s "
                  "apart", f"a TCP connect from this node, {GCS_PROBE_FAILS} times "
                  f"{GCS_PROBE_EVERY_S} s apart") + "; fi; fi"
    )
    # `ray start` may also give up on an unreachable head and exit (seen on the lab within 4 s,
    # its log saying no more than the node's IP): one connect then names the path, as above
    exited = f"if why=$({probe}); then :; " + verdict(
        "the worker's Ray exited, and ", "a connection from this node",
        "the worker's Ray exited; a TCP connect from this node")
    return start_script(
        spec, node, WORKER, worker_run_argv(spec, node), cache=True,
        ready=_wait_loop(f"has {shlex.quote(RAY_STARTED_MARK)}", spec.ray_timeout,
                         f"Ray worker to join the head at {gcs}", [unreachable],
                         stopped=[exited]))


def vllm_start_script(spec: ClusterSpec) -> str:
    """vLLM's container on the head; ready once it serves (and answered the smoke request)."""
    head = shlex.quote(container_name(spec, HEAD))
    # the waiting line quotes the group's specs (vLLM < 0.18 pins `node:<VLLM_HOST_IP>` there)
    ask = shlex.join(["timeout", str(PG_CHECK_S), "docker", "exec", container_name(spec, HEAD),
                      "python3", f"{VLLM_CONFIG_ROOT}/ray_gate.py", "placement",
                      json.dumps({"address": f"{spec.head.identity_ip}:{spec.ray_port}"})])
    pg_check = (
        f"if [ -z \"${{pg_placed:-}}\" ] && has {shlex.quote(PG_WAITING_MARK)} && "
        f'[ $(( $(date +%s) - ${{pg_asked:-0}} )) -ge {PG_CHECK_EVERY_S} ]; then '
        "pg_asked=$(date +%s); "
        f"pg_line=$(printf '%s\\n' \"$logs\" | grep -F {shlex.quote(PG_WAITING_MARK)} | tail -n 1); "
        f'if said=$({ask} "$pg_line" 2>&1); then '
        # placed: the line stays in vLLM's log while it loads; asking again would say nothing
        f'case "$said" in "{PLACED}"*) pg_placed=1; log "vLLM\'s Ray placement group is '
        'placed";; *) log "vLLM waits for its Ray placement group; Ray says: $said";; esac; '
        f'else pg_rc=$?; if [ "$pg_rc" -eq {PG_CANNOT_RC} ]; then '
        'fail "vLLM is waiting for a Ray placement group that Ray cannot place: $said"; '
        'else log "vLLM waits for its Ray placement group; asking Ray failed (exit $pg_rc: '
        '$(printf %s "$said" | tail -n 1)): waiting"; fi; fi; fi'
    )
    return start_script(
        spec, spec.head, VLLM, vllm_run_argv(spec), serves=True,
        before_run=[f"docker cp {VLLM_FILES_DIR}/. {head}:{VLLM_CONFIG_ROOT} >/dev/null "
                    f'|| fail "cannot copy vLLM\'s config into the Ray head container"'],
        before_start=start_bound_lines(spec),
        ready=serve_ready_lines(spec, [pg_check]))


def gate_expected(spec: ClusterSpec) -> list[dict[str, object]]:
    return [{"name": n.name, "ip": n.identity_ip, "gpus": n.gpus} for n in spec.nodes]


def gate_script(spec: ClusterSpec, preflight_json: list[str]) -> str:
    """Readiness gate, run on the head: Ray's node table must match the spec (invariant 5).

    `preflight_json` are the preflight summaries (one JSON per node) so the gate can also
    name a Ray/Python version mismatch between nodes. The Python program itself is the
    command's stdin (`gate_program`): a failed command is quoted whole in Pulumi's error, and
    the expected-vs-seen table must not drown under 100 lines of script.
    """
    payload = json.dumps({"expected": gate_expected(spec), "timeout": spec.ray_timeout,
                          "address": f"{spec.head.identity_ip}:{spec.ray_port}",
                          "preflight": preflight_json}, sort_keys=True)
    head = container_name(spec, HEAD)
    q_head = shlex.quote(head)
    return "\n".join([
        *prelude(spec, spec.head, "gate"),
        # The head's command returned once its GCS listened: if the head died since, its own
        # log says why better than a docker exec error would.
        f'[ "$(docker inspect --format "{{{{.State.Status}}}}" {q_head} 2>/dev/null)" = running ] '
        f'|| {{ log "FAILED: the Ray head container {head} is not running"; docker logs --tail 60 '
        f'{q_head} 2>&1 | sed "s/^/    | /" >&2; exit 1; }}',
        # `timeout` bounds even a hung GCS connection: a remote command is not killed by
        # Pulumi's custom timeouts (pulumi-command runs it to its end).
        f"timeout {spec.ray_timeout + 30} docker exec -i {q_head} python3 - "
        f"{shlex.quote(payload)}",
    ]) + "\n"


def gate_program() -> str:
    """The gate's Python (scripts/ray_gate.py), sent as the gate command's stdin."""
    return script_text("ray_gate.py")
