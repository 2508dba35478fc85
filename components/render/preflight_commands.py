"""The preflight of one node, before any container (invariant 5): docker, GPUs, the identity
address on its interface, the image and what it holds; prints one JSON line the gate, the
image check and a reviewer read."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..spec import ClusterSpec, NodeSpec
from .commands import (
    HEAD,
    LABEL,
    LEADER,
    RANK,
    STATE_DIR_SH,
    VLLM,
    WORKER,
    container_name,
    prelude,
)

# Prints "RAY PYTHON VLLM" for an image ("none" for an image without Ray: vLLM dropped it as a
# dependency, vllm#36170); run once per image id by the preflight. vLLM's own CLI says its
# version (`vllm --version`, the last word it prints), as in every release.
VERSIONS_PY = (
    "import subprocess, sys\n"
    "try:\n"
    "    import ray\n"
    "    ray_version = ray.__version__\n"
    "except ImportError:\n"
    "    ray_version = 'none'\n"
    "try:\n"
    "    out = subprocess.run(['vllm', '--version'], capture_output=True, text=True, timeout=300)\n"
    "    vllm = out.stdout.split()[-1] if out.returncode == 0 and out.stdout.split() else ''\n"
    "except OSError:\n"
    "    vllm = ''\n"
    "if not vllm:\n"
    "    sys.exit('no vllm command in the image')\n"
    "print(ray_version, sys.version.split()[0], vllm)\n"
)


def stop_other_backend(spec: ClusterSpec, roles: Sequence[str], other: str) -> str:
    """In each node's preflight: stop the other backend's containers of this stack on the
    node. A backend switch renames every resource, and the engine deletes resources that left
    the program only after it created the new ones (its deletes run last); the preflights run
    before any container, so every old one is gone, on every node, before the first new one
    starts. The old resources' deletes then find nothing to remove."""
    return _stop_each(" ".join(shlex.quote(container_name(spec, r)) for r in roles),
                      f"backend {other}'s, replaced by backend {spec.backend}")


def _stop_each(names_sh: str, why: str) -> str:
    """Stop each container `names_sh` (shell words) names that exists, saying why."""
    return (f"for old in {names_sh}; do if docker inspect \"$old\" >/dev/null 2>&1; then "
            f'log "stopping $old ({why})"; '
            'docker rm --force --volumes "$old" >/dev/null 2>&1 || fail "cannot stop $old"; '
            "fi; done")


def _missing_image(spec: ClusterSpec, node: NodeSpec) -> str:
    """The preflight's words for an image its node must hold and does not."""
    if spec.image_staging == "none":
        how = ("imageStaging: none, nothing fetches it; put it there (docker pull "
               f"{spec.image}, or docker save IMAGE | ssh {node.name} docker load), or set "
               "imageStaging: copy to copy the head's")
    elif spec.image_pull == "never" and spec.image_staging == "copy":
        how = (f"imagePull: never; pull or build it on {node.name}, the head (docker pull "
               f"{spec.image}), or let imagePull: missing pull it there: the image copy brings "
               "it to the other nodes")
    else:  # imageStaging pull's words since before imageStaging
        return (f"image {spec.image} is not on the node (imagePull: {spec.image_pull}); load "
                "it with: docker save IMAGE | ssh NODE docker load")
    return f"image {spec.image} is not on {node.name} ({how})"


def stop_other_shape(spec: ClusterSpec) -> str:
    """In each node's preflight, as stop_other_backend: a stack that goes from one model to
    several (`models:`) stops its one model's containers (the gateway takes its port), and one
    that goes back stops its models' and the gateway."""
    if spec.several:
        return stop_other_backend(spec, (HEAD, VLLM, WORKER, LEADER, RANK), "the one model")
    q = shlex.quote
    return _stop_each(f"$(docker ps -aq --filter label={LABEL}.stack={q(spec.stack)} "
                      f"--filter label={LABEL}.model) {q(container_name(spec, 'gateway'))}",
                      "the served models' and gateway's, replaced by one model")


def preflight_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """Checks one node before any container starts (invariant 5); prints a JSON summary."""
    q = shlex.quote
    image = q(spec.image)
    lines = [
        *prelude(spec, node, "preflight"),
        'fail() { log "FAILED: $*"; exit 1; }',
        "command -v docker >/dev/null 2>&1 || fail \"docker is not installed or not on PATH\"",
        'docker_v=$(docker version --format "{{.Server.Version}}" 2>&1) '
        '|| fail "docker daemon not reachable as $(id -un): $docker_v"',
        # a backend switch: the other backend's containers go before any new one starts
        stop_other_backend(spec, *(((HEAD, VLLM, WORKER), "ray") if spec.backend == "native"
                                   else ((LEADER, RANK), "native"))),
        stop_other_shape(spec),
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
    head = node.name == spec.head.name
    # imageStaging copy: only the head pulls (per imagePull); another node gets the head's image
    # from the image copy, after its preflight, so the image may be missing here (its versions
    # are then the head's: the image check compares the ids once the copy is done)
    receives = spec.image_staging == "copy" and not head
    pulls = spec.image_staging == "pull" or (spec.image_staging == "copy" and head)
    if pulls and spec.image_pull == "always":
        lines.append(f'log "pulling {spec.image}"; docker pull --quiet {image} >&2 '
                     f'|| fail "docker pull {spec.image} failed"')
    elif pulls and spec.image_pull == "missing":
        lines.append(f"docker image inspect {image} >/dev/null 2>&1 || {{ log \"pulling "
                     f"{spec.image}\"; docker pull --quiet {image} >&2 || fail \"docker pull "
                     f"{spec.image} failed\"; }}")
    inspect = f"image_id=$(docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null)"
    if receives:
        lines.append(f"{inspect} || image_id=")
    else:
        lines.append(f'{inspect} || fail "{_missing_image(spec, node)}"')
    lines += [
        # Ray is optional in vLLM images since 0.18, head/worker must run the same Ray and
        # Python (ray#50511), and vLLM's version decides its Ray executor (legacy < 0.18 pins
        # `node:<VLLM_HOST_IP>`; RayExecutorV2 does not): read all three from the image here,
        # not after a failed join. Starting a container that imports Ray (and `vllm --version`,
        # seconds on a real image) costs CPU on every cold up, so the answer is kept per image
        # id (a content hash: it cannot go stale) in a file outside any stack's directory.
        f"cache={STATE_DIR_SH}image-versions/\"${{image_id#sha256:}}\"",
        *(['if [ -z "$image_id" ]; then versions="- - -"  # the image copy brings the head\'s',
           'elif versions=$(cat "$cache" 2>/dev/null) && [ "$(echo $versions | wc -w)" -eq 3 ]; '
           'then :'] if receives else
          ['if versions=$(cat "$cache" 2>/dev/null) && [ "$(echo $versions | wc -w)" -eq 3 ]; '
           'then :']),
        f"else versions=$(docker run --rm --network none --entrypoint python3 {image} -c "
        + q(VERSIONS_PY)
        + ' 2>&1) || fail "image has no python3 with vllm: '
        '$(echo "$versions" | tail -n 3)"',
        '  versions=$(echo "$versions" | tail -n 1)',
        f"  mkdir -p {STATE_DIR_SH}image-versions && "
        'echo "$versions" > "$cache.$$" && mv -f "$cache.$$" "$cache" || true',
        "fi",
        "set -- $versions",
    ]
    if spec.backend == "ray":
        lines.append(f'[ "$1" != none ] || fail "image {spec.image} has no Ray (python3 cannot '
                     'import ray): backend ray starts Ray from it; use an image with Ray, or '
                     "set backend: native (vLLM's own multi-node, no Ray)\"")
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
