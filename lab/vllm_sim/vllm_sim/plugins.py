"""vLLM's general plugins, loaded as vLLM loads them (vllm/plugins/__init__.py
load_general_plugins): every entry point of the group `vllm.general_plugins` that the
installed distributions declare is loaded and called, once per process; with VLLM_PLUGINS set
(names, comma-separated), only those. A plugin that fails to import is logged and skipped; one
that raises when called fails the process, as in vLLM.

Where: a V2 rank loads them in initialize_worker after the driver's env was applied
(vLLM's WorkerWrapperBase.init_worker, called by RayExecutorV2's initialize_worker), so a
plugin reads the env the rank ended up with (the GPU tier's env probe, lab/gpu/envprobe, is one:
it records it on real vLLM and here alike). vLLM also loads them in the API server and engine
core processes; the simulator loads them in the rank only.
"""

import os
from collections.abc import Callable
from typing import Any

from vllm_sim.logger import init_logger

logger = init_logger(__name__)

GENERAL_PLUGINS_GROUP = "vllm.general_plugins"
_loaded = False


def allowed_plugins() -> list[str] | None:
    """VLLM_PLUGINS (vllm/envs.py): None (all) when unset, else the comma-separated names."""
    raw = os.environ.get("VLLM_PLUGINS")
    return None if raw is None else raw.split(",")


def load_plugins_by_group(group: str) -> dict[str, Callable[[], Any]]:
    from importlib.metadata import entry_points

    allowed = allowed_plugins()
    found = entry_points(group=group)
    if not found:
        logger.debug("No plugins for group %s found.", group)
        return {}
    plugins: dict[str, Callable[[], Any]] = {}
    for plugin in found:
        if allowed is not None and plugin.name not in allowed:
            continue
        try:
            plugins[plugin.name] = plugin.load()
        except Exception:  # noqa: BLE001 - vLLM logs a plugin that fails to import and goes on
            logger.exception("Failed to load plugin %s", plugin.name)
    return plugins


def load_general_plugins() -> None:
    """Once per process."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for func in load_plugins_by_group(GENERAL_PLUGINS_GROUP).values():
        func()
