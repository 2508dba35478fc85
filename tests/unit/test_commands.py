"""Pure builders: spec → exact argv and scripts; quoting that survives a real shell."""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_vllm.components.render import cache_commands, preflight_commands, start_clocks
from spark_vllm.components.render import commands as c
from spark_vllm.components.render.backends import ray as ray_backend
from tests.unit.harness import fake_rsync, lab_nodes, spec_from

ROOT = Path(__file__).resolve().parents[2]


def duo(**top: object) -> c.ClusterSpec:
    nodes = [
        {"name": "spark-a", "host": "10.1.230.180", "user": "aurora", "fabricIp": "192.168.200.12",
         "fabricInterface": "enp1s0f1np1", "ibHca": "rocep1s0f1"},
        {"name": "spark-b", "host": "10.1.230.181", "user": "aurora", "fabricIp": "192.168.200.13",
         "fabricInterface": "enP2p1s0f1np1", "ibHca": "roceP2p1s0f1"},
    ]
    top = {"env": {"NCCL_DEBUG": "WARN"}, "vllmArgs": ["--max-model-len", "32768"], **top}
    return spec_from(nodes, stack="duo", image="img:1", model="Qwen/Q", **top)


def test_head_docker_run_argv_exact() -> None:
    assert ray_backend.head_run_argv(duo()) == [
        "docker", "run", "--detach", "--name", "spark-vllm-duo-ray-head",
        "--label", "spark-vllm.stack=duo", "--label", "spark-vllm.role=ray-head",
        "--label", "spark-vllm.node=spark-a", "--label", "spark-vllm.identity=192.168.200.12",
        "--network", "host", "--ipc", "host", "--shm-size", "10.24g", "--gpus", "all",
        "--volume", "/root/.cache/huggingface:/root/.cache/huggingface",
        # the node's compile caches: beside hfCache by default, one directory per stack
        "--volume", "/root/.cache/spark-vllm-compile/duo:/spark-vllm-cache",
        "--volume", "/tmp/ray",
        # Ray's memory monitor off, its health checks as patient as vLLM's per-step limit
        "--env", "RAY_memory_monitor_refresh_ms=0", "--env", "RAY_health_check_timeout_ms=60000",
        "--env-file", "ray-head.env",
        "--env", "RAY_USAGE_STATS_ENABLED=0", "--env", "NCCL_DEBUG=WARN",
        "--env", "VLLM_HOST_IP=192.168.200.12", "--env", "VLLM_RPC_BASE_PATH=/tmp/ray",
        "--env", "HF_HUB_OFFLINE=1",  # modelStaging (default download): weights are staged
        "--env", "NCCL_SOCKET_IFNAME=enp1s0f1np1", "--env", "GLOO_SOCKET_IFNAME=enp1s0f1np1",
        "--env", "TP_SOCKET_IFNAME=enp1s0f1np1", "--env", "UCX_NET_DEVICES=enp1s0f1np1",
        "--env", "NCCL_IB_HCA=rocep1s0f1",
        "--env", "VLLM_CACHE_ROOT=/spark-vllm-cache/vllm",
        "--env", "TRITON_CACHE_DIR=/spark-vllm-cache/triton",
        "--env", "TORCHINDUCTOR_CACHE_DIR=/spark-vllm-cache/inductor",
        "--env", "FLASHINFER_WORKSPACE_BASE=/spark-vllm-cache/flashinfer",
        "--env", "CUDA_CACHE_PATH=/spark-vllm-cache/nv",
        "--env", "TORCH_EXTENSIONS_DIR=/spark-vllm-cache/torch_extensions",
        "--entrypoint", "ray", "img:1",
        "start", "--head", "--node-ip-address=192.168.200.12", "--port=6379", "--num-gpus=1",
        "--block",
    ]


def test_compile_cache_is_a_path_none_or_beside_hf_cache_and_owns_its_env() -> None:
    assert duo(compileCache="/data/cc").compile_cache_dir == "/data/cc/duo"
    assert duo(hfCache="/data/hf").compile_cache_dir == "/data/spark-vllm-compile/duo"
    off = duo(compileCache="none")
    assert off.compile_cache_dir is None
    argv = ray_backend.head_run_argv(off)
    assert not any("spark-vllm-cache" in a for a in argv)
    assert "VLLM_CACHE_ROOT" not in c.node_env(off, off.head)
    # with the cache on, VLLM_CACHE_ROOT is the program's; with it off, the user's
    with pytest.raises(ValueError, match=r"env\.VLLM_CACHE_ROOT: set by the program"):
        duo(env={"VLLM_CACHE_ROOT": "/x"})
    assert duo(compileCache="none", env={"VLLM_CACHE_ROOT": "/x"}).user_env["VLLM_CACHE_ROOT"] == "/x"
    with pytest.raises(ValueError, match="compileCache"):
        duo(compileCache="relative/dir")


def test_a_ray_container_clears_a_cache_made_with_another_image_and_only_then(
        tmp_path: Path) -> None:
    """The start script's cache lines run against a fake docker: the stamp decides."""
    spec = duo(compileCache=str(tmp_path / "cc"))
    cache = tmp_path / "cc" / "duo"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> {calls}\n"
        'case "$1 $2" in "image inspect") echo "sha256:$IMG";; esac\n'
        f'case "$*" in *"rm -rf"*) rm -rf {cache}/vllm;; esac\n')
    (bin_dir / "docker").chmod(0o755)
    script = "\n".join(["set -eu", 'log() { echo "$*" >&2; }',
                        'fail() { echo "FAILED: $*" >&2; exit 1; }',
                        *cache_commands.cache_lines(spec, spec.head)]) + "\n"

    def run(img: str) -> str:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IMG": img}
        r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stderr

    run("a")  # empty: nothing to clear, the stamp written
    assert (cache / ".spark-vllm-image").read_text().strip() == "sha256:a"
    (cache / "vllm" / "torch_compile_cache" / "k" / "rank_0_0").mkdir(parents=True)
    out = run("a")  # same image: kept
    assert "clearing" not in out and (cache / "vllm").exists() and "1 compiled rank dirs" in out
    out = run("b")  # another image: cleared through a container, the stamp updated
    assert "clearing it for sha256:b" in out and not (cache / "vllm").exists()
    assert (cache / ".spark-vllm-image").read_text().strip() == "sha256:b"
    assert "--volume " + str(cache) + ":/spark-vllm-cache" in calls.read_text()


def test_worker_uses_its_own_identity_and_interfaces_and_joins_the_head() -> None:
    spec = duo()
    argv = ray_backend.worker_run_argv(spec, spec.nodes[1])
    env = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
    assert "VLLM_HOST_IP=192.168.200.13" in env
    assert "NCCL_SOCKET_IFNAME=enP2p1s0f1np1" in env and "NCCL_IB_HCA=roceP2p1s0f1" in env
    assert not any("enp1s0f1np1" in e or "rocep1s0f1" in e for e in env)  # nothing of the head's
    assert argv[-5:] == ["start", "--address=192.168.200.12:6379",
                         "--node-ip-address=192.168.200.13", "--num-gpus=1", "--block"]


def test_no_container_has_a_restart_policy() -> None:
    """Docker must not revive a container on its own (a repair goes through the engine, in
    order): a worker back alone joins a Ray cluster whose vLLM ranks died, vLLM looping on the
    GPU can wedge a Spark."""
    spec = duo()
    for argv in (ray_backend.head_run_argv(spec), ray_backend.worker_run_argv(spec, spec.nodes[1]),
                 ray_backend.vllm_run_argv(spec)):
        assert not any(a.startswith("--restart") for a in argv), argv


def test_vllm_serve_argv_exact_and_key_free() -> None:
    spec = duo(servedModelName="qwen", port=8001)
    argv = ray_backend.vllm_run_argv(spec)
    tail = argv[argv.index("--entrypoint"):]
    assert tail[:6] == ["--entrypoint", "sh", "img:1", "-c", c._VLLM_ENTRY_SH, "vllm"]
    assert tail[6:] == ["serve", "Qwen/Q",
                        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
                        "--distributed-executor-backend", "ray", "--host", "0.0.0.0",
                        "--port", "8001", "--served-model-name", "qwen",
                        "--middleware", "spark_vllm_auth.RequireApiKey",
                        "--max-model-len", "32768"]
    # a Ray driver on the head: the head's PID namespace (raylet lookup) and /tmp/ray
    assert argv[argv.index("--pid") + 1] == "container:spark-vllm-duo-ray-head"
    assert argv[argv.index("--volumes-from") + 1] == "spark-vllm-duo-ray-head"
    assert "RAY_ADDRESS=192.168.200.12:6379" in argv
    assert "VLLM_RPC_BASE_PATH=/tmp/ray" in argv  # the ipc:// sockets its local ranks share
    assert "--api-key" not in argv and not any("API_KEY=" in a for a in argv)
    assert "VLLM_CONFIG_ROOT=/tmp/ray/spark-vllm" in argv  # the head's shared dir


def test_vllm_entrypoint_puts_its_config_root_on_pythonpath_then_becomes_vllm(
        tmp_path: Path) -> None:
    """vLLM imports the middleware from VLLM_CONFIG_ROOT (before the image's own PYTHONPATH)
    and is exec'd with the serve args unchanged."""
    spec = duo(vllmArgs=["--chat-template", "{{ x }} 'q' $HOME"])
    argv = ray_backend.vllm_run_argv(spec)
    after_image = argv[argv.index("img:1") + 1:]
    (tmp_path / "vllm").write_text('#!/bin/sh\nprintf "%s\\n" "$$" "$PYTHONPATH" "$@" > "$OUT"\n')
    (tmp_path / "vllm").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "OUT": str(tmp_path / "args"),
           "VLLM_CONFIG_ROOT": "/tmp/ray/spark-vllm", "PYTHONPATH": "/opt/image-path"}
    proc = subprocess.Popen(["sh", *after_image], env=env)
    assert proc.wait(timeout=10) == 0
    pid, pythonpath, *args = (tmp_path / "args").read_text().splitlines()
    assert int(pid) == proc.pid  # exec: vLLM is the container's process, signals reach it
    assert pythonpath == "/tmp/ray/spark-vllm:/opt/image-path"
    assert args == c.vllm_serve_args(spec, ray_backend.EXECUTOR)


def test_no_gpu_flag_in_the_lab() -> None:
    spec = duo(dockerGpus="none")
    assert "--gpus" not in ray_backend.head_run_argv(spec)


def test_secret_env_file_roles() -> None:
    body = c.secret_env_file(c.VLLM, "t")
    assert "HF_TOKEN=t\n" in body and "VLLM_API_KEY" not in body  # the key has its own file
    assert c.secret_env_file(c.WORKER, None).startswith("# ")
    with pytest.raises(ValueError):
        c.secret_env_file(c.VLLM, "two\nlines")


@pytest.mark.parametrize("script", ["preflight", "start-head", "start-worker", "start-vllm",
                                    "remove", "gate"])
def test_scripts_parse_as_posix_sh(script: str) -> None:
    spec = duo()
    text = {
        "preflight": lambda: preflight_commands.preflight_script(spec, spec.nodes[1]),
        "start-head": lambda: ray_backend.head_start_script(spec),
        "start-worker": lambda: ray_backend.worker_start_script(spec, spec.nodes[1]),
        "start-vllm": lambda: ray_backend.vllm_start_script(spec),
        "remove": lambda: c.remove_script(spec, spec.head, c.HEAD),
        "gate": lambda: ray_backend.gate_script(spec, ['{"node": "spark-a"}']),
    }[script]()
    subprocess.run(["sh", "-n"], input=text, text=True, check=True)
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_preflight_summary_is_json(tmp_path: Path) -> None:
    """The preflight's last line is parsed by the gate and exported: it must be valid JSON."""
    spec = duo()
    line = preflight_commands.preflight_script(spec, spec.nodes[1]).strip().splitlines()[-1]
    script = ('node=spark-b; docker_v=20.10; gpus=1; image_id=sha256:ab; '
              'set -- 2.60.0 3.11.2 0.33.0\n' + line)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"node": "spark-b", "identity": "192.168.200.13", "docker": "20.10",
                               "gpus": "1", "image_id": "sha256:ab", "ray": "2.60.0",
                               "python": "3.11.2", "vllm": "0.33.0"}


def test_gate_program_travels_on_stdin_not_in_the_command() -> None:
    """A failed remote command is quoted whole in Pulumi's error: the gate's command must stay
    a few lines, so its expected-vs-seen table is what the operator reads."""
    spec = duo()
    text = ray_backend.gate_script(spec, [])
    assert len(text.splitlines()) <= 6 and "import" not in text


def test_preflight_reads_image_versions_once_per_image_id(tmp_path: Path) -> None:
    """The Ray/Python read starts a container (~1 s of CPU a node): kept per image id."""
    spec = spec_from([{"name": "local", "host": "127.0.0.1"}], image="img:1", model="org/m",
                     checkGpu=False, imagePull="never")
    script = preflight_commands.preflight_script(spec, spec.head)
    first = run_with_fake_docker(script, tmp=tmp_path)
    summary = json.loads(first["_stdout"][0])
    assert (summary["ray"], summary["python"], summary["vllm"], summary["image_id"]) == (
        "2.60.0", "3.11.7", "0.33.0", "sha256:feedface")
    cache = tmp_path / ".spark-vllm" / "image-versions" / "feedface"
    assert cache.read_text() == "2.60.0 3.11.7 0.33.0\n"
    runs = (tmp_path / "calls.run").read_bytes().count(b"--entrypoint")
    assert runs == 1
    second = run_with_fake_docker(script, tmp=tmp_path)
    assert json.loads(second["_stdout"][0]) == summary
    assert (tmp_path / "calls.run").read_bytes().count(b"--entrypoint") == 1  # no new container
    cache.write_text("garbage\n")  # a torn or foreign file is read again, not trusted
    third = run_with_fake_docker(script, tmp=tmp_path)
    assert json.loads(third["_stdout"][0]) == summary
    assert (tmp_path / "calls.run").read_bytes().count(b"--entrypoint") == 2
    assert cache.read_text() == "2.60.0 3.11.7 0.33.0\n"


def test_gate_payload_carries_expected_table() -> None:
    spec = spec_from(lab_nodes(4), tensorParallelSize=2, pipelineParallelSize=2, rayTimeout=30)
    text = ray_backend.gate_script(spec, [])
    payload = json.loads(shlex.split(text.split("python3 - ", 1)[1])[0])
    assert payload["timeout"] == 30
    assert payload["address"] == "192.168.231.11:6379"  # the head's identity, never "auto"
    assert payload["expected"] == [{"name": f"node-{i}", "ip": f"192.168.231.{10 + i}", "gpus": 1}
                                   for i in range(1, 5)]
    assert "timeout 60 docker exec -i spark-vllm-test-ray-head" in text


# --- quoting: odd but valid values reach the program literally through a real shell ---------

odd_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from(
    list(" '\"$`\\!*?;&|<>(){}[]#~=%")), min_size=1, max_size=30)


def shell_argv(argv: list[str]) -> list[str]:
    """What a POSIX shell passes to the program when it runs shlex.join(argv)."""
    script = f"set -- {shlex.join(argv)}\nprintf '%s\\0' \"$@\""
    out = subprocess.run(["sh", "-c", script], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


@settings(max_examples=60, deadline=None)
# a value starting with "-" would be read as a flag by vLLM's parser (and is refused as one)
@given(value=odd_text, arg=odd_text.filter(lambda t: not t.startswith("-")))
def test_env_values_and_vllm_args_survive_the_shell(value: str, arg: str) -> None:
    spec = duo(env={"ODD": value}, vllmArgs=["--chat-template", arg])
    for argv in (ray_backend.head_run_argv(spec), ray_backend.vllm_run_argv(spec)):
        assert shell_argv(argv) == argv
    assert shell_argv(ray_backend.vllm_run_argv(spec))[-2:] == ["--chat-template", arg]
    assert f"ODD={value}" in shell_argv(ray_backend.head_run_argv(spec))


@settings(max_examples=30, deadline=None)
@given(value=odd_text)
def test_start_script_embeds_the_argv_literally(value: str) -> None:
    """Run the real start script with `docker` replaced by a recorder: the recorded argv of
    `docker run` must equal the built argv, whatever the env value holds."""
    spec = duo(env={"ODD": value}, rayPort=free_port())
    argv = ray_backend.head_run_argv(spec)
    recorded = run_with_fake_docker(c.start_script(spec, spec.head, c.HEAD, argv))
    assert ["docker", "run", *recorded["run"]] == argv


# --- the scripts' behaviour, with a fake docker on PATH --------------------------------------

FAKE_DOCKER = r"""#!/bin/sh
# records each call NUL-separated in $FAKE/calls.<sub>; answers like a healthy docker
sub=$1
printf '%s\0' "$@" > "$FAKE/calls.$sub.$$"; cat "$FAKE/calls.$sub.$$" >> "$FAKE/calls.$sub"
case "$sub" in
  run) case " $* " in *" --entrypoint python3 "*) echo "2.60.0 3.11.7 0.33.0" ;;
       *" --head "*) # Ray's GCS: listen on --port=N (stopped by run_with_fake_docker)
          port=$(printf '%s\n' "$@" | sed -n 's/^--port=//p')
          python3 -c "$LISTEN" "$port" "$FAKE/listener.pid" >/dev/null 2>&1 &
          while [ ! -s "$FAKE/listener.pid" ]; do sleep 0.02; done
          echo 0123456789abcdef0123456789abcdef ;;
       *) echo 0123456789abcdef0123456789abcdef ;; esac ;;
  version) echo 20.10.24 ;;
  exec) case " $* " in *" placement "*)  # the Ray placement check: what the test says Ray says
          cat "$FAKE/placement-said" 2>/dev/null; exit "$(cat "$FAKE/placement-rc" 2>/dev/null || echo 1)" ;; esac
        cat > "$FAKE/exec.stdin.$$"; cat "$FAKE/exec.stdin.$$" >> "$FAKE/exec.stdin"
        [ -e "$FAKE/exec-sleep" ] && sleep "$(cat "$FAKE/exec-sleep")"
        [ -e "$FAKE/exec-hangs" ] && { echo $$ > "$FAKE/exec.pid"; exec sleep 60; }
        [ -e "$FAKE/exec-rc" ] && exit "$(cat "$FAKE/exec-rc")"; [ ! -e "$FAKE/exec-fails" ] ;;
  image) echo sha256:feedface ;;
  cp) rm -rf "$FAKE/copied"; cp -r "$2" "$FAKE/copied" ;;
  inspect) case "$*" in *State.ExitCode*) cat "$FAKE/exitcode" 2>/dev/null || echo 0 ;;
           *) cat "$FAKE/status" 2>/dev/null || echo running ;; esac ;;
  logs) cat "$FAKE/logs" 2>/dev/null || echo "Ray runtime started." ;;
  rm) [ -e "$FAKE/rm-fails" ] && { echo "Cannot connect to the Docker daemon" >&2; exit 1; }
      [ -e "$FAKE/gone" ] && { echo "Error: No such container: x" >&2; exit 1; }; exit 0 ;;
esac
"""


# A stand-in for the head's GCS socket: listen on the port, then write the pid (so `docker run`
# returns only once the port listens), for at most 30 s.
LISTEN = """
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(30)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_with_fake_docker(script: str, status: str = "running", gone: bool = False,
                         rm_fails: bool = False, tmp: Path | None = None,
                         check: bool = True, stdin: str = "HF_TOKEN=x\n") -> dict[str, list[str]]:
    import tempfile
    tmp = tmp or Path(tempfile.mkdtemp())
    (tmp / "bin").mkdir(exist_ok=True)
    docker = tmp / "bin" / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    fake_rsync(tmp / "bin")  # the preflight's staging check: rsync on PATH, host's or not
    (tmp / "status").write_text(status + "\n")
    if gone:
        (tmp / "gone").touch()
    if rm_fails:
        (tmp / "rm-fails").touch()
    env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "FAKE": str(tmp),
           "HOME": str(tmp), "LISTEN": LISTEN}
    try:
        proc = subprocess.run(["sh", "-c", script], input=stdin, capture_output=True,
                              text=True, env=env, timeout=30)
    finally:
        pid_file = tmp / "listener.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            pid_file.unlink()
    if check:
        assert proc.returncode == 0, proc.stderr
    calls = {}
    for f in tmp.glob("calls.*"):
        if f.name.count(".") == 1:
            calls[f.name.split(".", 1)[1]] = f.read_bytes().decode().split("\0")[1:-1]
    calls["_rc"] = [str(proc.returncode)]
    calls["_stdout"] = [proc.stdout]
    calls["_stderr"] = [proc.stderr]
    calls["_home"] = [str(tmp)]
    return calls


def test_start_head_writes_0600_env_file_prints_id_and_waits_for_its_gcs(tmp_path: Path) -> None:
    """The head is started once its GCS listens on rayPort (workers need no more), before
    `ray start` prints "Ray runtime started" (which the fake's log never does here)."""
    spec = duo(rayPort=free_port())
    (tmp_path / "logs").write_text("Local node IP: 192.168.200.12\n")
    out = run_with_fake_docker(ray_backend.head_start_script(spec),
                               tmp=tmp_path)
    assert out["_stdout"] == ["0123456789abcdef0123456789abcdef\n"]
    env_file = tmp_path / ".spark-vllm" / "duo" / "ray-head.env"
    assert env_file.read_text() == "HF_TOKEN=x\n"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert "ready: spark-vllm-duo-ray-head 0123456789ab" in out["_stderr"][0]


def test_only_waits_that_match_the_log_read_it() -> None:
    """The head polls /proc every 0.2 s: reading its log each round would be wasted docker
    calls; the worker and vLLM waits match their log (join, GCS, placement-group marks)."""
    spec = duo()
    read = 'logs=$(docker logs --tail 200 "$name"'
    assert read not in ray_backend.head_start_script(spec)
    assert read in ray_backend.worker_start_script(spec, spec.nodes[1])
    assert read in ray_backend.vllm_start_script(spec)


def test_start_head_refuses_a_ray_port_already_in_use(tmp_path: Path) -> None:
    """A Redis on 6379 would pass the GCS test while Ray's GCS fails to bind: named first."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        spec = duo(rayPort=other.getsockname()[1])
        out = run_with_fake_docker(ray_backend.head_start_script(spec),
                                   tmp=tmp_path, check=False)
    assert out["_rc"] == ["1"]
    assert (f"spark-a: ray-head: FAILED: port {spec.ray_port} (rayPort) is already in use on "
            "spark-a by a process outside this stack") in out["_stderr"][0]
    assert "run" not in out  # no container was started
    assert not (tmp_path / ".spark-vllm" / "duo").exists()


def test_start_failure_shows_logs_and_leaves_nothing(tmp_path: Path) -> None:
    spec = duo(rayPort=free_port())
    out = run_with_fake_docker(ray_backend.head_start_script(spec),
                               status="exited", tmp=tmp_path, check=False)
    assert out["_rc"] == ["1"]
    assert "FAILED: container is exited (exit code 0) before ready" in out["_stderr"][0]
    assert "    | Ray runtime started." in out["_stderr"][0]  # the log tail is shown
    assert not (tmp_path / ".spark-vllm" / "duo" / "ray-head.env").exists()
    rm_calls = (tmp_path / "calls.rm").read_bytes().decode().split("\0")
    assert rm_calls.count("spark-vllm-duo-ray-head") == 2  # leftover removal + cleanup


def test_start_vllm_splits_its_stdin_into_env_file_and_probe(tmp_path: Path) -> None:
    spec = duo(smokeTest=True)
    script = ray_backend.vllm_start_script(spec)
    assert "import" not in script  # the probe's Python is not inlined in the command
    out = run_with_fake_docker(script, tmp=tmp_path, stdin=c.vllm_stdin("hf-x"))
    state = tmp_path / ".spark-vllm" / "duo"
    assert (state / "vllm.env").read_text() == c.secret_env_file(c.VLLM, "hf-x")
    assert sorted(p.name for p in state.iterdir()) == ["vllm.env"]  # no probe file left
    probe = c.script_text("vllm_probe.py")
    # one `docker exec` waits for the whole load and sends the smoke request
    assert (tmp_path / "exec.stdin").read_text() == probe
    # the middleware and the non-carry-over list went to the head's shared dir, not argv
    copied = tmp_path / "copied"
    assert (copied / "spark_vllm_auth.py").read_text() == c.script_text("spark_vllm_auth.py")
    assert json.loads((copied / "ray_non_carry_over_env_vars.json").read_text()) == list(
        c.NON_CARRY_OVER_ENV)
    assert out["cp"][-1] == "spark-vllm-duo-ray-head:/tmp/ray/spark-vllm"
    # the start's bound: vllmTimeout and a cold compile cache (the fake node has no weights)
    assert out["exec"][-4:] == ["wait", str(spec.vllm_timeout + start_clocks.COLD_COMPILE_S), "smoke",
                                str(start_clocks.smoke_timeout(spec))]
    assert "ready: spark-vllm-duo-vllm" in out["_stderr"][0]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_an_interrupted_start_removes_what_it_started(tmp_path: Path, sig: int) -> None:
    """Ctrl-C twice or a lost connection ends the pulumi run while vLLM loads: the script, still
    running on the node, must not leave a container the state does not know of, nor its probe
    (a `docker exec` that would wait for the whole vllmTimeout)."""
    spec = duo(smokeTest=True)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "bin" / "docker").chmod(0o755)
    (tmp_path / "exec-hangs").touch()
    script = ray_backend.vllm_start_script(spec)
    proc = subprocess.Popen(
        ["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
             "FAKE": str(tmp_path), "HOME": str(tmp_path)},
        # as sshd starts it: a shell that finds SIGHUP ignored (under nohup) cannot trap it
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert proc.stdin is not None
    proc.stdin.write(c.vllm_stdin("hf-x"))
    proc.stdin.close()
    # the probe runs: vLLM is "loading" (the script first reads the node: the start's bound;
    # on a busy machine that took more than 5 s)
    deadline = time.monotonic() + 30
    while not (tmp_path / "exec.pid").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the probe never started"
        time.sleep(0.05)
    time.sleep(0.1)  # the fake has written its pid: let it finish the line
    probe_pid = int((tmp_path / "exec.pid").read_text())
    t0 = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(timeout=10)
    took = time.monotonic() - t0
    assert rc == 1 and took < 2, (rc, took)
    rm = (tmp_path / "calls.rm").read_bytes().decode().split("\0")
    assert rm[-4:-1] == ["--force", "--volumes", "spark-vllm-duo-vllm"], rm  # after the run
    with pytest.raises(ProcessLookupError):
        os.kill(probe_pid, 0)
    assert not (tmp_path / ".spark-vllm" / "duo").exists()  # env-file, probe, files: gone


def test_a_failed_smoke_request_fails_the_start_and_leaves_nothing(tmp_path: Path) -> None:
    spec = duo(smokeTest=True)
    (tmp_path / "exec-rc").write_text("2")  # the probe: serving, but the chat failed
    script = ray_backend.vllm_start_script(spec)
    out = run_with_fake_docker(script, tmp=tmp_path, check=False, stdin=c.vllm_stdin(None))
    assert out["_rc"] == ["1"] and "FAILED: smoke request failed" in out["_stderr"][0]
    assert not (tmp_path / ".spark-vllm" / "duo").exists()
    assert "spark-vllm-duo-vllm" in out["rm"]


def test_failed_vllm_start_leaves_no_state_dir(tmp_path: Path) -> None:
    spec = duo()
    script = ray_backend.vllm_start_script(spec)
    out = run_with_fake_docker(script, status="exited", tmp=tmp_path, check=False,
                               stdin=c.vllm_stdin(None))
    assert out["_rc"] == ["1"] and "FAILED: container is exited" in out["_stderr"][0]
    assert not (tmp_path / ".spark-vllm" / "duo").exists()


def closed_port() -> int:
    """A loopback port nothing listens on (a connect is refused at once)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def loopback_duo(port: int) -> c.ClusterSpec:
    """A head whose identity is 127.0.0.1 and whose rayPort is `port`: the worker's check of
    the GCS port reaches this machine, not a real fabric."""
    return spec_from([{"name": "spark-a", "host": "127.0.0.1"},
                      {"name": "spark-b", "host": "10.1.230.181", "fabricIp": "192.168.200.13",
                       "fabricInterface": "enp1s0f1np1"}],
                     stack="duo", image="img:1", model="Qwen/Q", rayPort=port)


def silent_port() -> tuple[socket.socket, list[socket.socket]]:
    """A loopback port whose SYNs go unanswered, as a cut fabric's: a listener that never
    accepts, its accept queue filled (Linux then drops new SYNs; a connect times out)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        s = socket.socket()
        s.settimeout(0.3)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            break
        fillers.append(s)
    return listener, fillers


def gcs_line(port: int) -> str:
    return ("Local node IP: 192.168.200.13\n[W rpc_client.h:153] Failed to connect to GCS at "
            f"address 127.0.0.1:{port} within 5 seconds.\n")


def test_worker_waits_to_join_and_names_an_unreachable_head(tmp_path: Path) -> None:
    """`ray start`'s GCS line, then a GCS port that gives no answer to two connects 3 s apart:
    the path is named (fabric, routes, firewall) with the connect's own outcome."""
    listener, fillers = silent_port()
    port = listener.getsockname()[1]
    try:
        spec = loopback_duo(port)
        script = ray_backend.worker_start_script(spec, spec.nodes[1])
        (tmp_path / "ok").mkdir()
        joined = run_with_fake_docker(script, tmp=tmp_path / "ok")
        assert "ready: spark-vllm-duo-ray-worker" in joined["_stderr"][0]
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "logs").write_text(gcs_line(port))
        out = run_with_fake_docker(script, tmp=tmp_path / "bad", check=False)
    finally:
        for s in (listener, *fillers):
            s.close()
    assert out["_rc"] == ["1"]
    err = out["_stderr"][0]
    assert ("did not take a TCP connect from this node (no answer within 2 s): trying again "
            "in 3 s") in err
    assert ("spark-b: ray-worker: FAILED: cannot reach the Ray head spark-a at "
            f"127.0.0.1:{port} from 192.168.200.13 (a TCP connect from this node, 2 times 3 s "
            "apart: no answer within 2 s): check the fabric link") in err
    assert "    | [W rpc_client.h:153] Failed to connect to GCS" in err
    assert not (tmp_path / "bad" / ".spark-vllm" / "duo" / "ray-worker.env").exists()


def test_a_worker_names_a_head_whose_ray_stopped(tmp_path: Path) -> None:
    """The head's address answers and nothing listens on its GCS port (refused, twice): the
    head's Ray stopped after its command returned; the fabric is not blamed."""
    port = closed_port()
    spec = loopback_duo(port)
    script = ray_backend.worker_start_script(spec, spec.nodes[1])
    (tmp_path / "logs").write_text(gcs_line(port))
    out = run_with_fake_docker(script, tmp=tmp_path, check=False)
    assert out["_rc"] == ["1"]
    err = out["_stderr"][0]
    assert (f"FAILED: the Ray head spark-a at 127.0.0.1:{port} refused this worker's connection "
            "2 times, 3 s apart: nothing listens on its GCS port") in err
    assert "head's Ray stopped since (its log says why: spark-vllm status)" in err
    assert "check the fabric" not in err


def test_a_worker_whose_ray_exited_names_the_unreachable_head(tmp_path: Path) -> None:
    """`ray start` gave up and exited before its GCS line (a CI run of the lab: its log said
    no more than the node's IP, 4 s after the start, on a cut fabric): one connect names the
    path, where the worker said only "container is exited before ready"."""
    listener, fillers = silent_port()
    port = listener.getsockname()[1]
    try:
        spec = loopback_duo(port)
        (tmp_path / "logs").write_text("Local node IP: 192.168.200.13\n")
        (tmp_path / "exitcode").write_text("1\n")
        out = run_with_fake_docker(ray_backend.worker_start_script(spec, spec.nodes[1]),
                                   status="exited", tmp=tmp_path, check=False)
    finally:
        for s in (listener, *fillers):
            s.close()
    assert out["_rc"] == ["1"]
    err = out["_stderr"][0]
    assert ("spark-b: ray-worker: FAILED: cannot reach the Ray head spark-a at "
            f"127.0.0.1:{port} from 192.168.200.13 (the worker's Ray exited; a TCP connect "
            "from this node: no answer within 2 s): check the fabric link") in err
    assert "    | Local node IP: 192.168.200.13" in err  # its log, shown
    assert not (tmp_path / ".spark-vllm" / "duo" / "ray-worker.env").exists()
    assert "spark-vllm-duo-ray-worker" in out["rm"]


def test_a_worker_whose_ray_exited_names_a_head_whose_ray_stopped(tmp_path: Path) -> None:
    port = closed_port()
    spec = loopback_duo(port)
    out = run_with_fake_docker(ray_backend.worker_start_script(spec, spec.nodes[1]),
                               status="exited", tmp=tmp_path, check=False)
    err = out["_stderr"][0]
    assert out["_rc"] == ["1"]
    assert (f"FAILED: the worker's Ray exited, and the Ray head spark-a at 127.0.0.1:{port} "
            "refused a connection from this node: nothing listens on its GCS port") in err
    assert "check the fabric" not in err


def test_a_worker_whose_ray_exited_with_the_head_reachable_says_its_exit_code(
        tmp_path: Path) -> None:
    """The head's GCS takes the connect: the path is not the cause, the worker's own exit is."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        spec = loopback_duo(listener.getsockname()[1])
        (tmp_path / "exitcode").write_text("137\n")
        out = run_with_fake_docker(ray_backend.worker_start_script(spec, spec.nodes[1]),
                                   status="exited", tmp=tmp_path, check=False)
    finally:
        listener.close()
    err = out["_stderr"][0]
    assert out["_rc"] == ["1"]
    assert "spark-b: ray-worker: FAILED: container is exited (exit code 137) before ready" in err
    assert "cannot reach" not in err.split("FAILED:", 1)[1].split("\n", 1)[0]


def test_a_worker_waits_for_a_slow_gcs_that_answers(tmp_path: Path) -> None:
    """`ray start` logs the GCS line after 5 s of a connection that has not completed; a head
    that just restarted on a busy node answers later. The GCS port answers from the node, so
    the worker waits (and says why) and joins, where the first version failed at that line."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    spec = loopback_duo(port)
    script = ray_backend.worker_start_script(spec, spec.nodes[1])
    logs = tmp_path / "logs"
    logs.write_text("[W rpc_client.h:153] Failed to connect to GCS at address "
                    f"127.0.0.1:{port} within 5 seconds.\n")
    joins = threading.Timer(3, lambda: logs.write_text(logs.read_text() + "Ray runtime started.\n"))
    joins.start()
    try:
        out = run_with_fake_docker(script, tmp=tmp_path)
    finally:
        joins.cancel()
        listener.close()
    assert "ready: spark-vllm-duo-ray-worker" in out["_stderr"][0]
    assert out["_stderr"][0].count(f"GCS at 127.0.0.1:{port} answers but has not taken") == 1


def test_remove_is_idempotent_but_not_blind(tmp_path: Path) -> None:
    spec = duo()
    script = c.remove_script(spec, spec.nodes[1], c.WORKER)
    assert run_with_fake_docker(script, gone=True)["_rc"] == ["0"]
    failed = run_with_fake_docker(script, rm_fails=True, check=False)
    assert failed["_rc"] == ["1"] and "Cannot connect" in failed["_stderr"][0]


# --- the gate's comparison ------------------------------------------------------------------

def load_gate():
    path = ROOT / "components" / "scripts" / "ray_gate.py"
    mod_spec = importlib.util.spec_from_file_location("ray_gate", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


EXPECTED = [{"name": "spark-a", "ip": "192.168.200.12", "gpus": 1},
            {"name": "spark-b", "ip": "192.168.200.13", "gpus": 1}]


def ray_node(ip: str, gpus: float = 1.0, alive: bool = True) -> dict:
    return {"NodeManagerAddress": ip, "Alive": alive, "Resources": {"GPU": gpus, "CPU": 20.0}}


def test_gate_accepts_the_declared_cluster() -> None:
    gate = load_gate()
    ok, rows = gate.compare(EXPECTED, [ray_node("192.168.200.12"), ray_node("192.168.200.13"),
                                       ray_node("10.1.230.181", alive=False)])
    assert ok and [r[3] for r in rows] == ["alive, 1 GPU", "alive, 1 GPU"]


def test_gate_names_the_seed_failure() -> None:
    """The outage: the head registered under its external IP, vLLM pinned the RoCE IP."""
    gate = load_gate()
    ok, rows = gate.compare(EXPECTED, [ray_node("10.1.230.180"), ray_node("192.168.200.13")])
    assert not ok
    text = gate.table(rows)
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["spark-a", "192.168.200.12", "1", "MISSING"]
    assert lines[3].startswith("(not in spec)  10.1.230.180")
    assert lines[3].endswith("registered under an address the spec does not use")


def test_gate_checks_gpus_and_versions() -> None:
    gate = load_gate()
    ok, rows = gate.compare(EXPECTED, [ray_node("192.168.200.12", 0), ray_node("192.168.200.13")])
    assert not ok and rows[0][3] == "alive, 0 GPU (expected 1)"
    same = ['{"node": "a", "ray": "2.60.0", "python": "3.11.2", "vllm": "0.33.0"}',
            '{"node": "b", "ray": "2.60.0", "python": "3.11.2", "vllm": "0.33.0"}']
    assert gate.version_problem(same) is None
    diff = [same[0], '{"node": "b", "ray": "2.54.0", "python": "3.12.1", "vllm": "0.33.0"}']
    assert "b: ray 2.54.0, python 3.12.1, vllm 0.33.0" in gate.version_problem(diff)
    # two vLLM releases under one image name: the incident's "mixing files from two vLLM versions"
    mixed = [same[0], '{"node": "b", "ray": "2.60.0", "python": "3.11.2", "vllm": "0.17.1"}']
    assert "a: ray 2.60.0, python 3.11.2, vllm 0.33.0" in gate.version_problem(mixed)


# --- the API-key middleware vLLM loads (scripts/spark_vllm_auth.py) --------------------------

def _asgi_status(path: str, key: str | None, auth: str | None, method: str = "POST") -> int:
    """Status the middleware answers for one request, in front of an app that answers 200."""
    import asyncio

    spec = importlib.util.spec_from_file_location(
        "spark_vllm_auth", ROOT / "components" / "scripts" / "spark_vllm_auth.py")
    mod = importlib.util.module_from_spec(spec)
    old = os.environ.pop("VLLM_API_KEY", None)
    if key is not None:
        os.environ["VLLM_API_KEY"] = key
    try:
        spec.loader.exec_module(mod)

        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        sent: list[dict] = []

        async def send(msg: dict) -> None:
            sent.append(msg)

        async def receive() -> dict:
            return {"type": "http.request", "body": b""}

        headers = [(b"authorization", auth.encode())] if auth is not None else []
        scope = {"type": "http", "path": path, "method": method, "headers": headers}
        loop = asyncio.new_event_loop()  # not asyncio.run: Pulumi's mocks keep the main loop
        try:
            loop.run_until_complete(mod.RequireApiKey(app)(scope, receive, send))
        finally:
            loop.close()
        return int(sent[0]["status"])
    finally:
        os.environ.pop("VLLM_API_KEY", None)
        if old is not None:
            os.environ["VLLM_API_KEY"] = old


@pytest.mark.parametrize("path", ["/invocations", "/v1/chat/completions", "/metrics", "/tokenize"])
def test_with_a_key_every_route_but_health_needs_it(path: str) -> None:
    assert _asgi_status(path, "sk-1", None) == 401
    assert _asgi_status(path, "sk-1", "Bearer sk-2") == 401
    assert _asgi_status(path, "sk-1", "sk-1") == 401  # the scheme is part of it, as in vLLM
    assert _asgi_status(path, "sk-1", "Bearer sk-1") == 200


def test_health_stays_open_and_no_key_means_no_check() -> None:
    assert _asgi_status("/health", "sk-1", None, method="GET") == 200
    assert _asgi_status("/ping", "sk-1", None, method="GET") == 200
    assert _asgi_status("/invocations", None, None) == 200  # no apiKey: vLLM's own behaviour


# --- the vLLM readiness probe, against a local HTTP server -----------------------------------

def serve_vllm_like(ready_after_s: float, served: str = "m", chat_delay_s: float | None = None):
    """An HTTP server on loopback answering like vLLM: /health 503 until `ready_after_s`; with
    `chat_delay_s`, a chat completion answers after that long (else the POST fails)."""
    ready_at = time.monotonic() + ready_after_s

    class Handler(http.server.BaseHTTPRequestHandler):
        if chat_delay_s is not None:
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(chat_delay_s)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"choices": [{"message": {"content": "hi"}}]}')

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            up = time.monotonic() >= ready_at
            body = json.dumps({"data": [{"id": served}]}).encode() if up else b"loading"
            self.send_response(200 if up else 503)
            self.end_headers()
            self.wfile.write(body if self.path == "/v1/models" or not up else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_probe(port: int, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", c.script_text("vllm_probe.py"), "127.0.0.1",
                           str(port), "m", *args], capture_output=True, text=True, timeout=30)
    return done, time.monotonic() - start


def test_probe_wait_returns_soon_after_vllm_serves() -> None:
    server = serve_vllm_like(ready_after_s=1.0)
    try:
        done, took = run_probe(server.server_address[1], "wait", "5")
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert 1.0 <= took < 4.0  # polled every 0.1 s, not the whole round


def test_probe_wait_then_smoke_names_a_dead_generation() -> None:
    """/health answers while generation is dead (vllm#53157): the smoke request says so, exit 2."""
    server = serve_vllm_like(ready_after_s=0)  # answers GET only: the POST of the chat fails
    try:
        done, _ = run_probe(server.server_address[1], "wait", "5", "smoke")
    finally:
        server.shutdown()
    assert done.returncode == 2, done.stderr
    assert "smoke request failed" in done.stderr


def test_probe_tells_a_slow_answer_from_a_failed_one() -> None:
    """No answer within SMOKE_SECONDS is exit 3 (busy, not dead: refresh keeps the server);
    an answer in time is exit 0."""
    slow = serve_vllm_like(ready_after_s=0, chat_delay_s=3)
    try:
        late, took = run_probe(slow.server_address[1], "ready", "0", "smoke", "1")
        in_time, _ = run_probe(slow.server_address[1], "ready", "0", "smoke", "10")
    finally:
        slow.shutdown()
    assert late.returncode == 3 and "no answer within 1 s" in late.stderr and took < 2.5
    assert in_time.returncode == 0, in_time.stderr


def test_probe_wait_gives_up_after_its_round_with_the_reason() -> None:
    server = serve_vllm_like(ready_after_s=60)
    try:
        done, took = run_probe(server.server_address[1], "wait", "1")
        once, _ = run_probe(server.server_address[1], "ready")
    finally:
        server.shutdown()
    # gave up after its 1 s round, long before the server turns ready (60 s); the upper bound
    # leaves room for a loaded CI machine (4.3 s seen: the probe's own Python start, niced)
    assert done.returncode == 1 and 1.0 <= took < 30.0
    assert "503" in done.stderr
    assert once.returncode == 1


def test_probe_names_a_wrong_served_model() -> None:
    server = serve_vllm_like(ready_after_s=0, served="other")
    try:
        done, _ = run_probe(server.server_address[1], "ready")
    finally:
        server.shutdown()
    assert done.returncode == 1 and "lists ['other'], not 'm'" in done.stderr


@pytest.mark.parametrize("present", [True, False])
def test_an_update_keeps_the_container_and_prints_its_id_or_says_it_is_gone(
        tmp_path: Path, present: bool) -> None:
    """commands.keep_script (a container command's `update`): it runs nothing but `docker
    inspect`, prints the running container's id as `create` did, and when the container is
    gone it fails, changing nothing, and names `pulumi up --refresh`."""
    (tmp_path / "docker").write_text(
        '#!/bin/sh\necho "$*" >> "$FAKE/calls"\n'
        + ('echo sha256-0123456789abcdef0123\n' if present
           else 'echo "Error: No such object: $4" >&2; exit 1\n'))
    (tmp_path / "docker").chmod(0o755)
    spec = duo()
    proc = subprocess.run(["sh", "-c", c.keep_script(spec, spec.workers[0], c.WORKER)],
                          input="HF_TOKEN=x\n", capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
                               "FAKE": str(tmp_path)})
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["inspect --format {{.Id}} spark-vllm-duo-ray-worker"]  # nothing else
    if present:
        assert (proc.returncode, proc.stdout) == (0, "sha256-0123456789abcdef0123\n")
        assert "kept: spark-vllm-duo-ray-worker" in proc.stderr
    else:
        assert proc.returncode == 1 and proc.stdout == ""
        assert "spark-vllm-duo-ray-worker is not on spark-b" in proc.stderr
        assert "nothing was changed: 'pulumi up --refresh' starts it again" in proc.stderr
