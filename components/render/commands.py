"""Pure builders: spec in, argv lists and POSIX sh scripts out. No Pulumi import.

Every piece of data enters a script through `shlex.quote`/`shlex.join`; the only unquoted
shell text is the fixed scaffolding written here. Scripts run through the SSH user's login
shell (pulumi-command's remote.Command), so they stay POSIX sh.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from importlib import resources

from ..spec import ClusterSpec, NodeSpec
from .cache_commands import CACHE_ENV_DIRS, CACHE_MOUNT, cache_lines
from .start_clocks import (
    EXECUTE_MODEL_TIMEOUT_ENV,
    SMOKE_MARGIN_S,
    execute_model_timeout,
    phase_lines,
    smoke_timeout,
)

# the package that holds scripts/ (this module is in its render/)
_COMPONENTS = __name__.rsplit(".", 2)[0]

HEAD, WORKER, VLLM = "ray-head", "ray-worker", "vllm"
# backend native: rank 0 with the API server on nodes[0], a headless rank on every other node
LEADER, RANK = "vllm-leader", "vllm-rank"
LABEL = "spark-vllm"

# Where the 0600 env-files live on a node, relative to the SSH user's $HOME (a DGX Spark user
# such as `aurora` can run docker but cannot write /var/lib).
STATE_DIR_SH = '"$HOME"/.spark-vllm/'

# Polling interval of every wait loop. Ray's head is up ~3.6 s after `docker run` on the lab
# (measured on the lab), so half a second costs little and keeps the critical path short.
POLL_INTERVAL_S = 0.5
# vLLM's probe runs in the background: `kill -0` every 0.1 s sees it end; docker state and log
# are read every 5th round (0.5 s).
VLLM_POLL_INTERVAL_S = 0.1
VLLM_CHECK_EVERY = 5
# Progress line cadence during long waits (model loads take minutes on a Spark).
PROGRESS_EVERY_S = 10

# The head counts as started once its GCS listens on rayPort: workers need nothing more to
# join, and the head's own raylet registers while they start (the gate then checks every node,
# the head included). Measured on the lab: GCS listening 1.2-1.5 s after `docker run`, "Ray
# runtime started" 3.6-6 s. Read from the kernel's socket table, so no process is started.
LISTENING_SH = ("awk -v p=:{port:04X} '$4 == \"0A\" && substr($2, length($2) - 4) == p "
                 "{{f = 1}} END {{exit !f}}' /proc/net/tcp /proc/net/tcp6 2>/dev/null")


# A TCP connect from a node, `python3 -c TCP_CONNECT_PY HOST PORT SECONDS`: exits 1 saying
# why it failed ("refused (nothing listens there)", "no answer within N s", the OS's words).
TCP_CONNECT_PY = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])).close()\n"
    "except ConnectionRefusedError:\n"
    "    sys.exit('refused (nothing listens there)')\n"
    "except (socket.timeout, TimeoutError):\n"
    "    sys.exit(f'no answer within {sys.argv[3]} s')\n"
    "except OSError as e:\n"
    "    sys.exit(e.strerror or str(e))\n")

# The Ray head's session dir, an anonymous volume of the head container that the vLLM container
# mounts too (--volumes-from). vLLM >= 0.18 (RayExecutorV2, ray_executor_v2.py: "Workers on the
# driver node use shared memory; the rest use TCP") puts the ipc:// sockets between the driver
# and the ranks on its own node under VLLM_RPC_BASE_PATH (default: the process's /tmp, which
# differs between the two containers: startup would block forever). Every container sets it,
# so no rank depends on the driver's value being carried over.
SHARED_RAY_DIR = "/tmp/ray"

# vLLM >= 0.18 copies the driver's whole environment to every rank that does not set a variable
# itself (ray_env_utils.get_driver_env_vars, setdefault), minus the names listed in
# $VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json (vllm/ray/ray_env.py). So a head's fabric
# settings would land on a worker that has none (sparkrun#135) and the HF token on every rank
# (and the API key's path: only the API server's container has the key's directory).
# The vLLM command copies this list into VLLM_CONFIG_ROOT before vLLM starts; each node sets
# its own fabric keys.
NON_CARRY_OVER_ENV = ("GLOO_SOCKET_IFNAME", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "NCCL_IB_HCA",
                      "NCCL_SOCKET_IFNAME", "PYTHONPATH", "SPARK_VLLM_API_KEY_FILE",
                      "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "VLLM_API_KEY", "VLLM_CONFIG_ROOT")
# vLLM's config root, inside the head's shared /tmp/ray: the vLLM command copies there (docker
# cp) the non-carry-over list and the API-key middleware (scripts/spark_vllm_auth.py), so they
# never travel on a command line; the container puts it first on PYTHONPATH and becomes `vllm`
# (same PID, same signals).
VLLM_CONFIG_ROOT = f"{SHARED_RAY_DIR}/spark-vllm"
AUTH_MIDDLEWARE = "spark_vllm_auth.RequireApiKey"
_VLLM_ENTRY_SH = ('export PYTHONPATH="$VLLM_CONFIG_ROOT${PYTHONPATH:+:$PYTHONPATH}" '
                  '&& exec vllm "$@"')


def owner(spec: ClusterSpec) -> str:
    """Whose containers and node files these are: the stack, or one of its served models
    (`<stack>.<model>`, spec_models.py). A single-model stack's names are as they always were."""
    return spec.stack if spec.model_key is None else f"{spec.stack}.{spec.model_key}"


def container_name(spec: ClusterSpec, role: str) -> str:
    """Fixed per stack (and served model) and role (invariant 4): a rerun finds and replaces
    its own leftovers."""
    return f"{LABEL}-{owner(spec)}-{role}"


def env_file_name(role: str) -> str:
    return f"{role}.env"


def node_env(spec: ClusterSpec, node: NodeSpec) -> dict[str, str]:
    """The env of every container on `node`: the user's env, then what the program owns.

    Computed per node from that node's own fields, never copied from the head: a worker cabled
    on another port needs its own NCCL ifname/HCA (sparkrun#135), and vLLM does not forward
    VLLM_HOST_IP from driver to workers (WORKER_SPECIFIC_ENV_VARS,
    vllm/v1/executor/ray_env_utils.py).
    """
    env = {"RAY_USAGE_STATS_ENABLED": "0", **spec.user_env}
    env["VLLM_HOST_IP"] = node.identity_ip
    if spec.backend == "ray":  # native: vLLM's own default (the container's /tmp)
        env["VLLM_RPC_BASE_PATH"] = SHARED_RAY_DIR
    if spec.staged:  # the weights are on the node (staging.py): fetching is a bug, say so
        env["HF_HUB_OFFLINE"] = "1"
    if node.fabric_interface:
        for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                    "UCX_NET_DEVICES"):
            env[key] = node.fabric_interface
    if node.ib_hca:
        env["NCCL_IB_HCA"] = node.ib_hca
    if spec.compile_cache_dir:
        for key, sub in CACHE_ENV_DIRS.items():
            env[key] = f"{CACHE_MOUNT}/{sub}"
    return env


def secret_env_file(role: str, hf_token: str | None) -> str:
    """Content of the 0600 env-file a container reads with --env-file (invariant 6). The API
    key is never here: it is in its own file (api_key_script), read by the middleware.

    Only called inside `Output.apply` on secret values; the result stays a secret Output.
    """
    if hf_token is not None and ("\n" in hf_token or "\r" in hf_token):
        raise ValueError("secret values must be one line (docker --env-file format)")
    lines = [f"# spark-vllm secrets for {role}; written by pulumi, mode 0600"]
    if hf_token:
        lines += [f"HF_TOKEN={hf_token}", f"HUGGING_FACE_HUB_TOKEN={hf_token}"]
    return "\n".join(lines) + "\n"


def sh_join(argv: Sequence[str]) -> str:
    """shlex.join, except that a word starting with `~/` keeps its tilde unquoted, so the
    node's shell expands it to the SSH user's home (docker needs an absolute bind source)."""
    return " ".join("~/" + shlex.quote(w[2:]) if w.startswith("~/") else shlex.quote(w)
                    for w in argv)


def docker_run_argv(
    spec: ClusterSpec, node: NodeSpec, role: str, entrypoint: str, args: list[str],
    extra: list[str] | None = None,
) -> list[str]:
    argv = [
        "docker", "run", "--detach", "--name", container_name(spec, role),
        "--label", f"{LABEL}.stack={spec.stack}",
        "--label", f"{LABEL}.role={role}",
        "--label", f"{LABEL}.node={node.name}",
        "--label", f"{LABEL}.identity={node.identity_ip}",
        *(["--label", f"{LABEL}.model={spec.model_key}"] if spec.model_key else []),
        "--network", "host", "--ipc", "host", "--shm-size", spec.shm_size,
    ]
    if spec.docker_gpus != "none":
        argv += ["--gpus", spec.docker_gpus]
    argv += ["--volume", f"{spec.hf_cache}:/root/.cache/huggingface"]
    if spec.compile_cache_dir:
        argv += ["--volume", f"{spec.compile_cache_dir}:{CACHE_MOUNT}"]
    argv += list(extra or [])
    argv += ["--env-file", env_file_name(role)]
    for key, value in node_env(spec, node).items():
        argv += ["--env", f"{key}={value}"]
    argv += ["--entrypoint", entrypoint, spec.image, *args]
    return argv


def vllm_serve_args(spec: ClusterSpec, executor: list[str]) -> list[str]:
    """`vllm serve` for the API server's node; `executor`: the backend's own flags."""
    # The API key is never here, nor in vLLM's env: the middleware reads it from its file.
    return [
        "serve", spec.model,
        "--tensor-parallel-size", str(spec.tensor_parallel_size),
        "--pipeline-parallel-size", str(spec.pipeline_parallel_size),
        *executor,
        "--host", spec.api_host, "--port", str(spec.port),
        "--served-model-name", spec.served_name,
        *(["--revision", spec.model_revision] if spec.model_revision else []),
        # vLLM's --api-key leaves /invocations open; this closes every route but /health, /ping
        "--middleware", AUTH_MIDDLEWARE,
        *(["--max-model-len", str(spec.max_model_len)] if spec.max_model_len is not None else []),
        *spec.vllm_args,
    ]


def script_text(name: str) -> str:
    """A script that runs on the nodes (components/scripts/), as the program sends it."""
    return resources.files(_COMPONENTS).joinpath("scripts", name).read_text()


def prelude(spec: ClusterSpec, node: NodeSpec, what: str) -> list[str]:
    return [
        "set -eu",
        'PATH="$PATH:/usr/sbin:/sbin"',
        f"node={shlex.quote(node.name)}",
        f"log() {{ echo \"[spark-vllm] $node: {what}: $*\" >&2; }}",
    ]


def _remove_lines(name_var: str, env_file: str) -> list[str]:
    """Remove a container; succeed when it is already gone, fail when docker itself fails."""
    return [
        f'if out=$(docker rm --force --volumes "${name_var}" 2>&1); then :; else',
        '  case "$out" in *"No such container"*) ;; *) echo "$out" >&2; exit 1 ;; esac',
        "fi",
        f'rm -f {STATE_DIR_SH}"$stack"/{shlex.quote(env_file)}',
        f'rmdir {STATE_DIR_SH}"$stack" 2>/dev/null || true',
    ]


def remove_script(spec: ClusterSpec, node: NodeSpec, role: str) -> str:
    """`delete` of a container command: idempotent (invariant 4)."""
    return "\n".join([
        *prelude(spec, node, f"remove {role}"),
        f"stack={shlex.quote(owner(spec))}",
        f"name={shlex.quote(container_name(spec, role))}",
        'log "stopping $name"',
        *_remove_lines("name", env_file_name(role)),
    ]) + "\n"


def keep_script(spec: ClusterSpec, node: NodeSpec, role: str) -> str:
    """`update` of a container command: the running container stays as it is; print its id
    (the command's stdout, as `create` did). An update is any change but the container's own
    (its triggers): the program's script text, the SSH key, a host key, the hfToken. A
    container that is gone cannot be kept: that is said, and `pulumi up --refresh` starts it
    again (its liveness companion sees it gone)."""
    return "\n".join([
        *prelude(spec, node, f"keep {role}"),
        f"name={shlex.quote(container_name(spec, role))}",
        "if cid=$(docker inspect --format '{{.Id}}' \"$name\" 2>/dev/null); then",
        '  log "kept: $name ${cid%"${cid#????????????}"} (nothing restarts)"; echo "$cid"; exit 0',
        "fi",
        'log "FAILED: $name is not on $node, so it cannot be kept; nothing was changed: '
        '\'pulumi up --refresh\' starts it again"',
        "exit 1",
    ]) + "\n"


def _wait_loop(ready_test: str, timeout_s: int | str, what: str, extra_checks: list[str],
               sleep_s: float = POLL_INTERVAL_S, check_every: int = 1,
               timed_out: str | None = None, shown: str | None = None,
               stopped: Sequence[str] = ()) -> list[str]:
    """Poll until `ready_test` passes; fail when the container stops, a check fails or time is
    up. Every `check_every` rounds the container's state and (when a check matches it) its
    last 200 log lines are read once (two docker calls: many nodes share few CPUs on the lab,
    and a Spark's are busy starting Ray); `has TEXT` matches those lines without another
    process. `timeout_s`: seconds, or a shell variable's `$name` holding them (a bound the
    script computes on the node); `timed_out`: the failure's text when time is up; `shown`:
    the bound the progress lines name, when not `timeout_s`; `stopped`: lines run once the
    container is found stopped, before the failure that says so (they may fail with a cause
    of their own), which names its exit code."""
    # the head's test reads /proc only: its log is read only by checks that match it (`has`)
    reads_logs = any("has " in test for test in (ready_test, *extra_checks))
    timed_out = timed_out or f"not ready within {timeout_s} s"
    return [
        'has() { case "$logs" in *"$1"*) return 0 ;; esac; return 1; }',
        f"deadline=$(( $(date +%s) + {timeout_s} )); start=$(date +%s); last=$start; round=0",
        "while :; do",
        f"  if [ $((round % {check_every})) -eq 0 ]; then",
        '    status=$(docker inspect --format "{{.State.Status}}" "$name" 2>/dev/null || echo gone)',
        '    if [ "$status" != running ]; then',
        *[f"      {line}" for line in stopped],
        "      code=$(docker inspect --format '{{.State.ExitCode}}' \"$name\" 2>/dev/null || true)",
        '      fail "container is $status${code:+ (exit code $code)} before ready"',
        "    fi",
        *(['    logs=$(docker logs --tail 200 "$name" 2>&1 || true)'] if reads_logs else []),
        "  fi",
        "  round=$((round + 1))",
        f"  if {ready_test}; then break; fi",
        *[f"  {line}" for line in extra_checks],
        "  now=$(date +%s)",
        f'  [ "$now" -lt "$deadline" ] || fail "{timed_out}"',
        f'  if [ $((now - last)) -ge {PROGRESS_EVERY_S} ]; then '
        f'last=$now; log "waiting for {what} ($((now - start)) s of {shown or timeout_s} s)"; fi',
        f"  sleep {sleep_s}",
        "done",
    ]


# In the vLLM command's stdin, these lines separate the env-file (one-line `KEY=value`s and
# comments, so they cannot occur there) from the readiness probe's program and the API-key
# middleware that follow it.
PROBE_SEPARATOR = "#--- spark-vllm: vllm_probe.py follows ---"
AUTH_SEPARATOR = "#--- spark-vllm: spark_vllm_auth.py follows ---"
GATE_SEPARATOR = "#--- spark-vllm: ray_gate.py follows ---"  # the placement check (Ray)
PROBE_FILE = ".vllm-probe.py"
VLLM_FILES_DIR = ".vllm-files"  # what the vLLM command copies into VLLM_CONFIG_ROOT


def vllm_stdin(hf_token: str | None) -> str:
    """stdin of the vLLM command: its env-file, the probe's Python, the middleware, the Ray
    gate's program (its placement check). Programs inlined in `create` would be quoted whole
    in Pulumi's error when the command fails."""
    return (secret_env_file(VLLM, hf_token) + PROBE_SEPARATOR + "\n"
            + script_text("vllm_probe.py") + AUTH_SEPARATOR + "\n"
            + script_text("spark_vllm_auth.py") + GATE_SEPARATOR + "\n"
            + script_text("ray_gate.py"))


def probe_target(spec: ClusterSpec) -> list[str]:
    """HOST PORT SERVED_NAME of vllm_probe.py, as seen inside the vLLM container."""
    host = "127.0.0.1" if spec.api_host in ("0.0.0.0", "::") else spec.api_host
    return [host, str(spec.port), spec.served_name]


def start_script(spec: ClusterSpec, node: NodeSpec, role: str, argv: list[str], *,
                 serves: bool = False, before_run: Sequence[str] = (), cache: bool = False,
                 before_start: Sequence[str] = (), ready: Sequence[str] = ()) -> str:
    """`create` of a container command: remove leftovers, write the env-file from stdin, run,
    wait until ready (the backend's `ready` lines: the container is up and doing what it is
    for), print the container id on stdout.

    `serves`: the container runs vLLM's API server, and stdin carries the probe and the
    middleware after the env-file (vllm_stdin). `before_run`: the backend's checks before the
    container starts. `cache`: mount the node's compile cache, cleared on an image change.
    `before_start`: lines right before the container starts, after the cache's (the start's
    bound, which reads how warm the cache is).

    On failure the container is removed after its log tail is shown, so nothing is left
    half-done on the node and a rerun starts clean.
    """
    lines = [
        *prelude(spec, node, role),
        f"stack={shlex.quote(owner(spec))}",
        f"name={shlex.quote(container_name(spec, role))}",
        f"umask 077; mkdir -p {STATE_DIR_SH}\"$stack\"; cd {STATE_DIR_SH}\"$stack\"",
        *([f"cat > {shlex.quote(env_file_name(role))}"] if not serves else [
            # stdin = env-file, probe, middleware (vllm_stdin); the probe and the files for
            # VLLM_CONFIG_ROOT live only while this command runs
            f"trap 'rm -rf {PROBE_FILE} {VLLM_FILES_DIR}; cd /; rmdir {STATE_DIR_SH}\"$stack\""
            " 2>/dev/null || true' EXIT",
            f"rm -rf {VLLM_FILES_DIR}; mkdir {VLLM_FILES_DIR}",
            # split stdin at the separators: env-file, probe, middleware
            "awk -v p=" + shlex.quote(PROBE_SEPARATOR) + " -v a=" + shlex.quote(AUTH_SEPARATOR)
            + " -v g=" + shlex.quote(GATE_SEPARATOR)
            + f" -v f={shlex.quote(env_file_name(role))} " + shlex.quote(
                '$0 == p { f = "' + PROBE_FILE + '"; next } $0 == a { f = "' + VLLM_FILES_DIR
                + '/spark_vllm_auth.py"; next } $0 == g { f = "' + VLLM_FILES_DIR
                + '/ray_gate.py"; next } { print > f }'),
            f"printf '%s\\n' {shlex.quote(json.dumps(list(NON_CARRY_OVER_ENV)))} "
            f"> {VLLM_FILES_DIR}/ray_non_carry_over_env_vars.json",
        ]),
        "fail() {",
        '  log "FAILED: $*"',
        # a background readiness probe (vLLM) would keep the SSH session open
        '  [ -z "${probe:-}" ] || kill "$probe" 2>/dev/null || true',
        '  docker logs --tail 60 "$name" 2>&1 | sed "s/^/    | /" >&2 || true',
        *[f"  {line}" for line in _remove_lines("name", env_file_name(role))],
        "  exit 1",
        "}",
        # A stopped pulumi run (Ctrl-C twice, a lost connection) leaves this script running on
        # the node with its session gone: the next write fails (SIGPIPE), or sshd hangs up.
        # Then remove what this command started, quietly, so nothing runs that the state does
        # not know of and no probe lingers (the next run starts clean either way).
        "trap 'exec >/dev/null 2>&1; fail interrupted' HUP INT TERM PIPE",
        # a leftover of the same name would make `docker run` fail with "already exists"
        'docker rm --force --volumes "$name" >/dev/null 2>&1 || true',
        *before_run,
    ]
    if spec.image_digest:
        # pinned: what this node runs under the tag now (a re-pull, a reboot) must be it
        d = spec.image_digest
        lines += [
            "have=$(docker image inspect --format '{{.Id}} {{range .RepoDigests}}{{.}} {{end}}' "
            f"{shlex.quote(spec.image)} 2>/dev/null || true)",
            f'case " $have " in *" {d} "*|*"@{d} "*) ;; *) fail "{spec.image} on {node.name} is '
            f'not imageDigest {d}: it is ${{have:-not there}}" ;; esac',
        ]
    if cache and spec.compile_cache_dir:
        lines += cache_lines(spec, node)
    lines += [
        *before_start,
        f'log "starting $name on {node.identity_ip}"',
        f"cid=$({sh_join(argv)})",
        *ready,
        'log "ready: $name ${cid%"${cid#????????????}"}"', 'echo "$cid"',
    ]
    return "\n".join(lines) + "\n"


def serve_ready_lines(spec: ClusterSpec, checks: Sequence[str]) -> list[str]:
    """The API server's readiness: one `docker exec` polls /health every 0.1 s for the whole
    load (bounded by $bound, start_bound_lines) and sends the smoke request the moment it
    passes (bounded by smoke_timeout); meanwhile the shell checks the container's state and
    vLLM's log twice a second (the backend's `checks`, each a line that fails with a reason)
    and sees the probe end within 0.1 s. A start that times out names vLLM's phase."""
    smoke = smoke_timeout(spec)
    probe = ('docker exec -i "$name" ' + shlex.join(["python3", "-", *probe_target(spec), "wait"])
             + ' "$bound"' + (f" smoke {smoke}" if spec.smoke_test else "") + f" < {PROBE_FILE}")
    # the probe ends itself within $bound (+ the smoke's bound): the shell's own deadline is
    # there for a probe that hangs (a docker exec that never returns)
    limit = "$limit"
    return [
        *phase_lines(),
        f"limit=$((bound + {smoke if spec.smoke_test else 0} + 30))",
        f"{probe} >&2 &", "probe=$!",
        *_wait_loop('! kill -0 "$probe" 2>/dev/null', limit,
                    f"vLLM {spec.served_name} to serve", list(checks),
                    sleep_s=VLLM_POLL_INTERVAL_S, check_every=VLLM_CHECK_EVERY,
                    timed_out="vLLM did not serve within $bound s ($why): $(phase)",
                    shown="$bound"),
        'if wait "$probe"; then probe=; else',
        "  rc=$?; probe=",
        '  logs=$(docker logs --tail 200 "$name" 2>&1 || true)',
        *[f"  {check}" for check in checks],
        '  if [ "$rc" -eq 2 ]; then fail "smoke request failed"; fi',
        '  if [ "$rc" -eq 3 ]; then fail "the smoke request got no answer within '
        f'{smoke} s (vLLM\'s own per-step limit, {EXECUTE_MODEL_TIMEOUT_ENV} '
        f'{execute_model_timeout(spec)} s, and {SMOKE_MARGIN_S} s): vLLM answers /health but '
        'does not generate"; fi',
        '  fail "vLLM did not serve within $bound s ($why): $(phase); the probe says why above"',
        "fi",
    ]
