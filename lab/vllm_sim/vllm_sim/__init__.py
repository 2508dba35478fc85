"""vllm-sim: a stand-in for `vllm serve` in spark-vllm's lab.

It reproduces what vLLM's Ray executor does to a cluster (IP choice, placement group with the
`node:<ip>` pin, one actor per rank, the same waiting and error text) and serves the
OpenAI-compatible endpoints with canned answers. It does no inference.
"""

__version__ = "0.1.0"
# What `vllm --version` prints: the `+vllm-sim` local label says plainly it is not vLLM.
VLLM_VERSION = "0.0.0+vllm-sim"

BANNER = (
    "vllm-sim: a SIMULATOR of vLLM's multi-node Ray orchestration for spark-vllm's lab "
    "\u2014 it does no inference."
)
