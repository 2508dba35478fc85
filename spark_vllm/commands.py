"""Pure builders: spec in, argv lists and POSIX sh scripts out. No Pulumi import.

Every piece of data enters a script through `shlex.quote`/`shlex.join`; the only unquoted
shell text is the fixed scaffolding written here. Scripts run through the SSH user's login
shell (pulumi-command's remote.Command), so they stay POSIX sh.
"""

from __future__ import annotations

import json
import re
import shlex
from importlib import resources

from . import ssh
from .spec import ClusterSpec, NodeSpec

HEAD, WORKER, VLLM = "ray-head", "ray-worker", "vllm"
LABEL = "spark-vllm"

# Where the 0600 env-files live on a node, relative to the SSH user's $HOME (a DGX Spark user
# such as `aurora` can run docker but cannot write /var/lib).
STATE_DIR_SH = '"$HOME"/.spark-vllm/'

# Polling interval of every wait loop. Ray's head is up ~3.6 s after `docker run` on the lab
# (measured on the lab), so half a second costs little and keeps the critical path short.
POLL_INTERVAL_S = 0.5
# The head's readiness test reads /proc only, and workers wait for it: poll it more often.
HEAD_POLL_INTERVAL_S = 0.2
# vLLM's probe runs in the background: `kill -0` every 0.1 s sees it end; docker state and log
# are read every 5th round (0.5 s).
VLLM_POLL_INTERVAL_S = 0.1
VLLM_CHECK_EVERY = 5
# Progress line cadence during long waits (model loads take minutes on a Spark).
PROGRESS_EVERY_S = 10

# `ray start` prints this once its raylet is up (and, on workers, joined the GCS).
RAY_STARTED_MARK = "Ray runtime started"
# The head counts as started once its GCS listens on rayPort: workers need nothing more to
# join, and the head's own raylet registers while they start (the gate then checks every node,
# the head included). Measured on the lab: GCS listening 1.2-1.5 s after `docker run`, "Ray
# runtime started" 3.6-6 s. Read from the kernel's socket table, so no process is started.
_LISTENING_SH = ("awk -v p=:{port:04X} '$4 == \"0A\" && substr($2, length($2) - 4) == p "
                 "{{f = 1}} END {{exit !f}}' /proc/net/tcp /proc/net/tcp6 2>/dev/null")
# vLLM's initialize_ray_cluster logs this when the placement group is not ready after ~10 s:
# with the gate passed it means vLLM asks Ray for something Ray does not have (the outage's hang).
PG_WAITING_MARK = "Waiting for creating a placement group"
# A worker's `ray start` logs this 5 s into a GCS connection that never completes, then keeps
# retrying for minutes. The head is up by then (its command waited for it), so the path from
# this node to the head's identity IP is broken: the fabric, a route or a firewall.
GCS_UNREACHABLE_MARK = "Failed to connect to GCS at address"


# Prints "RAY PYTHON VLLM" for an image; run once per image id by the preflight. vLLM's own CLI
# says its version (`vllm --version`, the last word it prints), as in every release.
VERSIONS_PY = (
    "import subprocess, sys, ray\n"
    "try:\n"
    "    out = subprocess.run(['vllm', '--version'], capture_output=True, text=True, timeout=300)\n"
    "    vllm = out.stdout.split()[-1] if out.returncode == 0 and out.stdout.split() else ''\n"
    "except OSError:\n"
    "    vllm = ''\n"
    "if not vllm:\n"
    "    sys.exit('no vllm command in the image')\n"
    "print(ray.__version__, sys.version.split()[0], vllm)\n"
)


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
# settings would land on a worker that has none (sparkrun#135) and the API key on every rank.
# The vLLM command copies this list into VLLM_CONFIG_ROOT before vLLM starts; each node sets
# its own fabric keys.
NON_CARRY_OVER_ENV = ("GLOO_SOCKET_IFNAME", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "NCCL_IB_HCA",
                      "NCCL_SOCKET_IFNAME", "PYTHONPATH", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
                      "VLLM_API_KEY", "VLLM_CONFIG_ROOT")
# vLLM's config root, inside the head's shared /tmp/ray: the vLLM command copies there (docker
# cp) the non-carry-over list and the API-key middleware (scripts/spark_vllm_auth.py), so they
# never travel on a command line; the container puts it first on PYTHONPATH and becomes `vllm`
# (same PID, same signals).
VLLM_CONFIG_ROOT = f"{SHARED_RAY_DIR}/spark-vllm"
AUTH_MIDDLEWARE = "spark_vllm_auth.RequireApiKey"
_VLLM_ENTRY_SH = ('export PYTHONPATH="$VLLM_CONFIG_ROOT${PYTHONPATH:+:$PYTHONPATH}" '
                  '&& exec vllm "$@"')


# The node's compile caches (compileCache) inside every container that runs a rank or the
# driver. vLLM keeps its torch.compile artefacts under VLLM_CACHE_ROOT/torch_compile_cache/
# <hash>/rank_<r>_<dp>/ and points inductor and Triton there too (vllm/compilation/backends.py
# VllmBackend.__call__, compiler_interface.py initialize_cache); the hash covers the compile-
# affecting env, the vLLM config (model, dtype, parallel layout, compilation flags), the source
# of every traced file and the compiler (torch) version. Kernels JIT-built outside that
# (Triton kernels vLLM calls directly, FlashInfer, the driver's PTX JIT, torch extensions)
# keep their own caches, each keyed by its own source and version: all of them live here.
CACHE_MOUNT = "/spark-vllm-cache"
CACHE_ENV_DIRS = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton",
                  "TORCHINDUCTOR_CACHE_DIR": "inductor", "FLASHINFER_WORKSPACE_BASE": "flashinfer",
                  "CUDA_CACHE_PATH": "nv", "TORCH_EXTENSIONS_DIR": "torch_extensions"}
# The image id the cache was made with, in the cache directory. None of the keys above covers
# a rebuilt image whose versions did not change (a patched kernel library, another CUDA
# build): so a Ray container that starts with another image clears the node's cache first.
CACHE_STAMP = ".spark-vllm-image"


def container_name(spec: ClusterSpec, role: str) -> str:
    """Fixed per stack and role (invariant 4): a rerun finds and replaces its own leftovers."""
    return f"{LABEL}-{spec.stack}-{role}"


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


def secret_env_file(role: str, hf_token: str | None, api_key: str | None) -> str:
    """Content of the 0600 env-file a container reads with --env-file (invariant 6).

    Only called inside `Output.apply` on secret values; the result stays a secret Output.
    """
    for value in (hf_token, api_key):
        if value is not None and ("\n" in value or "\r" in value):
            raise ValueError("secret values must be one line (docker --env-file format)")
    lines = [f"# spark-vllm secrets for {role}; written by pulumi, mode 0600"]
    if hf_token:
        lines += [f"HF_TOKEN={hf_token}", f"HUGGING_FACE_HUB_TOKEN={hf_token}"]
    if api_key and role == VLLM:
        lines.append(f"VLLM_API_KEY={api_key}")
    return "\n".join(lines) + "\n"


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


def ray_head_args(spec: ClusterSpec) -> list[str]:
    node = spec.head
    return ["start", "--head", f"--node-ip-address={node.identity_ip}",
            f"--port={spec.ray_port}", f"--num-gpus={node.gpus}", "--block"]


def ray_worker_args(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    return ["start", f"--address={spec.head.identity_ip}:{spec.ray_port}",
            f"--node-ip-address={node.identity_ip}", f"--num-gpus={node.gpus}", "--block"]


def vllm_serve_args(spec: ClusterSpec) -> list[str]:
    # The API key is never here: vLLM reads VLLM_API_KEY from the env-file (invariant 6).
    return [
        "serve", spec.model,
        "--tensor-parallel-size", str(spec.tensor_parallel_size),
        "--pipeline-parallel-size", str(spec.pipeline_parallel_size),
        "--distributed-executor-backend", "ray",
        "--host", spec.api_host, "--port", str(spec.port),
        "--served-model-name", spec.served_name,
        *(["--revision", spec.model_revision] if spec.model_revision else []),
        # vLLM's --api-key leaves /invocations open; this closes every route but /health, /ping
        "--middleware", AUTH_MIDDLEWARE,
        *(["--max-model-len", str(spec.max_model_len)] if spec.max_model_len is not None else []),
        *spec.vllm_args,
    ]


def head_run_argv(spec: ClusterSpec) -> list[str]:
    # /tmp/ray is an anonymous volume so the vLLM container can share the head's Ray session
    # (raylet and object-store sockets); see vllm_run_argv.
    return docker_run_argv(spec, spec.head, HEAD, "ray", ray_head_args(spec),
                           extra=["--volume", "/tmp/ray"])


def worker_run_argv(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    # No restart policy, here or on any container (invariant 7): a worker that restarts alone
    # joins as a new Ray node under a vLLM whose ranks died with the old one, and a Ray head
    # restarted alone does not take its workers back (Ray's GCS fault-tolerance docs); Docker's policies
    # have no ordering between containers, and a loop on the GPU can wedge a Spark (eugr#257).
    # A dead container stays dead and visible: `pulumi up --refresh` replaces it and its
    # dependents in order.
    return docker_run_argv(spec, node, WORKER, "ray", ray_worker_args(spec, node))


def vllm_run_argv(spec: ClusterSpec) -> list[str]:
    # vLLM is a Ray *driver* on the head node, in its own container so it can be replaced
    # alone. A Ray 2.60 driver finds its node by looking for local raylet processes (`ps`,
    # services.find_node_ids) and connects through the session's sockets under /tmp/ray: so it
    # shares the head container's PID namespace and /tmp/ray, and the host's IPC and network.
    head = container_name(spec, HEAD)
    extra = ["--pid", f"container:{head}", "--volumes-from", head,
             "--env", f"RAY_ADDRESS={spec.head.identity_ip}:{spec.ray_port}",
             "--env", f"VLLM_CONFIG_ROOT={VLLM_CONFIG_ROOT}"]
    return docker_run_argv(spec, spec.head, VLLM, "sh",
                           ["-c", _VLLM_ENTRY_SH, "vllm", *vllm_serve_args(spec)], extra=extra)


def script_text(name: str) -> str:
    return resources.files(__package__).joinpath("scripts", name).read_text()


def _prelude(spec: ClusterSpec, node: NodeSpec, what: str) -> list[str]:
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
        *_prelude(spec, node, f"remove {role}"),
        f"stack={shlex.quote(spec.stack)}",
        f"name={shlex.quote(container_name(spec, role))}",
        'log "stopping $name"',
        *_remove_lines("name", env_file_name(role)),
    ]) + "\n"


def _wait_loop(ready_test: str, timeout_s: int, what: str, extra_checks: list[str],
               sleep_s: float = POLL_INTERVAL_S, check_every: int = 1) -> list[str]:
    """Poll until `ready_test` passes; fail when the container stops, a check fails or time is
    up. Every `check_every` rounds the container's state and (when a check matches it) its
    last 200 log lines are read once (two docker calls: many nodes share few CPUs on the lab,
    and a Spark's are busy starting Ray); `has TEXT` matches those lines without another
    process."""
    # the head's test reads /proc only: its log is read only by checks that match it (`has`)
    reads_logs = any("has " in test for test in (ready_test, *extra_checks))
    return [
        'has() { case "$logs" in *"$1"*) return 0 ;; esac; return 1; }',
        f"deadline=$(( $(date +%s) + {timeout_s} )); start=$(date +%s); last=$start; round=0",
        "while :; do",
        f"  if [ $((round % {check_every})) -eq 0 ]; then",
        '    status=$(docker inspect --format "{{.State.Status}}" "$name" 2>/dev/null || echo gone)',
        '    [ "$status" = running ] || fail "container is $status before ready"',
        *(['    logs=$(docker logs --tail 200 "$name" 2>&1 || true)'] if reads_logs else []),
        "  fi",
        "  round=$((round + 1))",
        f"  if {ready_test}; then break; fi",
        *[f"  {line}" for line in extra_checks],
        "  now=$(date +%s)",
        f'  [ "$now" -lt "$deadline" ] || fail "not ready within {timeout_s} s"',
        f'  if [ $((now - last)) -ge {PROGRESS_EVERY_S} ]; then '
        f'last=$now; log "waiting for {what} ($((now - start)) s of {timeout_s} s)"; fi',
        f"  sleep {sleep_s}",
        "done",
    ]


# In the vLLM command's stdin, these lines separate the env-file (one-line `KEY=value`s and
# comments, so they cannot occur there) from the readiness probe's program and the API-key
# middleware that follow it.
PROBE_SEPARATOR = "#--- spark-vllm: vllm_probe.py follows ---"
AUTH_SEPARATOR = "#--- spark-vllm: spark_vllm_auth.py follows ---"
PROBE_FILE = ".vllm-probe.py"
VLLM_FILES_DIR = ".vllm-files"  # what the vLLM command copies into VLLM_CONFIG_ROOT


def vllm_stdin(hf_token: str | None, api_key: str | None) -> str:
    """stdin of the vLLM command: its env-file, the probe's Python, the middleware. Programs
    inlined in `create` would be quoted whole in Pulumi's error when the command fails."""
    return (secret_env_file(VLLM, hf_token, api_key) + PROBE_SEPARATOR + "\n"
            + script_text("vllm_probe.py") + AUTH_SEPARATOR + "\n"
            + script_text("spark_vllm_auth.py"))


def probe_target(spec: ClusterSpec) -> list[str]:
    """HOST PORT SERVED_NAME of vllm_probe.py, as seen inside the vLLM container."""
    host = "127.0.0.1" if spec.api_host in ("0.0.0.0", "::") else spec.api_host
    return [host, str(spec.port), spec.served_name]


def _probe(spec: ClusterSpec, mode: str, *extra: str) -> str:
    """Run the probe (written by the vLLM command from its stdin) inside the vLLM container."""
    return ('docker exec -i "$name" '
            + shlex.join(["python3", "-", *probe_target(spec), mode, *extra])
            + f" < {PROBE_FILE}")


# The refresh-time read of vLLM (scripts/vllm_liveness.py, on stdin): /health, then a canary of
# one streamed token; no first token within canaryTimeout while vLLM's token counter stands
# still for wedgeWindow is *wedged* (replaced by `pulumi up --refresh`); the counter moving
# is *busy* and counts as running: a refresh must never reload 120 GB of weights because a
# queue was long. Only a completion proves vLLM serves (vllm#53157).
LIVENESS_MARGIN_S = 15  # docker exec and the script's own start, over the window


def liveness_target(spec: ClusterSpec) -> list[str]:
    """HOST PORT SERVED_NAME CANARY_S WINDOW_S of vllm_liveness.py."""
    return [*probe_target(spec), str(spec.canary_timeout), str(spec.wedge_window)]


def liveness_args(serving: list[str]) -> list[str]:
    """`serving` as the liveness read needs it: a state written before the canary existed
    holds HOST PORT NAME only, and gets the default bounds."""
    return [*serving[:3], *(serving[3:5] or ["30", "60"])]


def liveness_timeout(serving: list[str]) -> float:
    """The whole read, docker exec included: the window and a margin."""
    return float(liveness_args(serving)[4]) + LIVENESS_MARGIN_S


def inspect_script(container: str, serving: list[str] | None) -> str:
    """Prints the container's state in one line; exit 3 when docker itself does not answer.
    With `serving` (liveness_target), a running vLLM container is asked how it serves, and
    what it saw goes to stderr."""
    q = shlex.quote(container)
    lines = [
        "PATH=\"$PATH:/usr/sbin:/sbin\"",
        f"if ! out=$(docker inspect --format '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {q} 2>&1); then",
        '  case "$out" in *"No such"*) echo gone; exit 0 ;; esac',
        '  echo "docker: $out" >&2; exit 3',
        "fi",
        'set -- $out',
        'if [ "$1" != running ]; then echo "$1 ($2)"; exit 0; fi',
    ]
    if serving:
        # scripts/vllm_liveness.py on stdin, run inside the container with its own API key
        check = shlex.join(["python3", "-", *liveness_args(serving)])
        limit = int(liveness_timeout(serving))
        lines += [
            f"if state=$(timeout {limit} docker exec -i {q} {check}); then",
            '  echo "$state" | tail -n 1',
            "else",
            # the check could not tell (docker exec hung, or the script failed): not a reason
            # to replace a model that may be loading or busy
            f'  echo "unknown: the liveness check ended with $? within {limit} s" >&2',
            "  echo running",
            "fi",
        ]
    else:
        lines.append("echo running")
    return "\n".join(lines) + "\n"


def start_script(spec: ClusterSpec, node: NodeSpec, role: str, argv: list[str]) -> str:
    """`create` of a container command: remove leftovers, write the env-file from stdin, run,
    wait until ready (head: its GCS listens; worker: joined the head; vLLM: serving), print the
    container id on stdout.

    On failure the container is removed after its log tail is shown, so nothing is left
    half-done on the node and a rerun starts clean.
    """
    lines = [
        *_prelude(spec, node, role),
        f"stack={shlex.quote(spec.stack)}",
        f"name={shlex.quote(container_name(spec, role))}",
        f"umask 077; mkdir -p {STATE_DIR_SH}\"$stack\"; cd {STATE_DIR_SH}\"$stack\"",
        *([f"cat > {shlex.quote(env_file_name(role))}"] if role != VLLM else [
            # stdin = env-file, probe, middleware (vllm_stdin); the probe and the files for
            # VLLM_CONFIG_ROOT live only while this command runs
            f"trap 'rm -rf {PROBE_FILE} {VLLM_FILES_DIR}; cd /; rmdir {STATE_DIR_SH}\"$stack\""
            " 2>/dev/null || true' EXIT",
            f"rm -rf {VLLM_FILES_DIR}; mkdir {VLLM_FILES_DIR}",
            # split stdin at the separators: env-file, probe, middleware
            "awk -v p=" + shlex.quote(PROBE_SEPARATOR) + " -v a=" + shlex.quote(AUTH_SEPARATOR)
            + f" -v f={shlex.quote(env_file_name(role))} " + shlex.quote(
                '$0 == p { f = "' + PROBE_FILE + '"; next } $0 == a { f = "' + VLLM_FILES_DIR
                + '/spark_vllm_auth.py"; next } { print > f }'),
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
    ]
    listening = _LISTENING_SH.format(port=spec.ray_port)
    if role == HEAD:
        # Anything else on rayPort (a Redis listens on 6379 by default) would pass the
        # readiness test below while Ray's GCS fails to bind: refuse it by name first.
        lines.append(f'if {listening}; then fail "port {spec.ray_port} (rayPort) is already in '
                     f'use on {node.name} by a process outside this stack"; fi')
    if role == VLLM:
        head = shlex.quote(container_name(spec, HEAD))
        lines.append(f"docker cp {VLLM_FILES_DIR}/. {head}:{VLLM_CONFIG_ROOT} >/dev/null "
                     f'|| fail "cannot copy vLLM\'s config into the Ray head container"')
    if spec.image_digest:
        # pinned: what this node runs under the tag now (a re-pull, a reboot) must be it
        d = spec.image_digest
        lines += [
            "have=$(docker image inspect --format '{{.Id}} {{range .RepoDigests}}{{.}} {{end}}' "
            f"{shlex.quote(spec.image)} 2>/dev/null || true)",
            f'case " $have " in *" {d} "*|*"@{d} "*) ;; *) fail "{spec.image} on {node.name} is '
            f'not imageDigest {d}: it is ${{have:-not there}}" ;; esac',
        ]
    if role in (HEAD, WORKER) and spec.compile_cache_dir:
        lines += _cache_lines(spec, node)
    lines += [
        f'log "starting $name on {node.identity_ip}"',
        f"cid=$({shlex.join(argv)})",
    ]
    if role == HEAD:
        lines += _wait_loop(listening, spec.ray_timeout,
                            f"the Ray head's GCS to listen on port {spec.ray_port}", [],
                            sleep_s=HEAD_POLL_INTERVAL_S)
    elif role == WORKER:
        # A worker waits here, on the node that sees why, for its join: a blocked fabric is
        # reported in ~6 s with the worker's own log, not after the gate's rayTimeout.
        gcs = f"{spec.head.identity_ip}:{spec.ray_port}"
        unreachable = (
            f"if has {shlex.quote(GCS_UNREACHABLE_MARK)}; then "
            f'fail "cannot reach the Ray head {spec.head.name} at {gcs} from {node.identity_ip} '
            f'(its GCS is up): check the fabric link, routes and firewall between the two"; fi'
        )
        lines += _wait_loop(f"has {shlex.quote(RAY_STARTED_MARK)}", spec.ray_timeout,
                            f"Ray worker to join the head at {gcs}", [unreachable])
    elif role == VLLM:
        # One `docker exec` polls /health every 0.1 s for the whole load and sends the smoke
        # request the moment it passes; meanwhile the shell checks the container's state and
        # vLLM's log twice a second (PG_WAITING_MARK) and sees the probe end within 0.1 s.
        probe = _probe(spec, "wait", str(spec.vllm_timeout),
                       *(["smoke"] if spec.smoke_test else []))
        # The waiting line quotes the specs: only vLLM < 0.18 pins `node:<VLLM_HOST_IP>`.
        pg_check = (
            f"if has {shlex.quote(PG_WAITING_MARK)}; then if has \"'node:\"; then "
            'fail "vLLM is waiting for a Ray placement group that Ray cannot place: the IP '
            'vLLM pins (VLLM_HOST_IP) is not a Ray node, or GPUs are missing"; else '
            'fail "vLLM is waiting for a Ray placement group that Ray cannot place: the GPUs '
            'it asks for are not free (another vLLM on this Ray cluster? ray status)"; fi; fi'
        )
        lines += [f"{probe} >&2 &", "probe=$!"]
        lines += _wait_loop('! kill -0 "$probe" 2>/dev/null', spec.vllm_timeout,
                            f"vLLM {spec.served_name} to serve", [pg_check],
                            sleep_s=VLLM_POLL_INTERVAL_S, check_every=VLLM_CHECK_EVERY)
        lines += ['if wait "$probe"; then probe=; else',
                  "  rc=$?; probe=",
                  '  logs=$(docker logs --tail 200 "$name" 2>&1 || true)',
                  f"  {pg_check}",
                  '  if [ "$rc" -eq 2 ]; then fail "smoke request failed"; fi',
                  '  fail "vLLM did not serve (the probe says why above)"',
                  "fi"]
    lines += ['log "ready: $name ${cid%"${cid#????????????}"}"', 'echo "$cid"']
    return "\n".join(lines) + "\n"


def _cache_lines(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    """Before a Ray container starts on `node`: its compile cache directory exists, owned by
    the SSH user (the containers write into it as root; clearing goes through a container, so
    no sudo is needed), and was made with this image, or is cleared; then how warm it is."""
    d = spec.compile_cache_dir
    assert d is not None
    image = shlex.quote(spec.image)
    stamp = f'"$cache"/{CACHE_STAMP}'
    return [
        f"cache={shlex.quote(d)}",
        'mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] || fail "compileCache $cache on '
        f'{node.name} is not a directory $(id -un) can write (chown it, or set compileCache '
        'to one it owns, or none)"',
        f"img=$(docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null || true)",
        f'was=$(cat {stamp} 2>/dev/null || true)',
        'if [ -n "$img" ] && [ "$was" != "$img" ]; then',
        f'  if [ -n "$(ls -A "$cache" | grep -vx {shlex.quote(CACHE_STAMP)} || true)" ]; then',
        '    log "compile cache $cache was made with ${was:-another image}: clearing it for $img"',
        f"    docker run --rm --network none --volume \"$cache\":{CACHE_MOUNT} --entrypoint sh "
        f"{image} -c {shlex.quote(f'rm -rf {CACHE_MOUNT}/* {CACHE_MOUNT}/.[!.]*')} >/dev/null "
        '2>&1 || fail "cannot clear the compile cache $cache"',
        "  fi",
        f'  printf "%s\\n" "$img" > {stamp}',
        "fi",
        'log "compile cache $cache: $(du -sk "$cache" 2>/dev/null | cut -f1) KiB '
        '($(find "$cache" -path "*/torch_compile_cache/*" -name "rank_*" 2>/dev/null | wc -l) '
        'compiled rank dirs)"',
    ]


def preflight_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """Checks one node before any container starts (invariant 5); prints a JSON summary."""
    q = shlex.quote
    image = q(spec.image)
    lines = [
        *_prelude(spec, node, "preflight"),
        'fail() { log "FAILED: $*"; exit 1; }',
        "command -v docker >/dev/null 2>&1 || fail \"docker is not installed or not on PATH\"",
        'docker_v=$(docker version --format "{{.Server.Version}}" 2>&1) '
        '|| fail "docker daemon not reachable as $(id -un): $docker_v"',
    ]
    if spec.check_gpu:
        lines += [
            "gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)",
            f'[ "$gpus" -ge {node.gpus} ] || fail "nvidia-smi sees ${{gpus:-0}} GPU(s), '
            f'the spec says gpus: {node.gpus} (checkGpu: false only where no GPU exists)"',
        ]
    else:
        lines.append("gpus=unchecked")
    ip = node.identity_ip
    if node.fabric_interface:
        iface = q(node.fabric_interface)
        lines += [
            f"[ -e /sys/class/net/{iface} ] || fail \"fabricInterface {node.fabric_interface} "
            "not found; interfaces here: $(ls /sys/class/net | tr '\\n' ' ')\"",
            f"addrs=$(ip -o addr show dev {iface} | awk '{{print $4}}' | tr '\\n' ' ')",
            f'case " $addrs" in *" {ip}/"*) ;; *) fail "fabricIp {ip} is not on '
            f'{node.fabric_interface}; addresses there: ${{addrs:-none}}" ;; esac',
        ]
    else:
        lines += [
            "addrs=$(ip -o addr show | awk '{print $4}' | tr '\\n' ' ')",
            f'case " $addrs" in *" {ip}/"*) ;; *) fail "host {ip} is the node identity but no '
            f'interface has it (NAT?); set fabricIp/fabricInterface. Addresses: $addrs" ;; esac',
        ]
    if spec.image_pull == "always":
        lines.append(f'log "pulling {spec.image}"; docker pull --quiet {image} >&2 '
                     f'|| fail "docker pull {spec.image} failed"')
    elif spec.image_pull == "missing":
        lines.append(f"docker image inspect {image} >/dev/null 2>&1 || {{ log \"pulling "
                     f"{spec.image}\"; docker pull --quiet {image} >&2 || fail \"docker pull "
                     f"{spec.image} failed\"; }}")
    lines += [
        f"image_id=$(docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null) || fail "
        f'"image {spec.image} is not on the node (imagePull: {spec.image_pull}); '
        f'load it with: docker save IMAGE | ssh NODE docker load"',
        # Ray is optional in vLLM images since 0.18, head/worker must run the same Ray and
        # Python (ray#50511), and vLLM's version decides its Ray executor (legacy < 0.18 pins
        # `node:<VLLM_HOST_IP>`; RayExecutorV2 does not): read all three from the image here,
        # not after a failed join. Starting a container that imports Ray (and `vllm --version`,
        # seconds on a real image) costs CPU on every cold up, so the answer is kept per image
        # id (a content hash: it cannot go stale) in a file outside any stack's directory.
        f"cache={STATE_DIR_SH}image-versions/\"${{image_id#sha256:}}\"",
        'if versions=$(cat "$cache" 2>/dev/null) && [ "$(echo $versions | wc -w)" -eq 3 ]; then :',
        f"else versions=$(docker run --rm --network none --entrypoint python3 {image} -c "
        + q(VERSIONS_PY)
        + ' 2>&1) || fail "image has no python3 with ray and vllm: '
        '$(echo "$versions" | tail -n 3)"',
        '  versions=$(echo "$versions" | tail -n 1)',
        f"  mkdir -p {STATE_DIR_SH}image-versions && "
        'echo "$versions" > "$cache.$$" && mv -f "$cache.$$" "$cache" || true',
        "fi",
        "set -- $versions",
    ]
    digests = ""
    if spec.image_digest:  # only then: a preflight that changed would restart the chain
        lines.append(f"digests=$(docker image inspect --format '{{{{range .RepoDigests}}}}"
                     f"{{{{.}}}} {{{{end}}}}' {image} 2>/dev/null || true)")
        digests = ', "digests": "%s"'
    if spec.staged:  # not on the node count: a node added or removed must not re-run it
        # the copy runs rsync between the head and each node, and the manifest check python3
        lines += [f"for tool in rsync python3; do command -v $tool >/dev/null 2>&1 || fail \"$tool "
                  f"is not installed: modelStaging {spec.model_staging} copies the model with rsync "
                  "and checks it with python3 (or set modelStaging: none)\"; done"]
    lines += [
        f"""printf '{{"node": "%s", "identity": "%s", "docker": "%s", "gpus": "%s", """
        f""""image_id": "%s", "ray": "%s", "python": "%s", "vllm": "%s"{digests}}}\\n' """
        f'"$node" {q(ip)} "$docker_v" "$gpus" "$image_id" "$1" "$2" "$3"'
        + (' "$digests"' if digests else ""),
    ]
    return "\n".join(lines) + "\n"


def gate_expected(spec: ClusterSpec) -> list[dict[str, object]]:
    return [{"name": n.name, "ip": n.identity_ip, "gpus": n.gpus} for n in spec.nodes]


def gate_script(spec: ClusterSpec, preflight_json: list[str]) -> str:
    """Readiness gate, run on the head: Ray's node table must match the spec (invariant 5).

    `preflight_json` are the preflight summaries (one JSON per node) so the gate can also
    name a Ray/Python version mismatch between nodes. The Python program itself is the
    command's stdin (`gate_program`): a failed command is quoted whole in Pulumi's error, and
    the expected-vs-seen table must not drown under 100 lines of script.
    """
    payload = json.dumps({"expected": gate_expected(spec), "timeout": spec.ray_timeout,
                          "address": f"{spec.head.identity_ip}:{spec.ray_port}",
                          "preflight": preflight_json}, sort_keys=True)
    head = container_name(spec, HEAD)
    q_head = shlex.quote(head)
    return "\n".join([
        *_prelude(spec, spec.head, "gate"),
        # The head's command returned once its GCS listened: if the head died since, its own
        # log says why better than a docker exec error would.
        f'[ "$(docker inspect --format "{{{{.State.Status}}}}" {q_head} 2>/dev/null)" = running ] '
        f'|| {{ log "FAILED: the Ray head container {head} is not running"; docker logs --tail 60 '
        f'{q_head} 2>&1 | sed "s/^/    | /" >&2; exit 1; }}',
        # `timeout` bounds even a hung GCS connection: a remote command is not killed by
        # Pulumi's custom timeouts (pulumi-command runs it to its end).
        f"timeout {spec.ray_timeout + 30} docker exec -i {q_head} python3 - "
        f"{shlex.quote(payload)}",
    ]) + "\n"


def gate_program() -> str:
    """The gate's Python (scripts/ray_gate.py), sent as the gate command's stdin."""
    return script_text("ray_gate.py")


# --- model staging (staging.py) ------------------------------------------------------------

MODEL_ROLE = "model"
# In a staging command's stdin: the secret part (the env-file with HF_TOKEN, or the SSH key the
# head copies with) comes first; the staging helper's Python follows this line.
MANIFEST_SEPARATOR = "#--- spark-vllm: its program follows ---"


# The user's env keys the download container gets: the Hub's own settings and proxies. Not the
# rest (NCCL_DEBUG …): an env change must not re-run the staging, a reviewer reads that as
# weights being copied again.
_DOWNLOAD_ENV = re.compile(r"^(HF_.*|HUGGINGFACE_.*|(HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy"
                           r"|REQUESTS_CA_BUNDLE|SSL_CERT_FILE|CURL_CA_BUNDLE)$")


def download_env(spec: ClusterSpec) -> dict[str, str]:
    return {k: v for k, v in spec.user_env.items() if _DOWNLOAD_ENV.match(k)}


def model_repo_dir(spec: ClusterSpec) -> str:
    return f"{spec.hf_cache}/hub/models--{spec.model.replace('/', '--')}"


def staging_stdin(secret_part: str, program: str = "model_manifest.py", preamble: str = "") -> str:
    """stdin of a staging command (or the image check): a secret (env-file or key), then the
    Python it runs (after `preamble`, e.g. its data)."""
    if MANIFEST_SEPARATOR in secret_part:
        raise ValueError("secret contains the staging separator")
    return (secret_part if secret_part.endswith("\n") else secret_part + "\n") \
        + MANIFEST_SEPARATOR + "\n" + preamble + script_text(program)


def image_check_stdin(spec: ClusterSpec, ssh_private_key: str) -> str:
    """The image check's stdin: the key, then its program with what it asks (the payload)."""
    return staging_stdin(ssh_private_key, "image_check.py",
                         f"PAYLOAD = {image_check_payload(spec)!r}\n")


def _staging_prelude(spec: ClusterSpec, node: NodeSpec, what: str, secret_file: str,
                     env: bool = True) -> list[str]:
    """Split stdin into a 0600 secret file and the helper, in a directory removed on exit; a
    signal (Ctrl-C twice, a lost session) ends the script, and with it what it started."""
    return [
        *_prelude(spec, node, what),
        'fail() { log "FAILED: $*"; exit 1; }',
        f"command -v python3 >/dev/null 2>&1 || fail \"python3 is not installed: the {what} "
        "runs with it\"",
        "umask 077; work=$(mktemp -d)",
        "trap 'cleanup; rm -rf \"$work\"' EXIT",
        "trap 'exec >/dev/null 2>&1; exit 1' HUP INT TERM PIPE",
        "cleanup() { :; }",
        "awk -v s=" + shlex.quote(MANIFEST_SEPARATOR)
        + f" -v f=\"$work\"/{secret_file} -v m=\"$work\"/m.py "
        + shlex.quote('$0 == s { f = m; next } { print > f }'),
        *([f"export SPARK_VLLM_NODE={shlex.quote(node.name)}",
           f"hf={shlex.quote(spec.hf_cache)}; repo={shlex.quote(spec.model)}"] if env else []),
    ]


def stage_script(spec: ClusterSpec) -> str:
    """`create` of the head's staging command: the model complete in the head's hfCache,
    downloaded there first when missing (modelStaging: download), its manifest written; prints
    the manifest summary (commit, files, bytes, digest) as JSON."""
    head = spec.head
    rev = spec.model_revision or "main"
    name = f"{LABEL}-{spec.stack}-model-download"
    lines = [
        *_staging_prelude(spec, head, "model", "hf.env"),
        f"rev={shlex.quote(rev)}",
        'log "looking for $repo ($rev) in $hf"',
        'if python3 "$work"/m.py build "$hf" "$repo" "$rev" > "$work"/summary; then :',
        "else",
        '  rc=$?; [ "$rc" -eq 4 ] || fail "cannot read $repo in $hf (above)"',
    ]
    if spec.model_staging == "copy":
        lines += [
            '  fail "$repo ($rev) is not complete in hfCache $hf on $node (above); modelStaging: '
            'copy never downloads: put it there first (hf download), or set modelStaging: '
            'download"',
        ]
    else:
        env = []  # what reaches the Hub (HF_ENDPOINT, proxies), not HF_HUB_OFFLINE
        for key, value in download_env(spec).items():
            env += ["--env", f"{key}={value}"]
        run = shlex.join([
            "docker", "run", "--rm", "-i", "--name", name, "--network", "host",
            "--label", f"{LABEL}.stack={spec.stack}", "--label", f"{LABEL}.role=model-download",
            "--volume", f"{spec.hf_cache}:/root/.cache/huggingface", *env,
            "--entrypoint", "python3", spec.image, "-", "download", "/root/.cache/huggingface",
            spec.model, rev])
        lines += [
            f'  log "downloading $repo ($rev) into $hf with {spec.image}"',
            '  mkdir -p "$hf"',
            f"  cleanup() {{ docker rm --force {shlex.quote(name)} >/dev/null 2>&1 || true; }}",
            "  cleanup",
            f'  {run[:run.index(" --name")]} --env-file "$work"/hf.env{run[run.index(" --name"):]}'
            ' < "$work"/m.py > "$work"/dl.out 2> "$work"/dl.err &',
            "  dl=$!; start=$(date +%s); last=$start",
            '  while kill -0 "$dl" 2>/dev/null; do',
            "    sleep 1; now=$(date +%s)",
            f"    if [ $((now - last)) -ge {PROGRESS_EVERY_S} ]; then last=$now",
            "      total=$(awk '$1 == \"total\" {print $2}' \"$work\"/dl.out)",
            f"      have=$(du -sb {shlex.quote(model_repo_dir(spec))}/blobs 2>/dev/null | cut -f1)",
            '      log "downloading: ${have:-0} of ${total:-?} bytes after $((now - start)) s"',
            "    fi",
            "  done",
            '  if ! wait "$dl"; then sed "s/^/    | /" "$work"/dl.err | tail -n 20 >&2; '
            'fail "download of $repo ($rev) failed (above)"; fi',
            "  cleanup() { :; }",
            '  python3 "$work"/m.py build "$hf" "$repo" "$rev" > "$work"/summary '
            '|| fail "downloaded $repo ($rev), but it is not complete (above)"',
        ]
    lines += [
        "fi",
        'log "ready: $(cat "$work"/summary)"',
        'cat "$work"/summary',
    ]
    return "\n".join(lines) + "\n"


def copy_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """`create` of one node's copy command, run on the head: the head's model copied to `node`
    over the fabric (rsync over SSH to its identity IP, resumable, only what is missing) and
    verified there against the manifest; prints what it copied as JSON. The commit is the one
    the head's staging resolved, read there when the copy runs: nothing of the staging's
    output is in this script, so re-running the staging (it is cheap) never re-runs a copy."""
    head = spec.head
    dest = f"{node.user}@{node.identity_ip}"
    opts = ssh.options("$work/key", node.port, node.host_key, "$work/known_hosts")
    known_line = []
    if node.host_key:
        known = ssh.known_hosts_line(node.identity_ip, node.port, node.host_key)
        known_line = [f"printf '%s\\n' {shlex.quote(known)} > \"$work\"/known_hosts"]
    # $work is mktemp's (no spaces): rsync splits -e at spaces
    ssh_opts = " ".join(opts)
    to = f"{node.name} ({dest})"
    transport = "raw TCP (unencrypted)" if spec.copy_transport == "tcp" else "rsync over SSH"
    remote_hf = shlex.quote(shlex.quote(spec.hf_cache))  # quoted for the remote shell too
    lines = [
        *_staging_prelude(spec, head, f"model copy to {node.name}", "key"),
        f"rev={shlex.quote(spec.model_revision or 'main')}",
        'commit=$(python3 "$work"/m.py commit "$hf" "$repo" "$rev") '
        '|| fail "$repo ($rev) is not staged on the head: its staging command does that"',
        *known_line,
        f'ssh_opts="{ssh_opts}"',
        f"dest={shlex.quote(dest)}",
        'on_node() { ssh $ssh_opts "$dest" "$@"; }',
        # the helper on the node, its program on stdin: on_helper MODE
        "on_helper() { on_node python3 - \"$1\" " + remote_hf + " " + shlex.quote(
            shlex.quote(spec.model)) + ' "$commit" < "$work"/m.py; }',
        "command -v rsync >/dev/null 2>&1 || fail \"rsync is not installed on the head\"",
        'python3 "$work"/m.py files "$hf" "$repo" "$commit" > "$work"/files '
        '|| fail "no manifest of $repo at $commit on the head: the staging command writes it"',
        # the blobs' directory first: parallel transfers then never race to create it
        f"if ! out=$(on_node mkdir -p {shlex.quote(shlex.quote(model_repo_dir(spec) + '/blobs'))}"
        " 2>&1); then "
        f'fail "cannot reach {to} over the fabric from the head: $out"; fi',
        # the manifest first (it tells the node what to check), then what is missing there
        'grep "^spark-vllm/manifests/" "$work"/files > "$work"/manifest-file',
        'rsync -a -s -e "ssh $ssh_opts" --files-from="$work"/manifest-file "$hf"/ "$dest:$hf"/ '
        f'|| fail "cannot copy the manifest to {to}"',
        f'space=$(on_helper need) || fail "cannot read free space on {node.name}"',
        "set -- $(printf '%s' \"$space\" | python3 -c 'import json,sys; d=json.load(sys.stdin); "
        "print(d[\"need\"], d[\"free\"], d[\"path\"], d.get(\"cpus\", 1))')",
        f'if [ "$1" -gt "$2" ]; then fail "{node.name} has $(($2 / 1000000)) MB free on $3, the '
        f'model needs $(($1 / 1000000)) MB more there (hfCache {spec.hf_cache})"; fi',
        *_streams_lines(spec),
        f'log "copying $(($1 / 1000000)) MB of $repo to {to}: $streams {transport} stream(s)"',
        "start=$(date +%s.%N)",
        *(_tcp_copy_lines(spec, node, to) if spec.copy_transport == "tcp" else [
            'python3 "$work"/m.py push-rsync "$hf" "$work"/files "$streams" "$dest" "$ssh_opts" '
            + shlex.quote(f"copying to {node.name}") + ' > "$work"/sent '
            f'|| fail "rsync to {to} failed (above)"',
            'on_helper mark || fail "cannot record the copy on ' + node.name + '"',
        ]),
        'state=$(on_helper check) || fail "cannot check the copy on ' + node.name + '"',
        f'[ "$state" = complete ] || fail "after the copy, {node.name} has: $state"',
        # the transfer and the node's check, to the hundredth (the bench's ratios need it)
        'secs=$(awk -v a="$start" -v b="$(date +%s.%N)" \'BEGIN {printf "%.2f", b - a}\')',
        'sent=$(cat "$work"/sent 2>/dev/null || echo 0)',
        f'log "ready: {node.name} has $repo at $commit ($sent bytes sent in $secs s)"',
        f"""printf '{{"node": "%s", "commit": "%s", "missing": %s, "sent": %s, "seconds": %s}}\\n' """
        f'{shlex.quote(node.name)} "$commit" "$1" "$sent" "$secs"',
    ]
    return "\n".join(lines) + "\n"


# Streams of the weight copy with copyStreams auto: one per core of the smaller side (SSH
# encryption and rsync's checksums are CPU-bound; a Spark's 20 cores give 8), at most 8.
MAX_AUTO_STREAMS = 8


def _streams_lines(spec: ClusterSpec) -> list[str]:
    """$streams: copyStreams, or from the cores of the head (nproc) and of the node ($4)."""
    if spec.copy_streams != "auto":
        return [f"streams={int(spec.copy_streams)}"]
    return ["streams=$(nproc 2>/dev/null || echo 1)",
            '[ "$4" -lt "$streams" ] && streams=$4',
            f'[ "$streams" -gt {MAX_AUTO_STREAMS} ] && streams={MAX_AUTO_STREAMS}',
            '[ "$streams" -ge 1 ] || streams=1']


def _tcp_copy_lines(spec: ClusterSpec, node: NodeSpec, to: str) -> list[str]:
    """copyTransport tcp: the node's receiver listens on its identity IP (a port of its own
    choosing and a one-time token, both told back over SSH); the blobs travel over raw TCP,
    are hashed on arrival against their names; the rest (refs, snapshot links) over rsync."""
    ip = shlex.quote(shlex.quote(node.identity_ip))
    return [
        'on_node python3 - recv ' + shlex.quote(shlex.quote(spec.hf_cache)) + " "
        + shlex.quote(shlex.quote(spec.model)) + f' "$commit" {ip} "$streams" '
        '< "$work"/m.py > "$work"/recv.out 2> "$work"/recv.err &',
        "recv=$!",
        'cleanup() { kill "$recv" 2>/dev/null || true; }',
        'i=0; until read -r word port token 2>/dev/null < "$work"/recv.out '
        '&& [ "$word" = listening ]; do',
        '  kill -0 "$recv" 2>/dev/null || { sed "s/^/    | /" "$work"/recv.err >&2; '
        f'fail "the receiver on {node.name} did not start (above)"; }}',
        '  i=$((i + 1)); [ "$i" -lt 200 ] || fail "the receiver on ' + node.name
        + ' did not listen within 20 s"',
        "  sleep 0.1",
        "done",
        'python3 "$work"/m.py push-tcp "$hf" "$repo" "$commit" '
        f'{shlex.quote(node.identity_ip)} "$port" "$token" "$streams" '
        + shlex.quote(f"copying to {node.name}") + ' > "$work"/sent '
        f'|| {{ sed "s/^/    | /" "$work"/recv.err >&2; fail "the copy to {to} failed '
        '(above)"; }',
        'wait "$recv" || { sed "s/^/    | /" "$work"/recv.err >&2; '
        f'fail "the receiver on {node.name} failed (above)"; }}',
        "cleanup() { :; }",
        'sed "s/^/    | /" "$work"/recv.err >&2',
        'grep -v "/blobs/" "$work"/files > "$work"/links',
        'rsync -a -s -e "ssh $ssh_opts" --files-from="$work"/links "$hf"/ "$dest:$hf"/ '
        f'|| fail "cannot copy the snapshot links to {to}"',
    ]


# --- image consistency (image_check.py) --------------------------------------------------


def image_check_payload(spec: ClusterSpec) -> str:
    """What scripts/image_check.py asks: the tag, the pin, and how the head reaches each node."""
    return json.dumps({
        "image": spec.image, "imageDigest": spec.image_digest,
        "nodes": [{"name": n.name, "ip": n.identity_ip, "user": n.user, "port": n.port,
                   "hostKey": n.host_key or ""} for n in spec.nodes]}, sort_keys=True)


def image_check_script(spec: ClusterSpec) -> str:
    """`create` of the image check (on the head, after every node's preflight, before any
    container): asks every node now which image it holds under spec.image; prints the id, or
    the per-node table on stderr and fails. stdin: the SSH key, then the program."""
    return "\n".join([
        *_staging_prelude(spec, spec.head, "image check", "key", env=False),
        'id=$(python3 "$work"/m.py "$work"/key)',
        f'log "{spec.image} is $id on all {len(spec.nodes)} node(s)"; echo "$id"',
    ]) + "\n"
