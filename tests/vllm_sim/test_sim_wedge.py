"""A wedged engine and a busy one, in vllm-sim with real Ray (V2 mode, TP 2 over two nodes).

Wedged, as real vLLM 0.26.0 was with one tensor-parallel rank frozen (SIGSTOP;
tests/fixtures/real-vllm/vllm-0.26.0.json, scenarios frozen_idle, frozen_inflight): /health
stays 200, a streamed request gets no first chunk, `vllm:generation_tokens_total` stands still
and the gauges keep the value the last finished step published (0 idle, N with N in flight);
SIGCONT and everything is answered. The rank is found as the lab's `wedge` command finds it:
its Ray actor process, by title (vsim_harness.RANK_PROCESS).

Busy, by contrast (--max-num-seqs 2, long requests in flight): a one-token streamed request
waits for a free slot while the counter keeps moving.
"""

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import vllm_sim  # noqa: F401  (installed by make test)
from vsim_harness import (
    HEAD_IP,
    V2,
    WORKER_IP,
    Serve,
    StreamProbe,
    rank_lines,
    rank_processes,
    read_metrics,
    start_serve,
)

pytestmark = pytest.mark.slow

TP2 = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
# the program's liveness canary: a streamed completion of one token
CANARY = {"model": "m", "prompt": "spark-vllm liveness", "max_tokens": 1, "stream": True,
          "temperature": 0}
FROZEN_S = 5.0  # how long the canary must get nothing
# ~4 s a request at 8 tokens per step and >= 20 ms per step (400 tokens/s, api_server.py): still running
# when the rank is frozen a second after they were sent
LONG = {"model": "m", "max_tokens": 1600, "ignore_eos": True,
        "messages": [{"role": "user", "content": "go on"}]}


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wedge-serve-logs")


@pytest.fixture(scope="module")
def tp2(cluster, logs):
    s = start_serve(cluster, "m", TP2, {**V2, "VLLM_HOST_IP": HEAD_IP}, logs)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def worker_rank_pid(s: Serve) -> int:
    """The rank on the worker node: its pid from the server's rank lines, confirmed by the
    process pattern (every rank the server logged is a process the pattern finds)."""
    ranks = rank_lines(s.output())
    assert [(r, ip) for r, ip, _ in ranks] == [(0, HEAD_IP), (1, WORKER_IP)]
    found = rank_processes()
    for _, _, pid in ranks:
        assert pid in found, (pid, found)
        assert found[pid].startswith("ray::RayWorkerProc"), found[pid]
    return ranks[1][2]


def done_text(probe: StreamProbe) -> str:
    """The streamed text, from a stream that ended in [DONE]."""
    assert probe.status == 200
    assert probe.events[-1][1] == "[DONE]", probe.events
    parts = []
    for _, data in probe.events[:-1]:
        choices = json.loads(data)["choices"]
        if not choices:  # the usage's own chunk
            continue
        choice = choices[0]
        parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def watch(s: Serve, seconds: float) -> list[dict]:
    """/health and the metrics every half second."""
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        health = requests.get(f"{s.url}/health", timeout=5).status_code
        samples.append({"health": health, **read_metrics(s.url)})
        time.sleep(0.5)
    return samples


def test_streaming_sends_the_first_chunk_before_the_end(tp2):
    # the first chunk comes with the first token, then one per engine step (as vLLM's stream
    # generator sends one per engine output), the text over time
    probe = StreamProbe(tp2.url, "/v1/chat/completions",
                        {**LONG, "max_tokens": 400, "stream": True,
                         "stream_options": {"include_usage": True}})
    probe.join(60)
    first, last = probe.events[0][0], probe.events[-1][0]
    assert json.loads(probe.events[0][1])["choices"][0]["delta"] == {"role": "assistant",
                                                                    "content": ""}
    assert last - first > 0.3, probe.events  # 50 steps of >= 10 ms between them
    texts = [t for t, data in probe.events[1:-2]  # the usage's chunk and [DONE] after them
             if (json.loads(data)["choices"][0].get("delta") or {}).get("content")]
    assert len(texts) == 400 and texts[-1] - texts[0] > 0.3  # a chunk per token, as vLLM
    # the canned answer first, its words again for the tokens past its end (ignore_eos)
    assert "you said: go on" in done_text(probe)
    assert done_text(probe).startswith("vllm-sim (simulator, no inference)")
    usage = json.loads(probe.events[-2][1])["usage"]
    assert usage["completion_tokens"] == 400


def test_a_frozen_rank_wedges_the_engine_idle(tp2):
    pid = worker_rank_pid(tp2)
    before = read_metrics(tp2.url)
    assert before["vllm:num_requests_running"] == 0
    os.kill(pid, signal.SIGSTOP)
    try:
        probe = StreamProbe(tp2.url, "/v1/completions", CANARY)
        samples = watch(tp2, FROZEN_S)
        assert probe.first_at is None, probe.events  # no first token
        assert probe.status == 200  # the headers went out at once, as vLLM's do
    finally:
        os.kill(pid, signal.SIGCONT)
    assert {x["health"] for x in samples} == {200}
    assert {x["vllm:generation_tokens_total"] for x in samples} == {
        before["vllm:generation_tokens_total"]}
    # the request hangs while the gauge reads what the last step published: 0
    assert {x["vllm:num_requests_running"] for x in samples} == {0.0}
    assert {x["vllm:num_requests_waiting"] for x in samples} == {0.0}
    probe.join(30)
    assert probe.first_at is not None and probe.first_at >= FROZEN_S
    assert "you said: spark-vllm liveness" in done_text(probe)
    after = read_metrics(tp2.url)
    assert after["vllm:generation_tokens_total"] == before["vllm:generation_tokens_total"] + 1


def test_a_frozen_rank_wedges_the_engine_in_flight(tp2):
    pid = worker_rank_pid(tp2)
    with ThreadPoolExecutor(4) as pool:
        loads = [pool.submit(requests.post, f"{tp2.url}/v1/chat/completions", json=LONG,
                             timeout=120) for _ in range(3)]
        deadline = time.monotonic() + 10
        while read_metrics(tp2.url)["vllm:num_requests_running"] < 3:
            assert time.monotonic() < deadline, "the load never ran"
            time.sleep(0.05)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.5)  # the step in flight when the rank stopped never ends
            probe = StreamProbe(tp2.url, "/v1/completions", CANARY)
            samples = watch(tp2, FROZEN_S)
            assert probe.first_at is None, probe.events
            assert not any(f.done() for f in loads)
        finally:
            os.kill(pid, signal.SIGCONT)
        answers = [f.result() for f in loads]
    assert {x["health"] for x in samples} == {200}
    assert len({x["vllm:generation_tokens_total"] for x in samples}) == 1
    # the gauges keep their last published value: 3 running, nothing waiting
    assert {x["vllm:num_requests_running"] for x in samples} == {3.0}
    assert {x["vllm:num_requests_waiting"] for x in samples} == {0.0}
    assert [a.status_code for a in answers] == [200, 200, 200]
    probe.join(30)
    assert probe.first_at is not None and probe.first_at >= FROZEN_S
    assert done_text(probe)


def test_a_full_batch_makes_a_short_request_wait_while_tokens_flow(cluster, logs, tp2):
    tp2.stop()  # its two GPUs are the cluster's two
    s = start_serve(cluster, "m", [*TP2, "--max-num-seqs", "2"],
                    {**V2, "VLLM_HOST_IP": HEAD_IP}, logs)
    try:
        s.wait_ready()
        assert "Scheduler: max_num_seqs=2" in s.output()
        long = {**LONG, "max_tokens": 4000}  # >= 5 s each
        with ThreadPoolExecutor(4) as pool:
            loads = [pool.submit(requests.post, f"{s.url}/v1/chat/completions", json=long,
                                 timeout=120) for _ in range(3)]
            deadline = time.monotonic() + 10
            while read_metrics(s.url).get("vllm:num_requests_waiting", 0) < 1:
                assert time.monotonic() < deadline, "nothing ever waited"
                time.sleep(0.05)
            probe = StreamProbe(s.url, "/v1/completions", CANARY)
            samples = watch(s, 2.0)
            assert probe.first_at is None, probe.events  # behind the full batch
            probe.join(60)
            answers = [f.result() for f in loads]
    finally:
        s.stop()
    tokens = [x["vllm:generation_tokens_total"] for x in samples]
    assert tokens == sorted(tokens) and tokens[-1] > tokens[0] + 100  # busy, not wedged
    assert {x["vllm:num_requests_running"] for x in samples} == {2.0}
    assert min(x["vllm:num_requests_waiting"] for x in samples) >= 1
    assert {x["health"] for x in samples} == {200}
    assert probe.first_at is not None and probe.first_at > 2.0
    assert "you said: spark-vllm liveness" in done_text(probe)
    assert [a.status_code for a in answers] == [200, 200, 200]
