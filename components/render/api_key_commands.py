"""The API key's own file on the API server's node, pure: the command that writes it (stdin,
atomically), the one that removes it, and the `docker run` options that mount it for the
middleware (scripts/spark_vllm_auth.py). node.py's api_key_command runs them.
"""

from __future__ import annotations

import shlex

from ..spec import ClusterSpec, NodeSpec
from .commands import LABEL, STATE_DIR_SH, owner, prelude

# The API key lives in a file of its own on the API server's node, in a directory of the
# stack's state dir that the API server's container mounts read-only (a directory, not the
# file: a file's bind mount keeps the inode it was made with, and the key is replaced by a
# rename). The middleware (scripts/spark_vllm_auth.py) reads the file named by KEY_FILE_ENV and
# reads it again when it changes, so a rotation is written in place and restarts nothing; vLLM
# never gets VLLM_API_KEY (its own check would keep the key it started with).
API_KEY_DIR = "api-key"
API_KEY_FILE = "key"
KEY_MOUNT = "/spark-vllm-key"
KEY_FILE_ENV = "SPARK_VLLM_API_KEY_FILE"


def api_key_dir(spec: ClusterSpec) -> str:
    """The key's directory on the node, as the container's argv names it: `~/` is the SSH
    user's home (expanded by the node's shell: sh_join)."""
    return f"~/.spark-vllm/{owner(spec)}/{API_KEY_DIR}"


def api_key_args(spec: ClusterSpec) -> list[str]:
    """`docker run` options of the API server's container when apiKey is set: the key's
    directory, read-only, and where the middleware finds the key in it."""
    if "apiKey" not in spec.secrets_set:
        return []
    return ["--volume", f"{api_key_dir(spec)}:{KEY_MOUNT}:ro",
            "--env", f"{KEY_FILE_ENV}={KEY_MOUNT}/{API_KEY_FILE}"]




def api_key_text(api_key: str) -> str:
    """The key file's content (stdin of api_key_script). Only called inside `Output.apply`."""
    if not api_key or any(ord(c) < 32 or ord(c) == 127 for c in api_key):
        raise ValueError("apiKey must be one line of printable characters")
    return api_key


def api_key_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """`create` and `update` of the API key's command: stdin (the key) into the key file,
    atomically (a file of the same directory, 0600, renamed over the old one), so the
    middleware reads the old key or the new one, never a part. No container is touched."""
    d = f'{STATE_DIR_SH}"$stack"/{API_KEY_DIR}'
    return "\n".join([
        *prelude(spec, node, "API key"),
        f"stack={shlex.quote(owner(spec))}",
        f"umask 077; mkdir -p {d}; cd {d}",
        "trap 'rm -f .key.new' EXIT",
        "cat > .key.new",
        '[ -s .key.new ] || { log "FAILED: no key on stdin"; exit 1; }',
        f"mv -f .key.new {API_KEY_FILE}",
        f'log "API key written to ~/.spark-vllm/$stack/{API_KEY_DIR}/{API_KEY_FILE} (0600): '
        'the API server reads it at its next request"',
    ]) + "\n"


def api_key_remove_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """`delete` of the API key's command: the file and its directory; idempotent. Kept while
    a container of the stack still mounts it: a backend switch or a renamed head creates the
    new key command (and container) before the engine deletes the old command, at the end."""
    if spec.model_key is not None:  # a served model's: its own containers carry its label
        readers = (f"docker ps -aq --filter label={LABEL}.stack={shlex.quote(spec.stack)} "
                   f"--filter label={LABEL}.model={shlex.quote(spec.model_key)} "
                   f"--filter volume={KEY_MOUNT} 2>/dev/null")
    elif spec.several:
        # the gateway's (several models): read by a container of the stack with no model label
        # (the gateway, or a single model's after a switch back); each model's containers
        # mount their own model's file, so they do not keep this one
        readers = (f'docker ps -a --filter label={LABEL}.stack="$stack" --filter '
                   f"volume={KEY_MOUNT} --format '{{{{.ID}}}} {{{{.Label \"{LABEL}.model\"}}}}' "
                   "2>/dev/null | awk 'NF == 1'")
    else:
        readers = (f'docker ps -aq --filter label={LABEL}.stack="$stack" '
                   f"--filter volume={KEY_MOUNT} 2>/dev/null")
    return "\n".join([
        *prelude(spec, node, "remove API key"),
        f"stack={shlex.quote(owner(spec))}",
        f'if [ -n "$({readers})" ]; then',
        '  log "kept: a container of this stack still reads it"; exit 0',
        "fi",
        f'rm -f {STATE_DIR_SH}"$stack"/{API_KEY_DIR}/{API_KEY_FILE} '
        f'{STATE_DIR_SH}"$stack"/{API_KEY_DIR}/.key.new',
        f'rmdir {STATE_DIR_SH}"$stack"/{API_KEY_DIR} 2>/dev/null || true',
        f'rmdir {STATE_DIR_SH}"$stack" 2>/dev/null || true',
    ]) + "\n"
