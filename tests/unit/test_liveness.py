"""The liveness companion's provider: what its diff decides, what its read script says for
each state docker can report, and that spark-vllm's code never becomes part of the state."""

from __future__ import annotations

import base64
import http.server
import os
import pickletools
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from spark_vllm.components import liveness
from spark_vllm.components.render.commands import script_text

PROPS = {"node": "node-2", "host": "10.0.0.2", "port": 22, "user": "aurora",
         "privateKey": "k", "hostKey": "", "container": "spark-vllm-s-ray-worker",
         "serving": [], "state": "running", "__provider": "old-code"}


def test_a_container_seen_dead_replaces_the_companion() -> None:
    for seen in ("exited (137)", "gone", "running, not serving: smoke request failed"):
        d = liveness._Provider().diff("id", {**PROPS, "state": seen}, PROPS)
        assert d.changes and d.replaces == ["state"], seen


def test_anything_else_is_an_update_that_keeps_the_id() -> None:
    """A new address or key must not restart anything by itself (the container command has its
    own triggers for that), and a new spark-vllm (another serialized provider) changes nothing."""
    p = liveness._Provider()
    assert not p.diff("id", PROPS, {**PROPS, "__provider": "new-code"}).changes
    for key, value in (("host", "10.0.0.9"), ("privateKey", "k2"), ("user", "root")):
        d = p.diff("id", PROPS, {**PROPS, key: value})
        assert d.changes and not d.replaces, key
    assert p.update("id", PROPS, {**PROPS, "host": "10.0.0.9"}).outs["state"] == "running"


def test_the_state_holds_a_reference_to_the_provider_not_its_code() -> None:
    """What the state stores for the companion's provider: a pickle that names the class (to be
    imported from the project at run time), with no code object. So upgrading spark-vllm cannot
    change it, even byte for byte."""
    blob = base64.b64decode(serialize_provider(liveness._Provider()))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(blob)]
    strings = [arg for name, arg in ops if isinstance(arg, str)]
    # the name states made before the components/ move hold (spark_vllm/liveness.py keeps it)
    assert "spark_vllm.liveness" in strings and "_Provider" in strings
    assert not any("code" in str(arg).lower() for _, arg in ops if arg is not None), ops
    assert len(blob) < 200


@pytest.fixture
def fake_docker(tmp_path: Path) -> Path:
    """A `docker` that answers `inspect` as $FAKE says, and runs `exec -i NAME CMD…` as CMD
    here (the container is this machine); it records how it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "docker"
    tool.write_text("""#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$1:$FAKE" in
  inspect:missing) echo "Error: No such object: $3" >&2; exit 1 ;;
  inspect:daemon) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock" >&2; exit 1 ;;
  inspect:exited) echo "exited 0" ;;
  inspect:*) echo "running 0" ;;
  exec:*) shift 3; exec "$@" ;;
esac
""")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bin_dir


class _FakeVllm(http.server.BaseHTTPRequestHandler):
    """vLLM's /health, /metrics and streamed /v1/completions, as the server's `mode` says:
    serving (a token at once), busy (no token for the canary; the counter moves), wedged (no
    token; the counter stands still: a frozen rank), dead-generation (500), unhealthy (503)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        if self.path == "/health":
            self.send_response(503 if srv.mode == "unhealthy" else 200)  # type: ignore[attr-defined]
            self.end_headers()
            return
        if srv.mode == "busy":  # type: ignore[attr-defined]
            srv.tokens += 40  # type: ignore[attr-defined]
        body = ("# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{model_name="m"}} {srv.tokens}\n'  # type: ignore[attr-defined]
                'vllm:generation_tokens_total_created{model_name="m"} 1.7e9\n'
                'vllm:num_requests_running{model_name="m"} 0.0\n').encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        srv = self.server
        self.rfile.read(int(self.headers["Content-Length"]))
        srv.auth.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        if srv.mode == "dead-generation":  # type: ignore[attr-defined]
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "engine dead"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if srv.mode in ("busy", "wedged"):  # type: ignore[attr-defined]
            time.sleep(5)  # longer than the canary's bound
        self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\ndata: [DONE]\n\n')


@pytest.fixture
def fake_vllm() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeVllm)
    srv.mode, srv.tokens, srv.auth = "serving", 1000, []  # type: ignore[attr-defined]
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()


@pytest.mark.parametrize(("fake", "vllm", "rc", "out", "seen"), [
    ("missing", None, 0, "gone", ""),
    ("exited", None, 0, "exited (0)", ""),  # a dead rank makes vLLM exit 0: still dead
    ("running", None, 0, "running", ""),
    ("running", "serving", 0, "running", "serving: first token in"),
    ("running", "dead-generation", 0,
     'running, not serving: the canary got 500: {"error": "engine dead"}', ""),
    ("running", "unhealthy", 0, "running, not serving: /health answered 503", ""),
    # a long queue is not a dead server: refresh must not reload the weights for it
    ("running", "busy", 0, "running", "busy: the canary waited 1 s; 40 tokens generated"),
    ("running", "wedged", 0, "wedged: no token for the canary in 1 s, none generated in 3 s", ""),
    ("daemon", None, 3, "", ""),
])
def test_inspect_script_says_what_docker_and_vllm_say(
        fake_docker: Path, fake_vllm: http.server.ThreadingHTTPServer, tmp_path: Path,
        fake: str, vllm: str | None, rc: int, out: str, seen: str) -> None:
    log = tmp_path / "calls"
    serving = None
    if vllm:
        fake_vllm.mode = vllm  # type: ignore[attr-defined]
        serving = ["127.0.0.1", str(fake_vllm.server_port), "m", "1", "3"]
    t0 = time.monotonic()
    proc = subprocess.run(
        ["sh", "-c", liveness.inspect_script("spark-vllm-s-vllm", serving)],
        input=script_text("vllm_liveness.py") if serving else "", capture_output=True, text=True,
        env={**os.environ, "PATH": f"{fake_docker}:{os.environ['PATH']}", "FAKE": fake,
             "FAKE_LOG": str(log), "VLLM_API_KEY": "sk-in-the-container"}, timeout=30)
    assert (proc.returncode, proc.stdout.strip()) == (rc, out), proc.stderr
    assert seen in proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("inspect --format") and calls[0].endswith("spark-vllm-s-vllm")
    if fake == "daemon":
        assert "Cannot connect to the Docker daemon" in proc.stderr
    # the check runs only for vLLM, only while it runs, in the container, with its argv
    execs = [c for c in calls if c.startswith("exec")]
    assert execs == ([f"exec -i spark-vllm-s-vllm python3 - {' '.join(serving)}"]
                     if serving and fake == "running" else [])
    if vllm in ("serving", "busy", "wedged"):
        # the canary carries the container's key; busy answers at the first moved counter,
        # wedged takes the whole window
        assert fake_vllm.auth == ["Bearer sk-in-the-container"]  # type: ignore[attr-defined]
        took = time.monotonic() - t0
        assert (took < 3) if vllm != "wedged" else (took >= 3), took


def test_a_state_written_before_the_canary_gets_the_default_bounds() -> None:
    from spark_vllm.components.render.liveness_commands import liveness_args, liveness_timeout
    assert liveness_args(["h", "8000", "m"]) == ["h", "8000", "m", "30", "60"]
    assert liveness_timeout(["h", "8000", "m", "5", "20"]) == 35


def test_a_state_made_before_the_components_move_still_loads_its_provider() -> None:
    """tests/fixtures/layout-0.4/liveness-provider.b64 is the provider as 0.4's layout
    (spark_vllm/liveness.py) serialized it into every liveness resource of a state. After the
    move it must still load (refresh, preview and destroy of an old stack unpickle it), and
    today's program must serialize the same bytes (an upgrade changes no liveness resource)."""
    import dill

    from spark_vllm.components.liveness import _Provider

    old = (Path(__file__).resolve().parents[1] / "fixtures" / "layout-0.4"
           / "liveness-provider.b64").read_text().strip()
    provider = dill.loads(base64.b64decode(old))
    assert type(provider) is _Provider
    assert callable(provider.read) and callable(provider.delete)
    assert serialize_provider(_Provider()) == old
