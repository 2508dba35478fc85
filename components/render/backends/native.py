"""The native backend: vLLM's own multi-node, no Ray. One `vllm serve` container per node:
rank 0 with the API server on nodes[0], `--headless` ranks on every other node, finding each
other through torch.distributed's rendezvous that rank 0 hosts on masterPort.

What vLLM requires (read at 0.26.0 and 0.33.0; docs serving/parallelism_scaling.md):
`--nnodes N --node-rank R --master-addr <rank 0's IP> --master-port P` on every node,
`--headless` on ranks > 0, the `mp` executor (engine/arg_utils.py refuses nnodes > 1 with
ray), and world_size divisible by nnodes, each node running world_size / nnodes ranks. With
nnodes > 1 every rank initialises torch.distributed at tcp://master-addr:master-port
(distributed/parallel_state.py `init_distributed_environment`): global rank 0 listens there,
every other rank connects to it and keeps the connection for the group's life.

Builders only (no Pulumi): the component is native_group.py. The order is the Ray backend's:
the headless ranks first (each checks it can reach rank 0's node over the fabric before it
starts), then rank 0, which waits for every node's ranks, bounded by joinTimeout and with an
expected-vs-seen report, before it waits for vLLM to serve.
"""

from __future__ import annotations

import ipaddress
import shlex

from ...spec import TORCH_PG_TIMEOUT_S, ClusterSpec, NodeSpec
from ..api_key_commands import api_key_args
from ..commands import (
    _VLLM_ENTRY_SH,
    LEADER,
    LISTENING_SH,
    RANK,
    VLLM_FILES_DIR,
    _wait_loop,
    container_name,
    docker_run_argv,
    serve_ready_lines,
    start_script,
    vllm_serve_args,
)
from ..start_clocks import ENGINE_READY_ENV, start_bound_lines

NAME = "native"
# where the leader's container finds the API-key middleware (docker cp before it starts; the
# image's own /tmp exists, /tmp/ray is the Ray backend's)
NATIVE_CONFIG_ROOT = "/tmp/spark-vllm"
# how long a headless rank's node tries to open a TCP connection to rank 0's node before the
# fabric counts as broken: a refusal (nothing listens yet) answers at once on a working link
REACH_TIMEOUT_S = 5
# vLLM logs its non-default args (`'headless': True`) once the command line parsed, and then
# "Launching vLLM ... headless multiproc executor" (entrypoints/cli/serve.py run_headless)
HEADLESS_MARK = "headless"
# torch.distributed's default timeout for an NCCL process group, which vLLM uses when it is
# given none (torch/distributed/constants.py default_pg_nccl_timeout, 10 min; vLLM 0.26.0
# config/parallel.py distributed_timeout_seconds: "If None, PyTorch's default timeout is used
# (600s for NCCL)"). It bounds the rendezvous every rank waits in: a headless rank whose rank 0
# is not there within it gives up, whatever joinTimeout says. vLLM 0.26.0 passes
# --distributed-timeout-seconds to torch.distributed.init_process_group (v1/worker/
# gpu_worker.py init_worker_distributed_environment): with a joinTimeout above torch's
# default, every rank gets it, so the rendezvous waits as long as the program does. It also
# bounds the group's collectives (NCCL's watchdog), so it is never set below torch's default.
DIST_TIMEOUT_FLAG = "--distributed-timeout-seconds"
# How often rank 0's start checks, while it loads, that every other node still holds its
# connection to the rendezvous (in rounds of the vLLM wait: VLLM_CHECK_EVERY x 0.1 s)
ALIVE_CHECK_EVERY = 5


def roles(index: int) -> tuple[str, ...]:
    """Rank 0 with the API server on nodes[0]; a headless rank on every other node."""
    return (LEADER,) if index == 0 else (RANK,)


def executor(spec: ClusterSpec, rank: int) -> list[str]:
    """vLLM's flags for this backend on the node of `rank`."""
    flags = ["--distributed-executor-backend", "mp"]
    if len(spec.nodes) > 1:
        flags += ["--nnodes", str(len(spec.nodes)), "--node-rank", str(rank),
                  "--master-addr", spec.head.identity_ip, "--master-port", str(spec.master_port)]
        if rank > 0:
            flags.append("--headless")
        if spec.join_timeout > TORCH_PG_TIMEOUT_S:
            flags += [DIST_TIMEOUT_FLAG, str(spec.join_timeout)]
    return flags


def _argv(spec: ClusterSpec, node: NodeSpec, role: str, rank: int) -> list[str]:
    # the same engine arguments on every node (model, layout, vllmArgs): vLLM builds its config
    # on each; only rank 0 serves the API (headless ranks never read the API flags)
    argv = docker_run_argv(spec, node, role, "sh",
                           ["-c", _VLLM_ENTRY_SH, "vllm",
                            *vllm_serve_args(spec, executor(spec, rank))],
                           extra=["--env", f"VLLM_CONFIG_ROOT={NATIVE_CONFIG_ROOT}",
                                  *(["--env", ENGINE_READY_ENV, *api_key_args(spec)]
                                    if role == LEADER else [])])
    if role == LEADER:
        # created, given the middleware, then started: it is on PYTHONPATH before vLLM starts
        assert argv[:3] == ["docker", "run", "--detach"]
        argv[1:3] = ["create"]
    return argv


def leader_run_argv(spec: ClusterSpec) -> list[str]:
    return _argv(spec, spec.head, LEADER, 0)


def rank_run_argv(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    return _argv(spec, node, RANK, spec.nodes.index(node))


def _reach_lines(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    """A headless node checks, before its container starts, that rank 0's node answers on
    masterPort over the fabric: refused (nothing listens yet) or accepted is a working path;
    no answer, no route or unreachable is named here in seconds, not after torch's timeout."""
    master = f"{spec.head.identity_ip}:{spec.master_port}"
    lines = [
        f"master={shlex.quote(spec.head.identity_ip)}; mport={spec.master_port}",
    ]
    if node.fabric_interface:
        lines += [
            'route=$(ip route get "$master" 2>/dev/null || true)',
            'via=$(echo $route | awk \'{for (i = 1; i < NF; i++) if ($i == "dev") '
            '{ print $(i + 1); exit }}\')',
            'src=$(echo $route | awk \'{for (i = 1; i < NF; i++) if ($i == "src") '
            '{ print $(i + 1); exit }}\')',
            f'[ "$via" = {shlex.quote(node.fabric_interface)} ] || fail "{node.name} reaches '
            f'rank 0 ({spec.head.name}, {master}) over ${{via:-no route}}, not its '
            f'fabricInterface {node.fabric_interface}: the rendezvous and NCCL would cross '
            'another link (check the routes)"',
            # rank 0 counts a node joined by the address its connection comes from
            f'[ "$src" = {shlex.quote(node.identity_ip)} ] || fail "{node.name} reaches rank 0 '
            f'({master}) from ${{src:-no address}}, not its fabricIp {node.identity_ip}: make '
            f'{node.identity_ip} the primary address of {node.fabric_interface}"',
        ]
    lines += [
        f"if out=$(timeout {REACH_TIMEOUT_S} bash -c 'exec 3<>\"/dev/tcp/$0/$1\"' \"$master\" "
        '"$mport" 2>&1); then :; else',
        '  rc=$?',
        '  case "$out" in',
        '    *refused*) ;;',  # the host answered: nothing listens there yet
        f'    *) [ "$rc" -eq 124 ] && out="no answer within {REACH_TIMEOUT_S} s"',
        f'       fail "cannot reach rank 0 ({spec.head.name}) at {master} from '
        f'{node.identity_ip}: ${{out##*: }}: check the fabric link, routes and firewall between '
        'the two" ;;',
        '  esac',
        'fi',
    ]
    return lines


def rank_start_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """A headless rank's container; ready once vLLM parsed its command line as headless."""
    rank = spec.nodes.index(node)
    return start_script(
        spec, node, RANK, rank_run_argv(spec, node), cache=True,
        before_run=_reach_lines(spec, node),
        ready=_wait_loop(f"has {HEADLESS_MARK}", spec.join_timeout,
                         f"vLLM rank {rank} to start headless", []))


def _hex4(ip: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex of the 32-bit value)."""
    return f"{int.from_bytes(ipaddress.IPv4Address(ip).packed, 'little'):08X}"


def join_lines(spec: ClusterSpec) -> list[str]:
    """Rank 0 waits until every other node holds a connection to its rendezvous on masterPort
    (read from the node's socket table: --network host), bounded by joinTimeout; a node that
    never joins is named with what was seen."""
    port = f"{spec.master_port:04X}"
    checks = []
    for n in spec.workers:
        ip = ipaddress.ip_address(n.identity_ip)
        if ip.version == 4:
            v4, v6 = _hex4(n.identity_ip), "0000000000000000FFFF0000" + _hex4(n.identity_ip)
        else:  # /proc/net/tcp6: four little-endian 32-bit words
            p = ip.packed
            v4, v6 = "-", "".join(f"{int.from_bytes(p[i:i + 4], 'little'):08X}"
                                  for i in range(0, 16, 4))
        checks.append(f"{n.name}|{n.identity_ip}|{v4}|{v6}")
    master = f"{spec.head.identity_ip}:{spec.master_port}"
    timeout = spec.join_timeout
    return [
        # ESTABLISHED (01) connections whose local port is masterPort, by the peer's address
        f"peers=\"{' '.join(checks)}\"",
        "joined() {",
        f"  est=$(awk -v p=:{port} '$4 == \"01\" && substr($2, length($2) - 4) == p "
        "{ print $3 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)",
        '  seen=; missing=',
        "  for peer in $peers; do",
        "    IFS='|' read -r pname pip h4 h6 <<EOF",
        "$peer",
        "EOF",
        '    case " $(echo $est) " in *" $h4:"*|*" $h6:"*) seen="$seen $pname ($pip)" ;; '
        '*) missing="$missing $pname ($pip)" ;; esac',
        "  done",
        '  [ -z "$missing" ]',
        "}",
        *_wait_loop("joined", timeout, f"every node's ranks to join rank 0 at {master}", [
            '[ "$(date +%s)" -lt "$deadline" ] || fail "the ranks did not all join rank 0 at '
            f'{master} within {timeout} s (joinTimeout): expected{_names(spec)}; joined:'
            '${seen:- none}; missing:$missing (their own logs say why: spark-vllm status)"']),
        f'log "every node joined rank 0 at {master}:$seen"',
    ]


def alive_checks(spec: ClusterSpec) -> list[str]:
    """While rank 0 loads: every other node still holds its connection to rank 0's rendezvous
    (the same socket-table read as join_lines' `joined`). A headless rank that dies closes it
    (its kernel sends the FIN), and rank 0 itself would wait in NCCL with no bound: the node
    is named within a second instead of at the end of the start's bound."""
    if not spec.workers:
        return []
    master = f"{spec.head.identity_ip}:{spec.master_port}"
    return [
        f'if [ $((round % {ALIVE_CHECK_EVERY})) -eq 1 ] && ! joined; then fail "the ranks '
        f'on$missing lost their connection to rank 0 at {master} while it was loading; '
        '$(phase); their own logs say why (spark-vllm status)"; fi',
    ]


def _names(spec: ClusterSpec) -> str:
    return "".join(f" {n.name} ({n.identity_ip})" for n in spec.workers)


def leader_start_script(spec: ClusterSpec) -> str:
    """Rank 0 and the API server on nodes[0]; ready once the group formed and vLLM serves."""
    listening = LISTENING_SH.format(port=spec.master_port)
    node = spec.head
    return start_script(
        spec, node, LEADER, leader_run_argv(spec), serves=True, cache=True,
        before_run=[
            # anything else on masterPort would take the ranks' connections, or make rank 0's
            # rendezvous fail to bind minutes into the start: refuse it by name first
            f'if {listening}; then fail "port {spec.master_port} (masterPort) is already in '
            f'use on {node.name} by a process outside this stack"; fi',
        ],
        # after the compile cache was cleared for a new image (cache=True): then it is cold
        before_start=start_bound_lines(spec),
        ready=[
            f"docker cp {VLLM_FILES_DIR}/. \"$name\":{NATIVE_CONFIG_ROOT} >/dev/null "
            f'|| fail "cannot copy vLLM\'s config into {container_name(spec, LEADER)}"',
            'docker start "$name" >/dev/null || fail "docker start $name failed"',
            *(join_lines(spec) if spec.workers else []),
            *serve_ready_lines(spec, alive_checks(spec)),
        ])
