"""vllm-sim (legacy mode, vLLM 0.17.1) against a real one-node Ray cluster (head 127.0.0.2, one GPU).

The incident (README, "The afternoon it prevents"): VLLM_HOST_IP names an address Ray registered no
node under, so the placement group's `node:<ip>` pin can never be met and vLLM waits, then
fails. Wait bounds are shortened with VLLM_SIM_PG_WAIT_TIMEOUT.
"""

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import ray  # noqa: F401  (installed by make test)
import requests
import vllm_sim  # noqa: F401  (installed by make test)
from vsim_harness import LEGACY, RayCluster, Serve, rank_lines, start_cluster, start_serve  # noqa: E402

pytestmark = pytest.mark.slow

HEAD_IP = "127.0.0.2"
API_KEY = "lab-key-7f3a9c"  # a value the logs must never contain
SERVED = "qwen-sim"
PG_WAIT_S = 12
WAITING_LINE = (
    "Waiting for creating a placement group of specs for 10 seconds. specs=[{{'GPU': 1.0, "
    "'node:{ip}': 0.001}}{rest}]. Check `ray status` and `ray list nodes` to see if you have "
    "enough resources, and make sure the IP addresses used by ray cluster are the same as "
    "VLLM_HOST_IP environment variable specified in each node if you are running on a multi-node."
)


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(head_vllm_host_ip=HEAD_IP)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-logs")


@pytest.fixture(scope="class")
def server(cluster: RayCluster, logs: Path):
    s = start_serve(
        cluster,
        "Qwen/Qwen3.5-122B-A10B-FP8",
        [
            "--tensor-parallel-size",
            "1",
            "--distributed-executor-backend",
            "ray",
            "--served-model-name",
            SERVED,
            "--max-model-len",
            "32768",
            "--gpu-memory-utilization",
            "0.9",
            "--enforce-eager",
        ],
        # spark-vllm passes the key only through the environment.
        {**LEGACY, "VLLM_HOST_IP": HEAD_IP, "VLLM_API_KEY": API_KEY},
        logs,
    )
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


class TestServesWhenIdentitiesAgree:
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def test_health_is_open_and_ok(self, server: Serve):
        assert requests.get(f"{server.url}/health", timeout=10).status_code == 200

    def test_models_lists_the_served_name(self, server: Serve):
        r = requests.get(f"{server.url}/v1/models", headers=self.auth(), timeout=10)
        assert r.status_code == 200
        (card,) = r.json()["data"]
        assert card["id"] == SERVED
        assert card["max_model_len"] == 32768

    def test_api_key_from_env_is_enforced_on_v1(self, server: Serve):
        assert requests.get(f"{server.url}/v1/models", timeout=10).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        r = requests.get(f"{server.url}/v1/models", headers=wrong, timeout=10)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
        r = requests.post(
            f"{server.url}/v1/chat/completions",
            json={"model": SERVED, "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert r.status_code == 401
        assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 200

    def test_chat_completion_names_the_rank_nodes(self, server: Serve):
        r = requests.post(
            f"{server.url}/v1/chat/completions",
            headers=self.auth(),
            json={
                "model": SERVED,
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "ping from the lab"},
                ],
            },
            timeout=10,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        text = body["choices"][0]["message"]["content"]
        assert text.startswith("vllm-sim (simulator, no inference): TP=1 PP=1 ranks on 127.0.0.2")
        assert text.endswith("you said: ping from the lab")
        assert body["model"] == SERVED
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0

    def test_streamed_chat_is_sse_ending_in_done(self, server: Serve):
        r = requests.post(
            f"{server.url}/v1/chat/completions",
            headers=self.auth(),
            json={
                "model": SERVED,
                "stream": True,
                "messages": [{"role": "user", "content": "stream it"}],
            },
            timeout=10,
        )
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        # one chunk per token, as vLLM streams: the text is the deltas' together
        deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in events[:-1]]
        assert len(deltas) > 2
        assert "you said: stream it" in "".join(d.get("content") or "" for d in deltas)

    def test_unknown_model_is_404_like_vllm(self, server: Serve):
        r = requests.post(
            f"{server.url}/v1/chat/completions",
            headers=self.auth(),
            json={"model": "other", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert r.status_code == 404
        assert r.json()["error"]["message"] == "The model `other` does not exist."

    def test_metrics_are_prometheus_text(self, server: Serve):
        r = requests.get(f"{server.url}/metrics", timeout=10)
        assert r.headers["content-type"].startswith("text/plain")
        assert f'vllm:num_requests_running{{engine="0",model_name="{SERVED}"}} 0.0' in r.text
        assert "vllm:request_success_total" in r.text

    def test_log_shows_banner_rank_and_extra_flags_but_not_the_key(self, server: Serve):
        out = server.output()
        assert "vllm-sim: a SIMULATOR of vLLM's multi-node Ray orchestration" in out
        assert [(r, ip) for r, ip, _ in rank_lines(out)] == [(0, HEAD_IP)]
        assert "['--gpu-memory-utilization', '0.9', '--enforce-eager']" in out
        assert "Loading weights (simulated)..." in out
        assert API_KEY not in out

    def test_second_engine_on_the_busy_node_finds_no_gpu(self, cluster, logs, server):
        # The running server holds the node's only GPU: vLLM refuses at once, it does not wait.
        second = start_serve(
            cluster,
            "m",
            ["--distributed-executor-backend", "ray"],
            {**LEGACY, "VLLM_HOST_IP": HEAD_IP},
            logs,
        )
        try:
            assert second.wait_exit(60) == 1
        finally:
            second.stop()
        out = second.output()
        assert "ValueError: Current node has no GPU available." in out
        assert f"current_ip='{HEAD_IP}'" in out
        assert "Waiting for creating a placement group" not in out


@pytest.fixture(scope="module")
def stuck_runs(cluster: RayCluster, logs: Path) -> dict[str, tuple[int, str, float]]:
    """Both waiting failures, run side by side to halve the wall time."""
    cases = {
        # The incident: VLLM_HOST_IP is an address no Ray node is registered under.
        "unknown_ip": (["-tp", "1"], "127.0.0.9"),
        # Enough identity, not enough GPUs: TP=2 on a one-GPU cluster.
        "tp2_one_gpu": (["-tp", "2"], HEAD_IP),
    }

    def run(flags_ip):
        flags, ip = flags_ip
        started = time.monotonic()
        s = start_serve(
            cluster,
            "m",
            [*flags, "--distributed-executor-backend", "ray"],
            {**LEGACY, "VLLM_HOST_IP": ip, "VLLM_SIM_PG_WAIT_TIMEOUT": str(PG_WAIT_S)},
            logs,
        )
        try:
            rc = s.wait_exit(PG_WAIT_S + 45)
        finally:
            s.stop()
        return rc, s.output(), time.monotonic() - started

    with ThreadPoolExecutor(len(cases)) as pool:
        results = dict(zip(cases, pool.map(run, cases.values()), strict=True))
    return results


def test_unknown_vllm_host_ip_waits_then_fails_like_vllm(stuck_runs):
    rc, out, took = stuck_runs["unknown_ip"]
    assert rc == 1
    assert WAITING_LINE.format(ip="127.0.0.9", rest="") in out
    assert (
        "ValueError: Cannot provide a placement group of placement_group_specs=[{'GPU': 1.0, "
        "'node:127.0.0.9': 0.001}] within 12 seconds. See `ray status` and `ray list nodes` to "
        "make sure the cluster has enough resources."
    ) in out
    assert took >= PG_WAIT_S
    assert "Route: /health" not in out


def test_tp2_on_a_one_gpu_cluster_waits_then_fails(stuck_runs):
    rc, out, took = stuck_runs["tp2_one_gpu"]
    assert rc == 1
    assert WAITING_LINE.format(ip=HEAD_IP, rest=", {'GPU': 1.0}") in out
    assert "Cannot provide a placement group requiring 2.0 GPUs" in out
    assert "Total GPU requirement (world_size=2) exceeds locally visible GPUs (1)" in out
    assert took >= PG_WAIT_S


def test_health_turns_503_when_a_rank_dies(cluster: RayCluster, logs: Path, stuck_runs):
    # Uses the GPU after the other cases are done with it (stuck_runs has finished).
    s = start_serve(
        cluster, "m", ["--distributed-executor-backend", "ray"], {**LEGACY, "VLLM_HOST_IP": HEAD_IP}, logs
    )
    try:
        s.wait_ready()
        chat: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert requests.post(f"{s.url}/v1/chat/completions", json=chat, timeout=10).ok
        ((_, _, pid),) = rank_lines(s.output())
        os.kill(pid, signal.SIGKILL)  # the rank actor this server started: a lost node
        deadline = time.monotonic() + 30
        status = 200
        while time.monotonic() < deadline and status == 200:
            time.sleep(0.5)
            status = requests.get(f"{s.url}/health", timeout=15).status_code
        assert status == 503
        r = requests.post(f"{s.url}/v1/chat/completions", json=chat, timeout=15)
        assert r.status_code == 500
    finally:
        s.stop()
    assert "EngineCore encountered a fatal error (simulated)" in s.output()
