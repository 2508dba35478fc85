"""`spark-vllm top`'s reading and its screen: vLLM's /metrics parsed and turned into rates, the
screen's lines for a serving, a cut and a wedged cluster, and the textual app's keys (driven by
textual's own pilot; tests/integration/test_top.py drives it in a real terminal on the lab)."""

from __future__ import annotations

import asyncio

import pytest

from spark_vllm import top, top_data
from spark_vllm.status_report import ContainerView, Report

# vLLM 0.26's exposition (vllm/v1/metrics/loggers.py: one series per engine and model)
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.125
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1000.0
vllm:prompt_tokens_created{engine="0",model_name="qwen"} 1.7e+09
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 5000.0
vllm:iteration_tokens_total_bucket{le="1.0"} 7.0
"""


def test_metrics_are_summed_per_name_and_become_rates() -> None:
    values = top_data.parse_metrics(METRICS)
    assert values == {"vllm:num_requests_running": 4.0, "vllm:num_requests_waiting": 2.0,
                      "vllm:kv_cache_usage_perc": 0.125, "vllm:prompt_tokens_total": 1000.0,
                      "vllm:generation_tokens_total": 5000.0}
    first = top_data.Metrics(10.0, values)
    later = top_data.Metrics(12.0, {**values, "vllm:prompt_tokens_total": 1100.0,
                                    "vllm:generation_tokens_total": 5800.0})
    assert top_data.rates(first, later) == {"prompt": 50.0, "generation": 400.0}
    assert top_data.rates(None, first) == {"prompt": None, "generation": None}
    restarted = top_data.Metrics(14.0, {**values, "vllm:generation_tokens_total": 10.0})
    assert top_data.rates(later, restarted)["generation"] is None  # a counter went back


NODES = [{"name": "node-1", "host": "10.0.0.1", "identityIp": "192.168.1.1",
          "containers": {}},
         {"name": "node-2", "host": "10.0.0.2", "identityIp": "192.168.1.2",
          "containers": {}}]


def snap(vllm_state: str = "serving", unreachable: dict[str, str] | None = None,
         metrics: bool = True) -> top_data.Snapshot:
    report = Report("lab", "http://10.0.0.1:8000/v1", "qwen", nodes=NODES, key="k",
                    vllm_state=vllm_state, vllm="canary answered in 0.2 s",
                    endpoint_ok=True, unreachable=unreachable or {},
                    ray={"node-1": "alive, 1 GPU (192.168.1.1)"})
    report.containers = [ContainerView("node-1", "ray-head", "spark-vllm-lab-ray-head",
                                       "running"),
                         ContainerView("node-1", "vllm", "spark-vllm-lab-vllm", "running")]
    s = top_data.Snapshot("lab", "12:00:00", report=report, fabric="pass (2026-12-06)",
                          memory={"node-1": "90.1/119.7 GiB (unified)"})
    if metrics:
        s.metrics = top_data.Metrics(1.0, top_data.parse_metrics(METRICS))
        s.rates = {"prompt": 50.0, "generation": 400.0}
    else:
        s.metrics_problem = "http://10.0.0.1:8000/metrics: timed out"
    return s


def test_the_screen_names_each_node_vllms_verdict_and_the_rates() -> None:
    text = "\n".join(top_data.render(snap()))
    assert "vLLM SERVING: canary answered in 0.2 s" in text
    assert "node-1  192.168.1.1  memory 90.1/119.7 GiB (unified)  Ray: alive" in text
    assert "    vllm         running" in text
    assert "requests: 4 running, 2 waiting   KV cache: 12.5 %" in text
    assert "tokens/s: prompt 50.0, generation 400.0" in text
    assert "fabric: pass (2026-12-06)" in text


def test_a_cut_node_a_wedged_vllm_and_unreachable_metrics_are_lines_not_tracebacks() -> None:
    text = "\n".join(top_data.render(snap("wedged", {"node-2": "no answer within 20 s"},
                                          metrics=False)))
    assert "vLLM WEDGED" in text
    assert "node-2  UNREACHABLE: no answer within 20 s" in text
    assert "metrics: unreachable (http://10.0.0.1:8000/metrics: timed out)" in text
    failed = top_data.Snapshot("lab", "12:00:00", problem="CliError: wrong passphrase")
    assert top_data.render(failed)[-1] == "cannot read the stack: CliError: wrong passphrase"


def test_the_app_refreshes_shows_logs_and_quits(monkeypatch: pytest.MonkeyPatch) -> None:
    screens = iter([snap(), snap("wedged", {"node-2": "cut"})])
    monkeypatch.setattr(top_data, "snapshot", lambda stack, key, prev: next(screens))
    monkeypatch.setattr(top, "container_log",
                        lambda s, i: ("node-1 vllm: last 15 log lines", f"log line {i}"))

    class Stack:
        name = "lab"

    async def drive() -> list[str]:
        from textual.widgets import Static

        seen = []
        app = top.make_app(Stack(), None, interval=60)
        async with app.run_test() as pilot:
            await pilot.pause(0.5)
            seen.append(str(app.query_one("#screen", Static).render()))
            await pilot.press("r")
            await pilot.pause(0.5)
            seen.append(str(app.query_one("#screen", Static).render()))
            await pilot.press("l")
            await pilot.pause(0.5)
            seen.append(str(app.query_one("#logs", Static).render()))
            await pilot.press("q")
        return seen

    loop = asyncio.new_event_loop()  # not asyncio.run: it leaves the thread without a loop
    try:
        first, second, logs = loop.run_until_complete(drive())
    finally:
        loop.close()
    assert "vLLM SERVING" in first
    assert "vLLM WEDGED" in second and "node-2  UNREACHABLE: cut" in second
    assert "log line 0" in logs


def test_several_models_are_read_each_at_its_own_vllm_and_shown_per_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's endpoint is the gateway (LiteLLM: no vLLM metrics): each model's /metrics is
    read at its own endpoint, its rates kept per model, and the screen has a block per model
    with its verdict; the gateway's endpoint is never asked for metrics."""
    from spark_vllm.status_report import ModelView

    report = Report("lab", "http://10.0.0.1:8000/v1", "big", nodes=NODES, key="k",
                    vllm_state="wedged", vllm="big: serving; small: wedged", endpoint_ok=True)
    report.models = [
        ModelView("big", "big", NODES[0], "spark-vllm-lab.big-vllm-leader", state="serving",
                  seen="first token in 0.1 s", nodes=["node-1", "node-2"],
                  endpoint="http://10.0.0.1:8001/v1"),
        ModelView("small", "small-chat", NODES[1], "spark-vllm-lab.small-vllm-leader",
                  state="wedged", seen="no token for the canary in 10 s", nodes=["node-2"],
                  endpoint="http://10.0.0.2:8002/v1")]
    asked: list[str] = []
    counts = iter([1000.0, 1100.0])

    def read(endpoint: str, key: str | None, timeout: float = 5) -> top_data.Metrics:
        asked.append(endpoint)
        if endpoint.endswith(":8002/v1"):
            raise OSError("http://10.0.0.2:8002/metrics: timed out")
        at = 2.0 * asked.count(endpoint)  # its own reads 2 s apart, whatever the threads' order
        return top_data.Metrics(at, {**top_data.parse_metrics(METRICS),
                                     "vllm:generation_tokens_total": next(counts)})

    class Stack:
        name = "lab"

        def outputs(self) -> dict:
            return {}

    monkeypatch.setattr(top_data, "collect", lambda stack: report)
    monkeypatch.setattr(top_data, "read_metrics", read)
    monkeypatch.setattr(top_data, "node_memory_of", lambda node, key: "1/2 GiB")
    first = top_data.snapshot(Stack(), "key", None)
    second = top_data.snapshot(Stack(), "key", first)
    assert sorted(set(asked)) == ["http://10.0.0.1:8001/v1", "http://10.0.0.2:8002/v1"]
    assert second.metrics is None and second.models["big"].rates["generation"] == 100.0 / 2
    text = "\n".join(top_data.render(second))
    assert "model big (big) on node-1, node-2: SERVING\n    requests: 4 running" in text, text
    assert "    tokens/s: prompt 0.0, generation 50.0" in text, text
    assert ("model small (small-chat) on node-2: WEDGED: no token for the canary in 10 s\n"
            "    metrics: unreachable (http://10.0.0.2:8002/metrics: timed out)") in text, text
