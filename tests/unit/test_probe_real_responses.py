"""The readiness probe against chat completions real vLLM 0.26.0 returned (recorded on an H200,
tests/fixtures/real-vllm/vllm-0.26.0.json). The seed's model is served with a reasoning parser:
vLLM then answers with `content: null` and the text in `reasoning`, which made the probe die
with a TypeError (exit 1), so every vLLM start failed and every `up --refresh` replaced vLLM.
Any valid chat completion is an answer; an HTTP error, a body that is no chat completion, or
no answer in time is not."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from spark_vllm.components.render.commands import script_text

FIXTURE = Path(__file__).parents[1] / "fixtures" / "real-vllm" / "vllm-0.26.0.json"
SERVED = "spark-vllm/tiny-dense"


def recorded(run: str, scenario: str, *path: str) -> dict[str, Any]:
    node: Any = json.loads(FIXTURE.read_text())["runs"][run]["scenarios"][scenario]
    for key in path:
        node = node[key]
    return node


class _Server:
    """/health, /v1/models and /v1/chat/completions answering what a test sets."""

    def __init__(self) -> None:
        self.status, self.body, self.delay = 200, b"{}", 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:  # the probe gave up first (the timeout case)
                    pass

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/health":
                    self._send(200, b"")
                else:
                    self._send(200, json.dumps({"data": [{"id": SERVED}]}).encode())

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                if outer.delay:
                    threading.Event().wait(outer.delay)
                self._send(outer.status, outer.body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]


@pytest.fixture()
def server() -> Iterator[_Server]:
    s = _Server()
    t = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    t.start()
    yield s
    s.httpd.shutdown()


def probe(server: _Server, *mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-", "127.0.0.1", str(server.port), SERVED, *mode],
                          input=script_text("vllm_probe.py"), capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize(("run", "scenario", "path", "says"), [
    # --reasoning-parser qwen3: content null, the text in `reasoning` (the seed's case)
    ("serve", "reasoning", ("json",), "(reasoning)"),
    # a named tool_choice with the reasoning parser on: content "" (nothing after reasoning)
    ("serve", "tool_call", ("named", "json"), "(reasoning)"),
    # tool_choice auto: content text and reasoning both
    ("serve", "tool_call", ("auto", "json"), "smoke request answered: '"),
    # enable_thinking false: plain content
    ("serve", "reasoning_off", ("json",), "smoke request answered: '"),
])
def test_every_recorded_real_completion_is_an_answer(server: _Server, run: str, scenario: str,
                                                     path: tuple[str, ...], says: str) -> None:
    server.body = json.dumps(recorded(run, scenario, *path)).encode()
    for mode in (("smoke", "5"), ("wait", "5", "smoke", "5")):
        done = probe(server, *mode)
        assert done.returncode == 0, (mode, done.stderr)
        assert says in done.stdout, done.stdout


def test_the_recorded_reasoning_answer_really_has_no_content() -> None:
    """The fixture is what the probe above must survive: no content, text in `reasoning`."""
    msg = recorded("serve", "reasoning", "json")["choices"][0]["message"]
    assert msg["content"] is None and msg["reasoning"]


def test_a_completion_with_no_text_at_all_is_still_an_answer(server: _Server) -> None:
    reply = recorded("serve", "reasoning", "json")
    reply["choices"][0]["message"].update(content="", reasoning=None)
    server.body = json.dumps(reply).encode()
    done = probe(server, "smoke", "5")
    assert done.returncode == 0 and "(no text; finish_reason length)" in done.stdout


@pytest.mark.parametrize(("status", "body", "rc"), [
    (500, b'{"error": "engine dead"}', 2),      # an HTTP error
    (200, b'{"object": "error"}', 2),           # 200 but no chat completion
    (200, b'{"choices": []}', 2),
    (200, b"not json", 2),
])
def test_an_error_or_a_non_completion_is_not_an_answer(server: _Server, status: int,
                                                       body: bytes, rc: int) -> None:
    server.status, server.body = status, body
    done = probe(server, "smoke", "5")
    assert done.returncode == rc, done.stderr
    assert "smoke request failed" in done.stderr


def test_no_answer_in_time_is_exit_3(server: _Server) -> None:
    server.body, server.delay = json.dumps(recorded("serve", "reasoning", "json")).encode(), 3.0
    done = probe(server, "smoke", "1")
    assert done.returncode == 3 and "no answer within 1 s" in done.stderr
