"""Backend native (vLLM's own multi-node, no Ray): its argv, its graph, its fail-fast shell."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_vllm.components.render import commands as c
from spark_vllm.components.render.backends import native
from spark_vllm.components.spec import SpecError
from tests.unit.harness import lab_nodes, run, spec_from


def nspec(n: int = 2, **top: object) -> c.ClusterSpec:
    return spec_from(lab_nodes(n), stack="nat", **{"backend": "native", **top})


def serve_args(argv: list[str]) -> list[str]:
    return argv[argv.index("serve") + 1:]


def test_every_node_runs_vllm_serve_with_its_rank_and_rank_0s_address() -> None:
    spec = nspec(2)
    leader, rank = native.leader_run_argv(spec), native.rank_run_argv(spec, spec.nodes[1])
    assert leader[:3] == ["docker", "create", "--name"]  # given the middleware, then started
    assert rank[:3] == ["docker", "run", "--detach"]
    common = ["org/model", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
              "--distributed-executor-backend", "mp", "--nnodes", "2"]
    assert serve_args(leader)[:len(common)] == common
    assert serve_args(rank)[:len(common)] == common
    head_ip = spec.head.identity_ip
    assert serve_args(leader)[len(common):len(common) + 6] == [
        "--node-rank", "0", "--master-addr", head_ip, "--master-port", "29501"]
    assert serve_args(rank)[len(common):len(common) + 7] == [
        "--node-rank", "1", "--master-addr", head_ip, "--master-port", "29501", "--headless"]
    assert "--headless" not in leader
    # each node's own identity and fabric, no Ray session path, no Ray address
    env = [leader[i + 1] for i, a in enumerate(leader) if a == "--env"]
    assert f"VLLM_HOST_IP={head_ip}" in env and "NCCL_SOCKET_IFNAME=enp1s0f1np1" in env
    renv = [rank[i + 1] for i, a in enumerate(rank) if a == "--env"]
    assert f"VLLM_HOST_IP={spec.nodes[1].identity_ip}" in renv
    assert "NCCL_SOCKET_IFNAME=enp2s0f1np1" in renv
    assert not [e for e in env + renv if e.startswith(("VLLM_RPC_BASE_PATH", "RAY_ADDRESS"))]


def test_one_node_is_plain_mp_without_multi_node_flags() -> None:
    spec = nspec(1)
    args = serve_args(native.leader_run_argv(spec))
    assert "--nnodes" not in args and "--headless" not in args
    assert args[args.index("--distributed-executor-backend") + 1] == "mp"


@pytest.mark.parametrize(("arg", "owner"), [
    ("--nnodes=2", "backend and nodes"), ("--node_rank", "backend and nodes"),
    ("--master-port", "masterPort"), ("--headless", "backend (every node but nodes[0])"),
    ("-dp", "(one engine"), ("--data-parallel-size-local", "(one engine)"),
    ("--distributed-executor-backend", "backend"),
])
def test_program_owned_native_flags_are_refused_in_vllm_args(arg: str, owner: str) -> None:
    with pytest.raises(SpecError) as err:
        nspec(2, vllmArgs=[arg, "1"])
    assert "vllmArgs[0]" in str(err.value) and owner in str(err.value)


def test_native_needs_the_same_gpus_on_every_node_and_its_own_master_port() -> None:
    nodes = lab_nodes(2)
    nodes[1]["gpus"] = 2
    with pytest.raises(SpecError) as err:
        spec_from(nodes, backend="native", tensorParallelSize=3)
    assert "world_size / nnodes ranks on every node" in str(err.value)
    with pytest.raises(SpecError) as err:
        nspec(2, port=29501)
    assert "port: 29501 is also masterPort" in str(err.value)
    with pytest.raises(SpecError):
        nspec(2, backend="kubernetes")


def test_the_graph_starts_headless_ranks_then_rank_0_which_depends_on_every_one() -> None:
    g = run(nspec(3, tensorParallelSize=3))
    assert not [n for n in g if n.startswith("ray-")]
    assert g["vllm"].type == "spark-vllm:native:NativeGroup"
    leader = g["vllm-leader"]
    for node in ("node-2", "node-3"):
        rank = g[f"vllm-rank-{node}"]
        assert rank.urn in leader.dependencies
        assert leader.plain("triggers")[1][f"rank@{node}"] == f"vllm-rank-{node}-id"
        facts = rank.plain("triggers")[0]
        # a vLLM change restarts every rank: each runs the engine's arguments
        assert facts["backend"] == "native" and facts["vllmArgs"] == []
        assert facts["rank"] == int(node[-1]) - 1 and facts["master"].endswith(":29501")
        assert g["memory-check"].urn in rank.dependencies  # memory admission first
    assert leader.delete_before_replace and set(leader.replace_on_changes) == {"triggers", "triggers[*]"}
    # the group goes as one: a rank whose rank 0 died never joins a new one (torch's TCPStore)
    links = leader.plain("triggers")[1]
    assert {"liveness@vllm-rank-node-2", "liveness@vllm-rank-node-3"} <= set(links)
    for node in ("node-2", "node-3"):
        rlinks = g[f"vllm-rank-{node}"].plain("triggers")[1]
        assert {"liveness@vllm-leader", "rank0"} <= set(rlinks)
        # what makes rank 0, never its script's text, the hfToken nor the apiKey (its own
        # file on rank 0's node: a rotation restarts no member)
        assert not {"rank0Script", "rank0Stdin", "rank0ApiKey"} & set(rlinks)
        assert "spark-vllm-key" not in json.dumps(rank.plain("triggers")[0]["argv"])
        other = "node-3" if node == "node-2" else "node-2"
        assert f"liveness@vllm-rank-{other}" in rlinks
    key = g["vllm-api-key"]
    assert key.urn in leader.dependencies and "apiKey" not in json.dumps(links)
    assert key.plain("triggers")[0]["node"] == "node-1"
    assert "SPARK_VLLM_API_KEY_FILE=/spark-vllm-key/key" in leader.plain("triggers")[0]["argv"]


def _joined_fn(spec: c.ClusterSpec, tcp: Path, tcp6: Path) -> str:
    lines = native.join_lines(spec)
    start = next(i for i, line in enumerate(lines) if line.startswith("peers="))
    end = lines.index("}", start)
    return "\n".join(lines[start:end + 1]).replace("/proc/net/tcp /proc/net/tcp6",
                                                   f"{tcp} {tcp6}")


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"


def test_rank_0_counts_a_node_joined_by_its_connection_to_the_master_port(
        tmp_path: Path) -> None:
    spec = nspec(3, tensorParallelSize=3)
    n2, n3 = (native._hex4(n.identity_ip) for n in spec.workers)
    port = f"{spec.master_port:04X}"
    tcp, tcp6 = tmp_path / "tcp", tmp_path / "tcp6"

    def joined(v4: list[str], v6: list[str]) -> tuple[int, str]:
        tcp.write_text(HEADER + "".join(v4))
        tcp6.write_text(HEADER + "".join(v6))
        script = _joined_fn(spec, tcp, tcp6) + '\njoined; rc=$?; echo "$rc|$seen|$missing"\n'
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                             check=True).stdout.strip()
        rc, seen, missing = out.split("|")
        return int(rc), f"seen:{seen} missing:{missing}"

    head = native._hex4(spec.head.identity_ip)
    listen = f"   0: 00000000:{port} 00000000:0000 0A 0 0 0 0 0 0\n"
    est2 = f"   1: {head}:{port} {n2}:9A3C 01 0 0 0 0 0 0\n"
    # node-3's rank dials the master over IPv6-mapped IPv4 (a dual-stack TCPStore)
    est3_v6 = (f"   0: 0000000000000000FFFF0000{head}:{port} "
               f"0000000000000000FFFF0000{n3}:B00B 01 0 0 0 0 0 0\n")
    # a connection from node-3 to another port, and one from node-3 still in SYN_RECV (03)
    other = f"   2: {head}:1F90 {n3}:9A3D 01 0 0 0 0 0 0\n"
    syn = f"   3: {head}:{port} {n3}:9A3E 03 0 0 0 0 0 0\n"
    assert joined([listen, other, syn], []) == (
        1, "seen: missing: node-2 (192.168.231.12) node-3 (192.168.231.13)")
    assert joined([listen, est2], []) == (1, "seen: node-2 (192.168.231.12) missing: "
                                             "node-3 (192.168.231.13)")
    assert joined([listen, est2], [est3_v6]) == (
        0, "seen: node-2 (192.168.231.12) node-3 (192.168.231.13) missing:")


def _reach(master: str, port: int,
           shell: str = "sh") -> tuple[subprocess.CompletedProcess[str], float]:
    """The headless node's reach check, rendered for a master on loopback: its route check is
    satisfied (over lo, from 127.0.0.1), so what runs is the TCP connect to `port`."""
    nodes = lab_nodes(2)
    nodes[0]["fabricIp"] = master
    nodes[1].update(fabricIp="127.0.0.1", fabricInterface="lo")  # lo's source address
    spec = spec_from(nodes, backend="native", masterPort=port)
    script = "\n".join(["fail() { echo \"FAILED: $*\"; exit 1; }",
                        *native._reach_lines(spec, spec.nodes[1]), "echo reached"])
    t0 = time.monotonic()
    # a check without its own bound would hang for the kernel's SYN retries (about 2 min)
    proc = subprocess.run([shell, "-c", script], capture_output=True, text=True,
                          timeout=native.REACH_TIMEOUT_S + 10)
    return proc, time.monotonic() - t0


@contextlib.contextmanager
def _unanswered_port(host: str) -> Iterator[int]:
    """A port whose SYNs get no answer, as on a blackholed link, with no root: a listener that
    never accepts, its accept queue filled (Linux drops a SYN to a listener whose queue is
    full). Filled until a connect gets no answer within 0.5 s: then the next one gets none."""
    with socket.socket() as srv, contextlib.ExitStack() as fillers:
        srv.bind((host, 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        for _ in range(16):
            conn = fillers.enter_context(socket.socket())
            conn.settimeout(0.5)
            try:
                conn.connect((host, port))
            except TimeoutError:
                break
        else:
            pytest.fail(f"{host}:{port} kept accepting: its SYNs cannot be made unanswered")
        yield port


def test_a_headless_node_reaches_rank_0_when_it_refuses_or_accepts() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        free = s.getsockname()[1]  # closed again: nothing listens there
    proc, _ = _reach("127.0.0.2", free)
    assert proc.stdout.strip() == "reached", proc.stdout + proc.stderr
    with socket.socket() as srv:
        srv.bind(("127.0.0.2", 0))
        srv.listen()
        proc, _ = _reach("127.0.0.2", srv.getsockname()[1])
    assert proc.stdout.strip() == "reached", proc.stdout + proc.stderr


def test_a_headless_node_whose_route_leaves_from_another_address_is_named() -> None:
    nodes = lab_nodes(2)
    nodes[0]["fabricIp"] = "127.0.0.3"
    nodes[1].update(fabricIp="127.0.0.2", fabricInterface="lo")  # lo answers from 127.0.0.1
    spec = spec_from(nodes, backend="native")
    script = "\n".join(["fail() { echo \"FAILED: $*\"; exit 1; }",
                        *native._reach_lines(spec, spec.nodes[1]), "echo reached"])
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert ("FAILED: node-2 reaches rank 0 (127.0.0.3:29501) from 127.0.0.1, not its fabricIp "
            "127.0.0.2") in proc.stdout, proc.stdout + proc.stderr


def test_a_headless_node_whose_route_to_rank_0_is_another_link_is_named() -> None:
    # TEST-NET-1 (RFC 5737): not over lo, so the route check names the wrong link, before any
    # connection is tried (the no-answer branch: the next test)
    proc, took = _reach("192.0.2.1", 29501)
    assert proc.returncode == 1 and took < native.REACH_TIMEOUT_S
    assert "FAILED: node-2 reaches rank 0 (node-1, 192.0.2.1:29501) over" in proc.stdout
    assert "not its fabricInterface lo" in proc.stdout


@pytest.mark.parametrize("shell", ["sh", "bash"])  # the tests' dash, and a node's login shell
def test_a_headless_node_whose_connect_gets_no_answer_is_named_after_the_bound(
        shell: str) -> None:
    """The route check passes and rank 0's node never answers the SYN: named after
    REACH_TIMEOUT_S, not after torch's rendezvous timeout (minutes)."""
    with _unanswered_port("127.0.0.2") as port:
        proc, took = _reach("127.0.0.2", port, shell)
    assert (proc.returncode, proc.stdout.strip()) == (1, (
        f"FAILED: cannot reach rank 0 (node-1) at 127.0.0.2:{port} from 127.0.0.1: no answer "
        f"within {native.REACH_TIMEOUT_S} s: check the fabric link, routes and firewall "
        "between the two")), proc.stderr
    # it waited for the bound, and no longer: a larger or missing bound fails here
    assert native.REACH_TIMEOUT_S <= took < native.REACH_TIMEOUT_S + 3, took
