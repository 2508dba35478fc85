"""Several served models on one cluster (`models:`), and the gateway in front of them.

Pure: no Pulumi import. A stack without `models:` is today's single-model stack, unchanged: its
top-level model, tensorParallelSize, vllmArgs … are the one model. With `models:`, each entry
is one vLLM deployment over some of the nodes (default: all), with its own model, layout, args,
env and ports; the stack keeps what the models share: the nodes, the image (one check, one
staging), modelStaging, the secrets. `views` turns each entry into a ClusterSpec of its own
(its nodes, its settings, `model_key` set), so every component that deploys one model deploys
each of them unchanged, under names of their own (render/commands.py container_name).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from .spec_base import Strict, env_numbers, printable

if TYPE_CHECKING:
    from .spec import NodeSpec, _Settings

# short: it is part of every container's and resource's name (<label>-<stack>-<name>-<role>)
_MODEL_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$"
# the stack-level keys that `models:` entries hold each for themselves
PER_MODEL_KEYS = ("model", "modelRevision", "servedModelName", "tensorParallelSize",
                  "pipelineParallelSize", "vllmArgs", "maxModelLen")
GATEWAY_DEFAULT_IMAGE_NOTE = "docs/configuration.md#several-models"


class ServedModel(Strict):
    """One entry of `models:`: one vLLM deployment."""

    name: str  # names its containers and resources: [a-z0-9-], 1-20
    model: str = Field(min_length=1, pattern=r"^[^\s]+$")
    model_revision: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
    served_model_name: str | None = Field(None, pattern=r"^[^\s]+$")
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    # the nodes it spans, by name, the first one running its rank 0 and API server (default:
    # every node, in the stack's order)
    nodes: tuple[str, ...] | None = None
    vllm_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)  # over the stack's env
    # its API server, on its first node (default: the stack's port + 1 + its index), and its
    # rank 0's rendezvous (default: the stack's masterPort + 1 + its index)
    port: int | None = Field(None, ge=1, le=65535)
    master_port: int | None = Field(None, ge=1, le=65535)
    max_model_len: int | Literal["auto"] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(_MODEL_NAME_RE, v):
            raise ValueError(f"{v!r} must be 1-20 of [a-z0-9-], starting and ending with a "
                             "letter or digit")
        return v

    @field_validator("nodes", "vllm_args", mode="before")
    @classmethod
    def _tuple(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    _env_numbers = field_validator("env", mode="before")(env_numbers)  # as the stack's

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model


class GatewaySettings(Strict):
    """`gateway:`, the one endpoint in front of several models (only with `models:`): LiteLLM's
    proxy on nodes[0], on the stack's `port`, routing by the request's `model`."""

    # an image with LiteLLM's proxy (`litellm --config`), e.g. ghcr.io/berriai/litellm at a
    # pinned tag; the lab builds its own from PyPI (lab/images.py)
    image: str | None = Field(None, pattern=r"^[^\s]+$")
    image_pull: Literal["always", "missing", "never"] = "missing"
    # seconds the gateway waits for one model's answer (LiteLLM's request_timeout)
    request_timeout: int = Field(600, ge=1, le=86400)


def model_port(settings: _Settings, index: int, model: ServedModel) -> int:
    return model.port if model.port is not None else settings.port + 1 + index


def model_master_port(settings: _Settings, index: int, model: ServedModel) -> int:
    return model.master_port if model.master_port is not None \
        else settings.master_port + 1 + index


def placed_nodes(model: ServedModel, nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
    """The model's nodes in its own order (its first runs rank 0), or every node."""
    by_name = {n.name: n for n in nodes}
    if model.nodes is None:
        return list(nodes)
    return [by_name[n] for n in model.nodes if n in by_name]


def view_settings(settings: _Settings, index: int, model: ServedModel) -> _Settings:
    """The stack's settings as one model's deployment sees them."""
    return settings.model_copy(update={
        "model": model.model, "model_revision": model.model_revision,
        "served_model_name": model.served_model_name,
        "tensor_parallel_size": model.tensor_parallel_size,
        "pipeline_parallel_size": model.pipeline_parallel_size,
        "vllm_args": model.vllm_args, "env": {**settings.env, **model.env},
        "port": model_port(settings, index, model),
        "master_port": model_master_port(settings, index, model),
        "max_model_len": model.max_model_len, "models": None})


def _prefixed(i: int, problem: str) -> str:
    return f"models[{i}].{problem}"


def models_problems(settings: _Settings, nodes: Sequence[NodeSpec], set_keys: set[str],
                    settings_problems: Any, cluster_problems: Any) -> list[str]:
    """Every problem of a stack with `models:` (`set_keys`: the top-level keys the config sets;
    `settings_problems`/`cluster_problems`: spec_checks', run on each model's view)."""
    models = settings.models or ()
    out: list[str] = []
    if not models:
        return ["models: an empty list; list at least one model, or remove models and set the "
                "top-level model"]
    for key in PER_MODEL_KEYS:
        if key in set_keys:
            out.append(f"{key}: with models, each model sets its own (models[].{key}); remove "
                       "the top-level one")
    if settings.backend != "native":
        out.append(f"backend: several models are served on backend native only (distinct ports "
                   f"per model); {settings.backend} runs one vLLM per Ray cluster "
                   "(docs/backends.md#several-models): set backend: native")
    if not settings.gateway.image:
        out.append("gateway.image: required with models: an image with LiteLLM's proxy "
                   f"(`litellm --config`), pinned to a tag ({GATEWAY_DEFAULT_IMAGE_NOTE})")
    names: dict[str, int] = {}
    served: dict[str, int] = {}
    known = {n.name for n in nodes}
    # per node: which port (and for what) is taken, to refuse two listeners on one port
    taken: dict[str, dict[int, str]] = {}
    if nodes:
        taken[nodes[0].name] = {settings.port: "the gateway (port)"}
    for i, m in enumerate(models):
        if m.name in names:
            out.append(f"models[{i}].name: {m.name!r} already used by models[{names[m.name]}]")
        names.setdefault(m.name, i)
        if m.served_name in served:
            out.append(f"models[{i}].servedModelName: {printable(m.served_name)!r} is also "
                       f"models[{served[m.served_name]}]'s; the gateway routes by it: give each "
                       "model its own")
        served.setdefault(m.served_name, i)
        if m.nodes is not None:
            if not m.nodes:
                out.append(f"models[{i}].nodes: empty; name at least one node (or remove it: "
                           "every node)")
            for j, n in enumerate(m.nodes):
                if n not in known:
                    out.append(f"models[{i}].nodes[{j}]: {printable(n)!r} is not a node "
                               f"({', '.join(sorted(known)) or 'none'})")
                elif m.nodes.index(n) != j:
                    out.append(f"models[{i}].nodes[{j}]: {n!r} listed twice")
        placed = placed_nodes(m, nodes)
        view = view_settings(settings, i, m)
        own = {f"env.{k}" for k in m.env}
        for p in settings_problems(view):
            head = p.split(":", 1)[0]
            if head.startswith(("vllmArgs", "maxModelLen", "model:", "port")) or head in own \
                    or p.startswith("model:"):
                out.append(_prefixed(i, p))
        if placed and len(placed) == len(m.nodes or placed):
            for p in cluster_problems(placed, view):
                if p.startswith("tensorParallelSize") or p.startswith("nodes:"):
                    out.append(_prefixed(i, p.replace("the GPUs of all nodes",
                                                      "the GPUs of its nodes")))
            listeners = {view.port: f"models[{i}] ({m.name}) port",
                         view.master_port: f"models[{i}] ({m.name}) masterPort"}
            if view.port == view.master_port:
                continue  # settings_problems named it
            for port, what in listeners.items():
                on = taken.setdefault(placed[0].name, {})
                if port in on:
                    field = "port" if what.endswith(" port") else "masterPort"
                    out.append(f"models[{i}].{field}: {port} on {placed[0].name} is already "
                               f"{on[port]}'s; each listener on a node needs its own port")
                else:
                    on[port] = what
    return out
