"""ContainerLiveness: what `pulumi refresh` learns about a container the stack runs.

pulumi-command's `remote.Command` cannot be read back (pulumi/pulumi-command#432): after a
reboot or a crash, refresh would keep saying the container runs. Each container command
therefore has a companion dynamic resource (served by Pulumi's own pulumi-resource-pulumi-
python) whose `read` looks at the container over SSH and records what it sees in `state`:
"running", or e.g. "exited (137)", "gone", "running, not serving: …". The container command's
`triggers` hold the companion's id, so the companion's replacement replaces the container
and, through the chain's inputs, everything that depends on it (invariant 7):

    refresh:  state "running" => "exited (0)"        (the diff names what died)
    up:       companion replaced (state is not "running") → container replaced → dependents

Nothing else makes the companion change its id: a change of address, key or spark-vllm's own
code is an in-place update of the companion, which restarts nothing. Create and update touch
no node (the container command does the work), so `pulumi preview` needs no SSH.
"""

from __future__ import annotations

import shlex
import uuid
from typing import Any

import pulumi
from pulumi import dynamic

from . import ssh
from .render.commands import script_text
from .render.liveness_commands import inspect_script, liveness_timeout

RUNNING = "running"
COMPLETE = "complete"  # a staged model: every file of its manifest there, at its size
PRESENT = "present"  # a copied image: the node holds the head's image id under the tag
# The inputs that say which container, model or image; the rest say how to reach its node.
_KEYS = ("node", "host", "port", "user", "privateKey", "hostKey", "container", "serving",
         "hfCache", "model", "commit", "image", "imageId")


def _target(props: dict[str, Any]) -> ssh.Target:
    return ssh.Target(node=props["node"], host=props["host"], port=int(props["port"]),
                      user=props["user"], private_key=props["privateKey"],
                      host_key=props.get("hostKey") or None)


def observe(props: dict[str, Any]) -> str:
    """The container's (or model's) state as seen now on its node; raises when the node cannot
    say."""
    if props.get("model"):
        return observe_model(props)
    if props.get("imageId"):
        return observe_image(props)
    serving = props.get("serving") or None
    proc = ssh.run(_target(props), inspect_script(props["container"], serving),
                   stdin=script_text("vllm_liveness.py") if serving else "",
                   timeout=(liveness_timeout(serving) if serving else 30)
                   + 2 * ssh.CONNECT_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{props['node']}: cannot inspect {props['container']}: "
                           f"{proc.stderr.strip() or f'exit {proc.returncode}'}")
    # "running" covers serving, busy and unknown: a check that could not tell busy from wedged
    # (vllm_liveness.py COUNTED_AS_SERVING) or gave no verdict (inspect_script) replaces nothing
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "gone"


def observe_model(props: dict[str, Any]) -> str:
    """A staged model on its node: "complete", "incomplete: <file> is N bytes, not M" or
    "gone", by file sizes against the manifest the staging wrote there (no hashing)."""
    argv = ["python3", "-", "check", props["hfCache"], props["model"], props["commit"]]
    proc = ssh.run(_target(props), "PATH=\"$PATH:/usr/sbin:/sbin\"; " + shlex.join(argv),
                   stdin=script_text("model_manifest.py"), timeout=60)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{props['node']}: cannot check {props['model']}: "
                           f"{proc.stderr.strip() or f'exit {proc.returncode}'}")
    return lines[-1]


def observe_image(props: dict[str, Any]) -> str:
    """A copied image on its node: "present" (the head's id under the tag), "gone" or
    "another image: <id>" (a tag pulled or loaded over it)."""
    tag = shlex.quote(props["image"])
    proc = ssh.run(_target(props), f"docker image inspect --format '{{{{.Id}}}}' {tag} "
                   "2>/dev/null || echo gone", timeout=60)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{props['node']}: cannot inspect {props['image']}: "
                           f"{proc.stderr.strip() or f'exit {proc.returncode}'}")
    seen = lines[-1].strip()
    return PRESENT if seen == props["imageId"] else seen if seen == "gone" \
        else f"another image: {seen}"


def _expected(props: dict[str, Any]) -> str:
    if props.get("imageId"):
        return PRESENT
    return COMPLETE if props.get("model") else RUNNING


class _Provider(dynamic.ResourceProvider):
    # by reference (spark_vllm.liveness._Provider): spark-vllm's code is not in the state
    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        # the container does not exist yet: its command, which depends on this, starts it
        what = (props.get("container") or props.get("model", "").replace("/", "--")
                or props.get("image", "").replace("/", "--").replace(":", "_"))
        return dynamic.CreateResult(f"{what}@{props['node']}-{uuid.uuid4().hex[:8]}",
                                    {**props, "state": _expected(props)})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        if olds.get("state", _expected(olds)) != _expected(olds):
            return dynamic.DiffResult(changes=True, replaces=["state"],
                                      delete_before_replace=False)
        changed = [k for k in _KEYS if olds.get(k) != news.get(k)]
        return dynamic.DiffResult(changes=bool(changed), replaces=[])

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult({**news, "state": _expected(news)})

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_, {**props, "state": observe(props)})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # the container command's delete removes the container


# States hold the provider pickled by its module path. Stacks deployed before the components/
# move hold `spark_vllm.liveness._Provider`: that name stays (spark_vllm/liveness.py hands it
# on), so their refresh, preview and destroy load it, and a new state serializes byte for byte as
# an old one (no liveness resource changes on the upgrade).
_Provider.__module__ = "spark_vllm.liveness"


class ContainerLiveness(dynamic.Resource):
    """The refresh-time view of one container (see the module docstring)."""

    state: pulumi.Output[str]

    def __init__(self, name: str, *, node: Any, container: str,
                 serving: list[str] | None, parent: pulumi.Resource) -> None:
        spec = node.node
        props = {
            "node": spec.name, "host": spec.host, "port": spec.port, "user": spec.user,
            "privateKey": node.connection.private_key, "hostKey": spec.host_key or "",
            "container": container, "serving": serving or [],
            "state": RUNNING,  # what should be: a diff after a refresh reads "exited (137)" => "running"
        }
        super().__init__(_Provider(), name, props, pulumi.ResourceOptions(
            parent=parent, additional_secret_outputs=["privateKey"]))


class ModelLiveness(dynamic.Resource):
    """The refresh-time view of one node's staged model: a copy found short or missing is
    staged again by `pulumi up --refresh` (the copy command's triggers hold this id); nothing
    that runs is restarted for it."""

    state: pulumi.Output[str]

    def __init__(self, name: str, *, node: Any, hf_cache: str, model: str,
                 commit: pulumi.Input[str], parent: pulumi.Resource) -> None:
        spec = node.node
        props = {
            "node": spec.name, "host": spec.host, "port": spec.port, "user": spec.user,
            "privateKey": node.connection.private_key, "hostKey": spec.host_key or "",
            "hfCache": hf_cache, "model": model, "commit": commit, "state": COMPLETE,
        }
        super().__init__(_Provider(), name, props, pulumi.ResourceOptions(
            parent=parent, additional_secret_outputs=["privateKey"]))


class ImageLiveness(dynamic.Resource):
    """The refresh-time view of the image copied to one node (imageStaging copy): an image
    pruned there, or another one under its tag, is copied again by `pulumi up --refresh` (the
    copy command's triggers hold this id); nothing that runs is restarted for it."""

    state: pulumi.Output[str]

    def __init__(self, name: str, *, node: Any, image: str, image_id: pulumi.Input[str],
                 parent: pulumi.Resource) -> None:
        spec = node.node
        props = {
            "node": spec.name, "host": spec.host, "port": spec.port, "user": spec.user,
            "privateKey": node.connection.private_key, "hostKey": spec.host_key or "",
            "image": image, "imageId": image_id, "state": PRESENT,
        }
        super().__init__(_Provider(), name, props, pulumi.ResourceOptions(
            parent=parent, additional_secret_outputs=["privateKey"]))
