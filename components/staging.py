"""ModelStaging: the model's weights on every node before any Ray container (modelStaging).

    model-stage (head)          the model complete in the head's hfCache: found there, or
                                downloaded once with the image's huggingface_hub and the hfToken
                                (download); every blob hashed once (the cache keys on size and
                                mtime, so a rerun hashes only what changed); a manifest written
    model-copy-<node> (head)    per other node, in parallel: rsync over SSH to the node's
                                identity (fabric) IP, only what is missing, resumable
                                (--partial --append-verify), free space checked first; then the
                                node's copy checked against the manifest

Each has a refresh-time companion (liveness.ModelLiveness) that checks the files' sizes on its
node: a shard found short or missing is staged again by `pulumi up --refresh`. Containers
depend on the staging but do not hold it in their triggers: re-copying a shard that a running
vLLM already loaded restarts nothing, and a model or revision change reaches vLLM through its
own facts. The containers run with HF_HUB_OFFLINE=1: no node fetches anything on its own.
Destroy leaves the weights in hfCache (a cache, and 120 GB).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi

from .liveness import ModelLiveness
from .node import SparkNode, node_command
from .render import commands, staging_commands
from .spec import ClusterSpec


@dataclass(frozen=True)
class ModelStagingArgs:
    spec: ClusterSpec
    nodes: list[SparkNode]  # nodes[0] is the head: the source of every copy
    ssh_private_key: pulumi.Input[str]  # secret: the head reaches the others with it
    hf_token: pulumi.Input[str] | None = None  # secret
    after: tuple[pulumi.Resource, ...] = ()


class ModelStaging(pulumi.ComponentResource):
    summary: pulumi.Output[dict[str, Any]]
    stage: pulumi.Resource  # the weights on the head (fetched there once)
    copies: list[pulumi.Resource]  # head -> each other node, verified

    def __init__(self, name: str, args: ModelStagingArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spark-vllm:model:ModelStaging", name, None, opts)
        spec, nodes = args.spec, args.nodes
        head = nodes[0]
        what = _what(spec)
        head_live = ModelLiveness(f"{name}-stage-liveness", node=head, hf_cache=spec.hf_cache,
                                  model=spec.model, commit=what["revision"], parent=self)
        download = ({"image": spec.image, "downloadEnv": staging_commands.download_env(spec)}
                    if spec.model_staging == "download" else {})
        self.stage = node_command(
            f"{name}-stage", self, head,
            create=staging_commands.stage_script(spec),
            stdin=_secret_stdin(args.hf_token, lambda tok: commands.secret_env_file(
                staging_commands.MODEL_ROLE, tok)),
            triggers=[{"node": head.node.name, "host": head.node.host, **what,
                       "modelStaging": spec.model_staging, **download},
                      {"liveness": head_live.id}],
            depends_on=list(args.after),
        )
        self.summary = self.stage.stdout.apply(lambda s: json.loads(s.strip().splitlines()[-1]))
        # what the copies need, made after the fabric check (program.py: `copy`)
        self._name, self._args, self._head_live = name, args, head_live
        self.copies = []
        self.register_outputs({"summary": self.summary})

    def copy(self, after: list[pulumi.Resource]) -> list[pulumi.Resource]:
        """The copies to the other nodes, after `after` (the fabric check's gate: the fabric is
        measured while nothing else moves data over it, and a refused fabric copies nothing)."""
        name, args, spec = self._name, self._args, self._args.spec
        head, what = args.nodes[0], _what(spec)
        for n in args.nodes[1:]:
            # the copy's inputs hold nothing of the staging's output: a staging that runs again
            # (an image change, say; it finds the model and hashes nothing) copies nothing
            # and shows no copy in a preview. A head whose copy was found damaged is staged
            # again and copied from again (headCopy)
            live = ModelLiveness(f"{name}-copy-{n.node.name}-liveness", node=n,
                                 hf_cache=spec.hf_cache, model=spec.model,
                                 commit=what["revision"], parent=self)
            self.copies.append(node_command(
                f"{name}-copy-{n.node.name}", self, head,
                create=staging_commands.copy_script(spec, n.node),
                stdin=_secret_stdin(args.ssh_private_key, _as_is),
                triggers=[{"node": n.node.name, "to": n.node.identity_ip, **what},
                          {"headCopy": self._head_live.id, "liveness": live.id}],
                depends_on=[self.stage, n.preflight, *after],
            ))
        return self.copies


def _what(spec: ClusterSpec) -> dict[str, str]:
    """Which model, revision and cache: in the staging's and every copy's triggers."""
    return {"model": spec.model, "revision": spec.model_revision or "main",
            "hfCache": spec.hf_cache}


def _as_is(key: str | None) -> str:
    return key or ""


def _secret_stdin(value: pulumi.Input[str] | None, secret_part: Any) -> pulumi.Output[str]:
    """The staging helper behind a secret (the env-file with HF_TOKEN, or the SSH key)."""
    if value is None:
        return pulumi.Output.from_input(staging_commands.staging_stdin(secret_part(None)))
    return pulumi.Output.secret(value).apply(lambda v: staging_commands.staging_stdin(secret_part(v)))
