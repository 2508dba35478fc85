"""`spark-vllm status` on a stack with several models: each model read on its own node by its
own API server's container, the verdict and the text per model."""

from __future__ import annotations

from spark_vllm.status_report import ContainerView, Report, model_views
from tests.unit.harness import run_outputs
from tests.unit.test_several_graph import two


def test_each_model_is_read_on_its_first_node_by_its_own_container() -> None:
    out = run_outputs(two())
    views = {m.key: m for m in model_views(out)}
    assert views["big"].node["name"] == "node-1"
    assert views["big"].container == "spark-vllm-test.big-vllm-leader"
    assert views["small"].node["name"] == "node-2"
    assert views["small"].container == "spark-vllm-test.small-vllm-leader"
    assert (views["big"].utilization, views["small"].utilization) == (0.5, 0.3)
    assert views["small"].nodes == ["node-2"]
    # a single-model stack has none
    assert model_views({"nodes": out["nodes"]}) == []


def test_one_model_down_is_named_and_the_others_are_not() -> None:
    out = run_outputs(two())
    report = Report("test", out["endpoint"], "org/big", models=model_views(out))
    report.ray_ok = True
    report.endpoint_ok = True
    report.containers = [ContainerView("node-1", "big/vllm-leader", "a", "running"),
                         ContainerView("node-2", "small/vllm-leader", "b", "running")]
    big, small = report.models
    big.state, big.seen = "serving", "a token in 0.1 s"
    small.state, small.seen = "wedged", "wedged: no token within 5 s"
    assert not report.serving
    assert report.problems() == ["model small: vLLM wedged: wedged: no token within 5 s"]
    text = report.text()
    assert "model big (org/big, on node-1, node-2): serving" in text
    assert "model small (org/small, on node-2): wedged" in text
    assert report.to_json()["models"]["small"]["ok"] is False
    small.state = "busy"
    assert report.serving
