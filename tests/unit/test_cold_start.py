"""A cold start on a Spark pair that nothing kills (issue 35): the env each container gets
(Ray's memory monitor and health checks, vLLM's engine-ready clock), the start's bound and the
phase a timed-out start names, the smoke request's bound, and native's rendezvous clock and
its check that the headless ranks stay while rank 0 loads."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from spark_vllm.components.render import commands as c
from spark_vllm.components.render import start_clocks
from spark_vllm.components.render.backends import native
from spark_vllm.components.render.backends import ray as ray_backend
from spark_vllm.components.spec import SpecError
from tests.unit.harness import lab_nodes, spec_from
from tests.unit.test_commands import FAKE_DOCKER, duo, run_with_fake_docker
from tests.unit.test_native import HEADER, nspec

REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-vllm"


def env_of(argv: list[str]) -> dict[str, str]:
    """The `--env KEY=VALUE` (and `--env KEY`: taken from the caller, shown as None) pairs."""
    out: dict[str, str] = {}
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--env":
            key, _, val = value.partition("=")
            out[key] = val if "=" in value else "<from the start script>"
    return out


# --- Ray's memory monitor and health checks -----------------------------------------------------

def test_every_ray_container_turns_the_memory_monitor_off_and_waits_as_long_as_vllm() -> None:
    spec = duo()
    for argv in (ray_backend.head_run_argv(spec), ray_backend.worker_run_argv(spec, spec.nodes[1])):
        env = env_of(argv)
        assert env["RAY_memory_monitor_refresh_ms"] == "0"
        assert env["RAY_health_check_timeout_ms"] == "60000"
    # the driver's container is no Ray node: nothing of Ray's monitor or checks there
    assert not {k for k in env_of(ray_backend.vllm_run_argv(spec)) if k.startswith("RAY_health")}


def test_ray_calls_a_node_dead_no_sooner_than_vllm_gives_up_on_a_step() -> None:
    """threshold x (timeout + period) >= vLLM's per-step limit, whatever the operator set of
    the limit or the threshold; a gone raylet (refused at once) is still dead in
    threshold x period."""
    for env, limit, threshold in (({}, 300, 5),
                                  ({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "900"}, 900, 5),
                                  ({"RAY_health_check_failure_threshold": "3"}, 300, 3)):
        spec = duo(env=env)
        timeout_ms = int(ray_backend.ray_env(spec)["RAY_health_check_timeout_ms"])
        assert threshold * (timeout_ms + ray_backend.RAY_HEALTH_CHECK_PERIOD_MS) >= limit * 1000
        assert threshold * timeout_ms < (limit + 60) * 1000  # derived, not merely large
    assert ray_backend.RAY_HEALTH_CHECK_FAILURE_THRESHOLD * ray_backend.RAY_HEALTH_CHECK_PERIOD_MS \
        == 15000


def test_an_operators_ray_settings_are_honoured_once_and_checked() -> None:
    spec = duo(env={"RAY_memory_monitor_refresh_ms": "250", "RAY_health_check_timeout_ms": "5000"})
    argv = ray_backend.head_run_argv(spec)
    assert argv.count("RAY_memory_monitor_refresh_ms=250") == 1
    assert not [a for a in argv if a == "RAY_memory_monitor_refresh_ms=0"]
    assert argv.count("RAY_health_check_timeout_ms=5000") == 1
    assert ray_backend.ray_env(spec) == {}
    with pytest.raises(SpecError) as err:
        duo(env={"RAY_memory_monitor_refresh_ms": "off", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "0",
                 "RAY_health_check_failure_threshold": "-1"})
    text = str(err.value)
    assert "env.RAY_memory_monitor_refresh_ms: 'off' is not a whole number of at least 0" in text
    assert "env.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: '0' is not a whole number of at least 1" in text
    assert "env.RAY_health_check_failure_threshold: '-1' is not a whole number" in text


# --- vLLM's engine-ready clock ------------------------------------------------------------------

def test_the_api_servers_container_takes_the_starts_bound_as_vllms_engine_ready_clock() -> None:
    spec, nat = duo(), nspec()
    assert env_of(ray_backend.vllm_run_argv(spec))["VLLM_ENGINE_READY_TIMEOUT_S"] \
        == "<from the start script>"
    assert "VLLM_ENGINE_READY_TIMEOUT_S" in env_of(native.leader_run_argv(nat))
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in env_of(native.rank_run_argv(nat, nat.nodes[1]))
    for script in (ray_backend.vllm_start_script(spec), native.leader_start_script(nat)):
        assert script.index("export VLLM_ENGINE_READY_TIMEOUT_S=$bound") < script.index("cid=$(")
    # rank 0's node clears its compile cache for a new image in the same script: the bound
    # reads how warm the cache is after that
    leader = native.leader_start_script(nat)
    assert leader.index("clearing it for $img") < leader.index("bound=")
    with pytest.raises(SpecError, match=r"env\.VLLM_ENGINE_READY_TIMEOUT_S: set by the program "
                                        r"from vllmTimeout"):
        duo(env={"VLLM_ENGINE_READY_TIMEOUT_S": "3600"})


def test_docker_passes_the_exported_bound_into_the_container(tmp_path: Path) -> None:
    """`docker run --env KEY` takes KEY's value from the caller's environment: the fake docker
    records what the start script exported when it ran."""
    spec = duo(compileCache=str(tmp_path / "cc"))
    script = ray_backend.vllm_start_script(spec).replace(
        "cid=$(docker run", 'echo "$VLLM_ENGINE_READY_TIMEOUT_S" > "$FAKE/exported"; '
        "cid=$(docker run")
    run_with_fake_docker(script, tmp=tmp_path, stdin=c.vllm_stdin(None))
    assert (tmp_path / "exported").read_text().strip() == str(1800 + start_clocks.COLD_COMPILE_S)


# --- the start's bound and the phase it names ---------------------------------------------------

def _weights(hf: Path, mib: int, commit: str = "abc", ref: str | None = "main") -> None:
    """A model in hfCache as huggingface_hub lays it out: blobs, a snapshot of symlinks and the
    ref that names it."""
    repo = hf / "hub" / "models--Qwen--Q"
    blobs, snap = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    with (blobs / commit).open("wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1024 * 1024))
    (snap / "model.safetensors").symlink_to(blobs / commit)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)


def test_the_weights_are_the_served_revisions_not_every_one_in_the_cache(
        tmp_path: Path) -> None:
    """An older revision of the model beside the served one (a lab node that served a bigger
    model under the same name failed a lab test's bound by 15 s) does not count."""
    hf = tmp_path / "hf"
    _weights(hf, 500, commit="old", ref=None)
    _weights(hf, 210, commit="abc", ref="main")
    _weights(hf, 320, commit="c0ffee", ref=None)
    for revision, read in ((None, 2), ("c0ffee", 3), ("v9", 10)):  # v9: no such snapshot: all
        spec = spec_from(lab_nodes(1), stack="one", image="img:1", model="Qwen/Q",
                         tensorParallelSize=1, hfCache=str(hf), compileCache="none",
                         vllmTimeout=100, **({"modelRevision": revision} if revision else {}))
        d = tmp_path / f"run-{revision}"
        d.mkdir()
        out = run_with_fake_docker(ray_backend.vllm_start_script(spec), tmp=d,
                                   stdin=c.vllm_stdin(None))
        assert f"(vllmTimeout 100 s + {read} s to read" in out["_stderr"][0], (revision, out)


def test_the_bound_grows_with_the_weights_and_a_cold_compile_cache(tmp_path: Path) -> None:
    hf, cc = tmp_path / "hf", tmp_path / "cc"
    _weights(hf, 210)
    nodes = lab_nodes(1)
    spec = spec_from(nodes, stack="one", image="img:1", model="Qwen/Q", tensorParallelSize=1,
                     hfCache=str(hf), compileCache=str(cc), vllmTimeout=100)
    (tmp_path / "cold").mkdir()
    (tmp_path / "warm").mkdir()
    out = run_with_fake_docker(ray_backend.vllm_start_script(spec), tmp=tmp_path / "cold",
                               stdin=c.vllm_stdin(None))
    assert out["exec"][-4:-2] == ["wait", str(100 + 2 + start_clocks.COLD_COMPILE_S)]
    assert (f"bound of this start: {100 + 2 + start_clocks.COLD_COMPILE_S} s (vllmTimeout 100 s + 2 s to read "
            f"0.2 GiB of weights at 100 MiB/s + {start_clocks.COLD_COMPILE_S} s for a cold compile cache)"
            in out["_stderr"][0])
    # warm: the node's cache holds a compiled rank; the weights' read stays
    (cc / "one" / "vllm" / "torch_compile_cache" / "h1" / "rank_0_0").mkdir(parents=True)
    out = run_with_fake_docker(ray_backend.vllm_start_script(spec), tmp=tmp_path / "warm",
                               stdin=c.vllm_stdin(None))
    assert out["exec"][-4:-2] == ["wait", "102"]
    assert "bound of this start: 102 s (vllmTimeout 100 s + 2 s to read" in out["_stderr"][0]
    # compileCache none: every start compiles from nothing
    off = spec_from(nodes, stack="one", image="img:1", model="/models/q", tensorParallelSize=1,
                    modelStaging="none", compileCache="none", vllmTimeout=100)
    assert (f"bound=$((bound + {start_clocks.COLD_COMPILE_S})); why=\"$why + {start_clocks.COLD_COMPILE_S} s for a cold "
            "compile cache (compileCache: none)\"") in ray_backend.vllm_start_script(off)
    assert "du -sLk" not in ray_backend.vllm_start_script(off)  # a path: not in hfCache


def _real_line(text: str) -> str:
    """A line vLLM 0.26.0 printed (tests/fixtures/real-vllm/), as its log holds it."""
    for f in sorted(REAL_LOGS.glob("*")):
        for chunk in f.read_text(errors="replace").replace("\\n", "\n").split("\n"):
            if text in chunk:
                start = chunk.find("(EngineCore")
                start = start if start >= 0 else max(chunk.rfind('"', 0, chunk.find(text)) + 1, 0)
                end = chunk.find('"', chunk.find(text))
                return chunk[start:end if end > 0 else None]
    raise AssertionError(f"no real vLLM line with {text!r}")


@pytest.mark.parametrize(("last", "phase"), [
    (None, "starting (nothing loaded yet"),
    ("Starting to load model", "loading the weights"),
    ("Model loading took", "compiling or profiling (the weights are loaded)"),
    ("Compiling a graph for compile range", "compiling (torch.compile)"),
    ("Directly load the compiled graph", "compiling (torch.compile, from the cache)"),
    ("Available KV cache memory", "allocating the KV cache"),
    ("Capturing CUDA graphs", "capturing CUDA graphs"),
    ("init engine (profile, create kv cache, warmup model) took",
     "starting its API server (the engine is up)"),
])
def test_a_start_that_does_not_serve_names_the_phase_vllm_was_in(
        tmp_path: Path, last: str | None, phase: str) -> None:
    lines = ["(APIServer pid=1) INFO 12-01 10:18:51 [api_utils.py:1] non-default args: {}"]
    if last == "Starting to load model":
        lines.append("(EngineCore pid=9) INFO 12-01 10:19:02 [gpu_model_runner.py:5251] Starting "
                     "to load model Qwen/Q...")
    elif last == "Capturing CUDA graphs":  # tqdm's bar: carriage returns, no newline
        lines.append("(EngineCore pid=9) INFO 12-01 10:19:40 [monitor.py:82] Initial "
                     "profiling/warmup run took 3.10 s")
        lines.append("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  10%|#  | 5/51"
                     "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  20%|## | 10/51")
    elif last is not None:
        lines.append(_real_line(last))
    (tmp_path / "logs").write_text("\n".join(lines) + "\n")
    (tmp_path / "exec-fails").touch()  # the probe: not serving within its bound
    spec = duo(compileCache=str(tmp_path / "cc"), vllmTimeout=100)
    out = run_with_fake_docker(ray_backend.vllm_start_script(spec), tmp=tmp_path, check=False,
                               stdin=c.vllm_stdin(None))
    err = out["_stderr"][0]
    assert out["_rc"] == ["1"]
    assert (f"FAILED: vLLM did not serve within {100 + start_clocks.COLD_COMPILE_S} s (vllmTimeout 100 s + "
            f"{start_clocks.COLD_COMPILE_S} s for a cold compile cache): vLLM was {phase}") in err, err
    if last is not None and last != "Capturing CUDA graphs":
        assert f"(its last step: {last}" in err, err


# --- the smoke request's bound ------------------------------------------------------------------

def test_the_smoke_request_waits_vllms_own_per_step_limit_and_a_margin(tmp_path: Path) -> None:
    assert start_clocks.smoke_timeout(duo()) == 300 + start_clocks.SMOKE_MARGIN_S > 120  # the old fixed bound
    assert start_clocks.smoke_timeout(duo(env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "20"})) == 80
    (tmp_path / "exec-rc").write_text("3")  # the probe: serving, no answer within the bound
    out = run_with_fake_docker(ray_backend.vllm_start_script(duo()), tmp=tmp_path, check=False,
                               stdin=c.vllm_stdin(None))
    assert out["exec"][-2:] == ["smoke", "360"]
    assert ("FAILED: the smoke request got no answer within 360 s (vLLM's own per-step limit, "
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS 300 s, and 60 s)") in out["_stderr"][0]


def test_the_probe_keeps_a_slow_first_answer_within_its_bound(tmp_path: Path) -> None:
    """The probe's smoke request, against a server whose first answer takes longer than the
    old bound scaled down (0.4 x the per-step limit) but within the derived one: answered."""
    import http.server
    import threading

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(1.5)
            body = b'{"choices": [{"message": {"content": "late"}, "finish_reason": "stop"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        limit = 2  # a per-step limit of 2 s: the old bound's equivalent is 0.8 s
        spec = duo(env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(limit)})
        probe = c.script_text("vllm_probe.py")
        port = str(server.server_address[1])
        done = subprocess.run(["python3", "-", "127.0.0.1", port, "q", "smoke",
                               str(start_clocks.smoke_timeout(spec))], input=probe, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0 and "smoke request answered: 'late'" in done.stdout, done
        old = subprocess.run(["python3", "-", "127.0.0.1", port, "q", "smoke", str(0.4 * limit)],
                             input=probe, capture_output=True, text=True, timeout=30)
        assert old.returncode == 3  # what the fixed bound did to a slow first answer
    finally:
        server.shutdown()


# --- native: the rendezvous clock and the ranks kept while rank 0 loads --------------------------

def test_a_join_timeout_above_torchs_default_is_passed_to_every_rank() -> None:
    for join, flag in ((300, None), (600, None), (601, "601"), (3600, "3600")):
        spec = nspec(joinTimeout=join)
        for argv in (native.leader_run_argv(spec), native.rank_run_argv(spec, spec.nodes[1])):
            got = (argv[argv.index("--distributed-timeout-seconds") + 1]
                   if "--distributed-timeout-seconds" in argv else None)
            assert got == flag, (join, argv)
    nspec(vllmArgs=["--distributed-timeout-seconds", "900"])  # the operator's, below 600
    with pytest.raises(SpecError, match=r"vllmArgs\[0\]: --distributed-timeout-seconds is set by "
                                        r"the program from joinTimeout \(900 s, above torch's "
                                        r"600 s\)"):
        nspec(joinTimeout=900, vllmArgs=["--distributed_timeout_seconds=900"])


def test_a_headless_rank_lost_while_rank_0_loads_is_named_within_a_second(tmp_path: Path) -> None:
    spec = nspec(compileCache=str(tmp_path / "cc"))
    worker = spec.nodes[1]
    port = f"{spec.master_port:04X}"
    head, n2 = native._hex4(spec.head.identity_ip), native._hex4(worker.identity_ip)
    tcp, tcp6 = tmp_path / "tcp", tmp_path / "tcp6"
    tcp.write_text(HEADER + f"   1: {head}:{port} {n2}:9A3C 01 0 0 0 0 0 0\n")
    tcp6.write_text(HEADER)
    script = native.leader_start_script(spec).replace("/proc/net/tcp /proc/net/tcp6",
                                                      f"{tcp} {tcp6}")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "bin" / "docker").chmod(0o755)
    (tmp_path / "exec-hangs").touch()  # rank 0 loads
    proc = subprocess.Popen(
        ["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
             "FAKE": str(tmp_path), "HOME": str(tmp_path)})
    assert proc.stdin is not None
    proc.stdin.write(c.vllm_stdin(None))
    proc.stdin.close()
    for _ in range(100):
        if (tmp_path / "exec.pid").exists():
            break
        time.sleep(0.05)
    time.sleep(1.0)
    assert proc.poll() is None  # joined, loading: nothing to say
    # the headless rank dies: its kernel closes the connection, rank 0's side is CLOSE_WAIT
    tcp.write_text(HEADER + f"   1: {head}:{port} {n2}:9A3C 08 0 0 0 0 0 0\n")
    t0 = time.monotonic()
    proc.wait(timeout=10)
    took = time.monotonic() - t0
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.returncode == 1 and took < 1.5, (took, err)
    assert (f"FAILED: the ranks on node-2 ({worker.identity_ip}) lost their connection to rank 0 "
            f"at {spec.head.identity_ip}:{spec.master_port} while it was loading; vLLM was "
            "starting") in err, err
