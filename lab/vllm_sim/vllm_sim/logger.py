"""Logging in vLLM's own shape, so log-matching tools and people see familiar lines.

vLLM (vllm/logger.py): "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s" with
date format "%m-%d %H:%M:%S", to stdout. The module names here mirror vLLM's (ray_utils.py,
network_utils.py, ...) so the prefixes read the same.
"""

import logging
import sys

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"

_root = logging.getLogger("vllm_sim")


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever sys.stdout is now (it may be replaced after set-up, e.g. by pytest)."""

    @property  # type: ignore[override]
    def stream(self):  # type: ignore[no-untyped-def]
        return sys.stdout

    @stream.setter
    def stream(self, _value) -> None:  # type: ignore[no-untyped-def]
        pass


_configured = False


def configure_logging() -> None:
    """Send vllm_sim's records to stdout, line-buffered (a container log must not lag)."""
    global _configured
    if _configured:
        return
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    handler = _StdoutHandler()
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
    _root.addHandler(handler)
    _root.setLevel(logging.INFO)
    _root.propagate = False
    _configured = True


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
