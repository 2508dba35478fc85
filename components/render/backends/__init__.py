"""How the ranks find each other: one module per backend, behind one small interface.

Each module has `NAME` (the spec's `backend`), `roles(index)` (the containers it runs on the
node at that index of `nodes`, in start order) and `EXECUTOR`/`executor` (vLLM's flags for it),
plus its start scripts; `commands` builds what every container shares. The components that
place them: ray_cluster.py and vllm_service.py (ray), native_group.py (native).
"""

from __future__ import annotations

from types import ModuleType

from ...spec import ClusterSpec
from . import native, ray

BACKENDS: dict[str, ModuleType] = {ray.NAME: ray, native.NAME: native}


def of(spec: ClusterSpec) -> ModuleType:
    return BACKENDS[spec.backend]
