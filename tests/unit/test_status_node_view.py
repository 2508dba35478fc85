"""What `spark-vllm status` reads from one node in one SSH session: its containers, the image
under the stack's tag, the compile cache's size and Ray's node table, each section parsed
whatever others are there (a default stack has a compile cache: the image's id once read as
"sha256:…\\n---cache\\n…" and every node was said to hold another image)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from spark_vllm import status_report
from spark_vllm.components import ssh

IMAGE_ID = "sha256:" + "d" * 64
NODE = {"name": "node-1", "host": "10.0.0.1", "port": 22, "user": "root",
        "containers": {"ray-head": "spark-vllm-lab-ray-head", "vllm": "spark-vllm-lab-vllm"},
        "compileCache": "/root/.cache/spark-vllm-compile/lab"}


def answer(stdout: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    scripts: list[str] = []

    def run(target: Any, script: str, stdin: str = "", timeout: float = 60) -> Any:
        scripts.append(script)
        return subprocess.CompletedProcess([], 0, stdout, "")

    monkeypatch.setattr(ssh, "run", run)
    return scripts


def test_every_section_is_read_with_the_others_there(monkeypatch: pytest.MonkeyPatch) -> None:
    answer("/spark-vllm-lab-ray-head|c1|running|0|t|" + IMAGE_ID + "\n"
           "/spark-vllm-lab-vllm|c2|exited|1|t|" + IMAGE_ID + "\n"
           "---image\n" + IMAGE_ID + "\n"
           "---cache\n2048\n"
           '---ray\n[{"ip": "192.168.1.1", "gpus": 1}]\n', monkeypatch)
    views, unreachable, ray, cache, held = status_report._node_view(
        NODE, "key", {}, head=True, image="spark-vllm-sim:lab")
    assert unreachable is None
    assert [(v.role, v.state) for v in views] == [("ray-head", "running"), ("vllm", "exited (1)")]
    assert held == IMAGE_ID
    assert cache == "2 MiB in /root/.cache/spark-vllm-compile/lab"
    assert ray == [{"ip": "192.168.1.1", "gpus": 1}]
    assert status_report.image_mismatch(IMAGE_ID, held, views) is None


def test_the_image_alone_and_the_cache_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    answer("---image\nmissing\n", monkeypatch)
    node = {**NODE, "compileCache": "none"}
    _, _, _, cache, held = status_report._node_view(node, "k", {}, head=False, image="x")
    assert (held, cache) == ("missing", "")
    answer("---cache\n\n", monkeypatch)
    _, _, _, cache, held = status_report._node_view(NODE, "k", {}, head=False)
    assert (held, cache) == ("", "empty (/root/.cache/spark-vllm-compile/lab)")
