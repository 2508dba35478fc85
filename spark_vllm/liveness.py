"""Where states made before the components/ move find the liveness provider (they pickled it as
`spark_vllm.liveness._Provider`): the name is kept, the code is components/liveness.py."""

from .components.liveness import _Provider

__all__ = ["_Provider"]
