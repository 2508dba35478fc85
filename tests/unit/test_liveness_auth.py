"""The liveness check against a vLLM behind the program's API-key middleware: like
scripts/spark_vllm_auth.py, the fake answers 401 to every route but /health and /ping without
`Authorization: Bearer <key>`, /metrics included. A check that read /metrics without the key
would see no counter and could never tell busy from wedged (both "unknown", counted as
serving): these tests prove it sends the key, and what it says without one."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_vllm.components.render.commands import script_text
from spark_vllm.status import classify

KEY = "sk-in-the-container"
CANARY_S, WINDOW_S = 0.5, 2.0
DEADLINE_S = WINDOW_S + 15  # any run of the check; a held canary is released by then too


class _GuardedVllm(http.server.BaseHTTPRequestHandler):
    """vLLM as the server's `mode` says: serving (a token at once), busy (no token for the
    canary, the counter moves), wedged (no token, the counter stands still), no-counter (no
    token and no vllm:generation_tokens_total: nothing can tell)."""

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refused(self) -> bool:
        """401 as the middleware answers it, for every path but its open ones."""
        self.server.seen.append((self.command, self.path,  # type: ignore[attr-defined]
                                 self.headers.get("Authorization")))
        if self.path in ("/health", "/ping") or self.headers.get("Authorization") == f"Bearer {KEY}":
            return False
        self._answer(401, b'{"error":"Unauthorized"}')
        return True

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        if self._refused():
            return
        if self.path == "/health":
            self._answer(200)
            return
        if srv.mode == "busy":  # type: ignore[attr-defined]
            srv.tokens += 40  # type: ignore[attr-defined]
        counter = ("" if srv.mode == "no-counter" else  # type: ignore[attr-defined]
                   f'vllm:generation_tokens_total{{model_name="m"}} {srv.tokens}\n')  # type: ignore[attr-defined]
        self._answer(200, (counter + 'vllm:num_requests_running{model_name="m"} 1.0\n').encode(),
                     "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        srv = self.server
        self.rfile.read(int(self.headers["Content-Length"]))  # the body first, then refuse
        if self._refused():
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if srv.mode != "serving":  # type: ignore[attr-defined]
            srv.release.wait(DEADLINE_S)  # type: ignore[attr-defined]  # held past the canary's bound
        self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\ndata: [DONE]\n\n')


@pytest.fixture
def guarded() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GuardedVllm)
    srv.mode, srv.tokens, srv.seen = "serving", 1000, []  # type: ignore[attr-defined]
    srv.release = threading.Event()  # type: ignore[attr-defined]
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield srv
    srv.release.set()  # type: ignore[attr-defined]
    srv.shutdown()
    srv.server_close()
    thread.join(DEADLINE_S)


def check(srv: http.server.ThreadingHTTPServer, key: str | None,
          key_file: str | None = None) -> tuple[str, str, str, float]:
    """(state as `spark-vllm status` names it, what it saw, the check's stdout line, seconds):
    the check as the container runs it, python3 with the script on stdin and the key in env
    (a container of an earlier release) or, with `key_file`, the key file's path there."""
    argv = [sys.executable, "-", "127.0.0.1", str(srv.server_port), "m", f"{CANARY_S:g}",
            f"{WINDOW_S:g}"]
    env = {"PATH": "/usr/bin:/bin", **({"VLLM_API_KEY": key} if key else {}),
           **({"SPARK_VLLM_API_KEY_FILE": key_file} if key_file else {})}
    t0 = time.monotonic()
    proc = subprocess.run(argv, input=script_text("vllm_liveness.py"), capture_output=True,
                          text=True, env=env, timeout=DEADLINE_S)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    # status._ask_vllm keeps these stderr lines as what was seen
    seen = [ln for ln in proc.stderr.splitlines()
            if ln.startswith(("serving:", "busy:", "unknown:"))]
    state, detail = classify(line, seen)
    return state, detail, line, took


@pytest.mark.parametrize(("mode", "state", "said"), [
    ("serving", "serving", "serving: first token in"),
    # the counter read with the key moves: a long queue, not a dead server
    ("busy", "busy", "busy: the canary waited 0.5 s; 40 tokens generated"),
    ("wedged", "wedged", "wedged: no token for the canary in 0.5 s, none generated in 2 s"),
    # nothing can tell: counted as serving, and the message says so and why
    ("no-counter", "serving",
     "unknown: no token for the canary in 0.5 s and no vllm:generation_tokens_total in "
     "/metrics: busy cannot be told from wedged (counted as serving: a long queue looks the "
     "same, and replacing a busy server reloads its weights)"),
], ids=lambda v: v if v in ("serving", "busy", "wedged", "no-counter") else "")
def test_with_the_key_each_state_is_told_through_the_middleware(
        guarded: http.server.ThreadingHTTPServer, mode: str, state: str, said: str) -> None:
    guarded.mode = mode  # type: ignore[attr-defined]
    got, detail, line, took = check(guarded, KEY)
    assert (got, said in detail) == (state, True), (line, detail)
    # every guarded request carried the key
    seen = guarded.seen  # type: ignore[attr-defined]
    assert {a for _, p, a in seen if p != "/health"} == {f"Bearer {KEY}"}, seen
    # /metrics read before the canary, then (busy, wedged) again until it moved or the window
    # ended: busy is said at the first moved read, wedged only after the whole window (counted,
    # not timed, where a loaded machine could make a fast answer slow)
    reads = sum(p == "/metrics" for _, p, _ in seen)
    if mode == "wedged":
        assert reads >= 2 and took >= WINDOW_S, (seen, took)
    else:
        assert reads == (2 if mode == "busy" else 1), seen


@pytest.mark.parametrize("key", [None, "sk-wrong"])
@pytest.mark.parametrize("mode", ["serving", "busy", "wedged", "no-counter"])
def test_without_the_right_key_the_check_says_not_serving_with_the_401(
        guarded: http.server.ThreadingHTTPServer, mode: str, key: str | None) -> None:
    """A container whose env lacks the middleware's key: the canary is refused whatever vLLM
    does, and that is said (refresh replaces the container: a server nobody can call is not
    serving), never taken for "unknown"."""
    guarded.mode = mode  # type: ignore[attr-defined]
    got, detail, line, _ = check(guarded, key)
    assert (got, line) == ("not serving", 'running, not serving: the canary got 401: '
                                          '{"error":"Unauthorized"}'), detail
    # refused at once: /metrics (401) and the canary (401), no waiting on the counter
    assert [p for _, p, _ in guarded.seen] == [  # type: ignore[attr-defined]
        "/health", "/metrics", "/v1/completions"]


def test_the_key_comes_from_the_file_the_container_names(
        guarded: http.server.ThreadingHTTPServer, tmp_path: Path) -> None:
    """The program's containers get no VLLM_API_KEY: the key is in its file (0600, on the
    key's mount), which the check reads as the middleware does, a trailing newline aside."""
    guarded.mode = "serving"  # type: ignore[attr-defined]
    (tmp_path / "key").write_text(KEY + "\n")
    got, detail, line, _ = check(guarded, None, key_file=str(tmp_path / "key"))
    assert got == "serving", (line, detail)
    seen = guarded.seen  # type: ignore[attr-defined]
    assert {a for _, p, a in seen if p != "/health"} == {f"Bearer {KEY}"}, seen
