"""The gateway's container, pure: LiteLLM's proxy on nodes[0], on the stack's `port`, routing by
the request's `model` to each served model's vLLM (spec_models.py), behind the stack's API-key
middleware (scripts/spark_vllm_gateway.py says how).

Why LiteLLM's proxy: it routes by the request's `model`, lists every model in an OpenAI
`/v1/models`, streams, and is what the field puts in front of several vLLMs (sparkrun's
gateway). The vLLM project's own router (PyPI vllm-router 0.1.17) was tried first, on two
vLLMs of the lab: its multi-model mode (--enable-igw) took no --worker-urls, listed its
workers as `{"models": ["unknown"]}` (not the OpenAI shape, not their names), and its
/workers routes (add, remove a backend) answered with no key at all (docs/backends.md).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any

from ..spec import ClusterSpec
from . import api_key_commands
from .commands import (
    LABEL,
    LISTENING_SH,
    STATE_DIR_SH,
    _wait_loop,
    container_name,
    env_file_name,
    remove_script,
    script_text,
    start_script,
)

GATEWAY = "gateway"
GATEWAY_MOUNT = "/spark-vllm-gateway"
GATEWAY_DIR = "gateway"  # beside the stack's env-files on nodes[0]
READY_TIMEOUT_S = 180  # LiteLLM's import and start: ~10 s on the lab
# stdin of the gateway's command: its env-file, then each file of its directory
FILE_SEPARATOR = "#--- spark-vllm: gateway file follows: "
FILES = ("config.yaml", "spark_vllm_gateway.py", "spark_vllm_auth.py")
# LiteLLM's switches: no fetch of its price map at start (nodes need no internet), no admin UI,
# no API docs page
LITELLM_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "DISABLE_ADMIN_UI": "True",
               "NO_DOCS": "True"}


def routes(spec: ClusterSpec) -> list[dict[str, Any]]:
    """Each served model: its name, and its vLLM's address (its first node's identity IP)."""
    return [{"model": v.served_name, "key": v.model_key,
             "apiBase": f"http://{v.head.identity_ip}:{v.port}/v1"} for v in spec.views()]


def config(spec: ClusterSpec) -> dict[str, Any]:
    """LiteLLM's config (JSON, which its YAML loader reads): one deployment per model."""
    key = "os.environ/SPARK_VLLM_UPSTREAM_KEY"
    return {"model_list": [{"model_name": r["model"],
                            "litellm_params": {"model": f"hosted_vllm/{r['model']}",
                                               "api_base": r["apiBase"], "api_key": key}}
                           for r in routes(spec)],
            "litellm_settings": {"request_timeout": spec.gateway.request_timeout,
                                 "drop_params": False}}


def files(spec: ClusterSpec) -> dict[str, str]:
    return {"config.yaml": json.dumps(config(spec), indent=1, sort_keys=True) + "\n",
            "spark_vllm_gateway.py": script_text("spark_vllm_gateway.py"),
            "spark_vllm_auth.py": script_text("spark_vllm_auth.py")}


def stdin(spec: ClusterSpec) -> str:
    """The command's stdin: an env-file (nothing secret: the key is in its own file), then the
    gateway's files, each after its separator line."""
    out = ["# the gateway's env is on its docker run line; its key is in the key file"]
    for name, text in files(spec).items():
        out += [FILE_SEPARATOR + name, text.rstrip("\n")]
    return "\n".join(out) + "\n"


def gateway_dir_sh(spec: ClusterSpec) -> str:
    return f'{STATE_DIR_SH}"$stack"/{GATEWAY_DIR}'


def run_argv(spec: ClusterSpec) -> list[str]:
    head = spec.head
    argv = ["docker", "run", "--detach", "--name", container_name(spec, GATEWAY),
            "--label", f"{LABEL}.stack={spec.stack}", "--label", f"{LABEL}.role={GATEWAY}",
            "--label", f"{LABEL}.node={head.name}",
            "--label", f"{LABEL}.identity={head.identity_ip}",
            "--network", "host", "--restart", "no",
            "--volume", f"~/.spark-vllm/{spec.stack}/{GATEWAY_DIR}:{GATEWAY_MOUNT}:ro",
            *api_key_commands.api_key_args(spec),
            "--env-file", env_file_name(GATEWAY)]
    for k, v in LITELLM_ENV.items():
        argv += ["--env", f"{k}={v}"]
    return [*argv, "--entrypoint", "python3", spec.gateway.image,
            f"{GATEWAY_MOUNT}/spark_vllm_gateway.py", spec.api_host, str(spec.port)]


def start(spec: ClusterSpec) -> str:
    """`create`: the files from stdin into the gateway's directory, the image pulled per
    gateway.imagePull, the container, ready once it listens on `port`."""
    d = gateway_dir_sh(spec)
    split = (f"rm -rf {d}; mkdir -p {d}; mv {env_file_name(GATEWAY)} .gateway.in; "
             "awk -v s=" + shlex.quote(FILE_SEPARATOR) + f" -v e={env_file_name(GATEWAY)} -v d={d} "
             + shlex.quote('BEGIN { f = e } index($0, s) == 1 { f = d "/" substr($0, length(s) + 1); '
                           "next } { print > f }") + " .gateway.in; rm -f .gateway.in")
    image = shlex.quote(spec.gateway.image)
    pull = {"always": [f"docker pull {image} >&2 || fail 'cannot pull {spec.gateway.image}'"],
            "missing": [f"docker image inspect {image} >/dev/null 2>&1 || docker pull {image} >&2 "
                        f"|| fail 'cannot pull {spec.gateway.image}'"],
            "never": [f"docker image inspect {image} >/dev/null 2>&1 || fail "
                      f"'{spec.gateway.image} is not on {spec.head.name} (gateway.imagePull: "
                      "never)'"]}[spec.gateway.image_pull]
    listening = LISTENING_SH.format(port=spec.port)
    ready = _wait_loop(listening, READY_TIMEOUT_S, f"the gateway on port {spec.port}", [])
    return start_script(spec, spec.head, GATEWAY, run_argv(spec),
                        before_run=[split, *pull], ready=ready)


def remove(spec: ClusterSpec) -> str:
    """`delete`: the container, its env-file and its directory; idempotent."""
    return remove_script(spec, spec.head, GATEWAY).rstrip("\n") + "\n" + "\n".join([
        f"rm -rf {gateway_dir_sh(spec)}",
        f'rmdir {STATE_DIR_SH}"$stack" 2>/dev/null || true',
    ]) + "\n"


def facts(spec: ClusterSpec) -> dict[str, Any]:
    """What the gateway is, as a reviewer reads it: where it listens, what it routes to, its
    image and the digests of the files it runs. A model's args or env are no part of it."""
    return {"node": spec.head.name, "host": spec.head.host, "user": spec.head.user,
            "image": spec.gateway.image, "port": spec.port, "apiHost": spec.api_host,
            "routes": routes(spec), "requestTimeout": spec.gateway.request_timeout,
            "argv": run_argv(spec),
            "files": {n: hashlib.sha256(t.encode()).hexdigest()[:16]
                      for n, t in files(spec).items() if n != "config.yaml"}}
