"""The refresh-time read of a container, pure: its state, and for vLLM's API server how it
serves (scripts/vllm_liveness.py on stdin). liveness.py's provider and `spark-vllm status`
run it over SSH.
"""

from __future__ import annotations

import shlex

from ..spec import ClusterSpec
from .commands import probe_target

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
