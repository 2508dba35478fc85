"""V2 mode (vLLM 0.33.0), no Ray needed: the real parser's rules and the real auth scope.

Parser: vllm/utils/argparse_utils.py:313-504 (FlexibleArgumentParser) over the flag table
extracted from the 0.33.0 source. Auth: vllm/entrypoints/serve/middleware/authenticate.py:11-62;
/invocations and /ping: vllm/entrypoints/serve/sagemaker/api_router.py:91-140.
A world-size-1 server without --distributed-executor-backend runs without Ray (vLLM's `uni`).
"""

import subprocess
from pathlib import Path

import pytest
import requests
import vllm_sim  # noqa: F401  (installed by make test)
from vllm_sim.cli import build_parser_v2
from vllm_sim.serve_flags import flexible_argv, load_flag_table
from vsim_harness import LEGACY, V2, Serve, clean_env, exe, start_serve

API_KEY = "v2-key-51c0"
OTHER_KEY = "v2-key-second"


def vllm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe("vllm"), *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=clean_env(**(env if env is not None else V2)),
    )


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser_v2().parse_args(flexible_argv(["serve", *argv]))


# --- parser --------------------------------------------------------------------------------


def test_flag_table_is_the_real_one():
    opts = {o for row, _ in load_flag_table() for o in row}
    # A few flags of 0.33.0 from different sources (make_arg_parser, FrontendArgs, EngineArgs,
    # AsyncEngineArgs), with their aliases and BooleanOptionalAction negations.
    for flag in ("--headless", "--api-key", "--host", "--tensor-parallel-size", "-tp",
                 "--distributed-executor-backend", "--enforce-eager", "--no-enforce-eager",
                 "--enable-log-requests", "--no-enable-log-requests", "--served-model-name"):
        assert flag in opts, flag
    assert len(opts) > 300
    assert "--bogus" not in opts


def test_unknown_flag_exits_2_with_argparse_error():
    done = vllm("serve", "m", "--bogus-flag", "1")
    assert done.returncode == 2
    assert "error: unrecognized arguments: --bogus-flag 1" in done.stderr
    assert "Route:" not in done.stdout


def test_legacy_mode_still_accepts_unknown_flags():
    # Legacy keeps its permissive parser: the same argv gets past parsing (then fails to bind
    # nothing, so give it a model and a refused backend to end quickly).
    done = vllm("serve", "m", "--bogus-flag", "1", "-tp", "2",
                "--distributed-executor-backend", "mp", env=LEGACY)
    assert done.returncode == 1
    assert "simulates only the Ray executor" in done.stdout


@pytest.mark.parametrize(
    "spelling",
    [["--tensor-parallel-size", "2"], ["--tensor_parallel_size", "2"],
     ["--tensor-parallel", "2"], ["--tensor_parallel", "2"], ["--tensor-parallel-size=2"],
     ["--tensor_parallel=2"], ["-tp", "2"]],
)
def test_tp_spellings_vllm_accepts(spelling):
    assert parse("m", *spelling).tensor_parallel_size == 2


@pytest.mark.parametrize("spelling", [["--tensor_parallel_size", "2"], ["--tensor-parallel", "2"]])
def test_tp_spellings_reach_the_engine(spelling):
    # The process reads TP=2: with the mp backend it refuses a world of 2 on a one-GPU node.
    done = vllm("serve", "m", *spelling, "--distributed-executor-backend", "mp")
    assert done.returncode == 1, done.stderr
    assert "world_size=2" in done.stdout


def test_prefix_rules_of_argparse():
    a = parse("m", "--api_k", "k1", "k2", "--served", "name", "--max-model", "32k")
    assert (a.api_key, a.served_model_name, a.max_model_len) == (["k1", "k2"], ["name"], "32k")
    done = vllm("serve", "m", "--api", "k")  # --api-key or --api-server-count
    assert done.returncode == 2
    assert "ambiguous option: --api could match" in done.stderr


def test_model_flag_moves_to_the_front_and_dotted_keys_become_json():
    a = parse("--model", "x", "-tp", "2", "--compilation_config.mode", "3", "-O3",
              "--no-enable-prefix-caching")
    assert (a.model_tag, a.tensor_parallel_size) == ("x", 2)
    assert a.compilation_config == '{"mode": 3}'
    assert a.optimization_level == "3"
    assert a.enable_prefix_caching is False


def test_served_model_name_without_positional_model_is_refused():
    done = vllm("serve", "--served-model-name", "q", "m")
    assert done.returncode == 1
    assert "`model` should be provided as the first positional argument" in done.stdout


def test_help_is_the_real_flag_list_after_the_banner():
    done = vllm("serve", "--help")
    assert done.returncode == 0
    assert done.stdout.splitlines()[0].startswith("vllm-sim: a SIMULATOR")
    assert "--enable-log-requests, --no-enable-log-requests" in done.stdout


# --- routes and auth -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    logs: Path = tmp_path_factory.mktemp("v2-http")
    s = start_serve(None, "m", ["--api-key", API_KEY, OTHER_KEY], dict(V2), logs)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "via invocations"}]}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT),
     ("POST", "/v1/completions", {"model": "m", "prompt": "x"}), ("GET", "/v2/anything", None),
     ("POST", "/inference/v1/generate", {}), ("POST", "/cohere/v2/chat", {})],
)
def test_guarded_prefixes_need_the_key(server: Serve, method, path, body):
    r = requests.request(method, f"{server.url}{path}", json=body, timeout=10)
    assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
    wrong = {"Authorization": "Bearer nope"}
    assert requests.request(method, f"{server.url}{path}", json=body, headers=wrong,
                            timeout=10).status_code == 401


@pytest.mark.parametrize("key", [API_KEY, OTHER_KEY])
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_any_key_any_scheme_case(server: Serve, key, scheme):
    r = requests.get(f"{server.url}/v1/models", headers={"Authorization": f"{scheme} {key}"},
                     timeout=10)
    assert r.status_code == 200


def test_open_routes(server: Serve):
    for method, path in (("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"),
                         ("GET", "/metrics"), ("GET", "/load"), ("GET", "/sim/ranks")):
        r = requests.request(method, f"{server.url}{path}", timeout=10)
        assert r.status_code == 200, (method, path)
    assert requests.get(f"{server.url}/version", timeout=10).json() == {"version": "0.33.0"}
    assert requests.options(f"{server.url}/v1/models", timeout=10).status_code != 401


def test_invocations_serves_inference_without_a_key(server: Serve):
    r = requests.post(f"{server.url}/invocations", json=CHAT, timeout=10)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"].endswith("you said: via invocations")
    r = requests.post(f"{server.url}/invocations", json={"model": "m", "prompt": "p"}, timeout=10)
    assert r.status_code == 200
    assert r.json()["object"] == "text_completion"
    r = requests.post(f"{server.url}/invocations", json={"neither": 1}, timeout=10)
    assert r.status_code == 400


def test_keys_never_logged(server: Serve):
    out = server.output()
    assert API_KEY not in out and OTHER_KEY not in out
    assert "Route: /invocations, Methods: POST" in out


# --- --middleware, as the program uses it (components/scripts/spark_vllm_auth.py) ------------

SCRIPTS = Path(__file__).resolve().parents[2] / "components" / "scripts"


@pytest.mark.parametrize("mode", [V2, LEGACY], ids=["0.33.0", "0.17.1"])
def test_middleware_is_imported_and_wraps_every_route(mode, tmp_path):
    """vLLM imports `--middleware MODULE.NAME` and adds a class with app.add_middleware
    (serve/middleware/register.py:66-74): the program's key check then covers /invocations."""
    env = {**mode, "VLLM_API_KEY": API_KEY, "PYTHONPATH": str(SCRIPTS)}
    s = start_serve(None, "m", ["--middleware", "spark_vllm_auth.RequireApiKey"], env, tmp_path)
    try:
        s.wait_ready()
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        paths = ["/v1/chat/completions"] + (["/invocations"] if mode is V2 else [])
        for path in paths:
            assert requests.post(s.url + path, json=chat, timeout=10).status_code == 401, path
            ok = requests.post(s.url + path, json=chat, timeout=10,
                               headers={"Authorization": f"Bearer {API_KEY}"})
            assert ok.status_code == 200, path
        assert requests.get(s.url + "/health", timeout=10).status_code == 200
    finally:
        s.stop()


def test_a_middleware_that_cannot_be_imported_ends_the_server(tmp_path):
    s = start_serve(None, "m", ["--middleware", "no_such_module.Thing"], dict(V2), tmp_path)
    try:
        assert s.wait_exit(30) != 0
        assert "No module named 'no_such_module'" in s.output()
    finally:
        s.stop()
