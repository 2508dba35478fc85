"""The `vllm serve` flags the program owns, and how vLLM's parser reads a flag the user wrote.

Pure: no Pulumi import. spec.py refuses a vllmArgs entry that stands for one of these
(tests/unit/test_spec.py holds the table to vLLM 0.33.0's own flags).
"""

from __future__ import annotations

from collections.abc import Sequence

# vLLM flags the program derives from the spec; repeating them in vllmArgs would contradict it.
# Each with every short alias vLLM gives it (vLLM 0.33.0's `vllm serve` flags, the table in
# lab/vllm_sim/vllm_sim/serve_flags_0_33_0.txt; tests/unit/test_spec.py holds the two together).
OWNED_VLLM_FLAGS = {
    "--tensor-parallel-size": "tensorParallelSize",
    "-tp": "tensorParallelSize",
    "--pipeline-parallel-size": "pipelineParallelSize",
    "-pp": "pipelineParallelSize",
    "--distributed-executor-backend": "backend",
    # vLLM's native multi-node (backend: native): the program gives each node its rank
    "--nnodes": "backend and nodes",
    "-n": "backend and nodes",
    "--node-rank": "backend and nodes",
    "-r": "backend and nodes",
    "--master-addr": "backend (nodes[0]'s identity IP)",
    "--master-port": "masterPort",
    "--headless": "backend (every node but nodes[0])",
    # data parallel would start more engines than the nodes' ranks: not a layout the program
    # deploys (and vLLM's native multi-node derives its DP rank from --node-rank)
    "--data-parallel-size": "(one engine: tensorParallelSize × pipelineParallelSize)",
    "-dp": "(one engine: tensorParallelSize × pipelineParallelSize)",
    "--data-parallel-rank": "(one engine)",
    "-dpn": "(one engine)",
    "--data-parallel-start-rank": "(one engine)",
    "-dpr": "(one engine)",
    "--data-parallel-size-local": "(one engine)",
    "-dpl": "(one engine)",
    "--data-parallel-address": "(one engine)",
    "-dpa": "(one engine)",
    "--data-parallel-rpc-port": "(one engine)",
    "-dpp": "(one engine)",
    "--data-parallel-backend": "(one engine)",
    "-dpb": "(one engine)",
    "--host": "apiHost",
    "--port": "port",
    "--served-model-name": "servedModelName",
    "--api-key": "apiKey (a secret)",
    "--revision": "modelRevision",
}


def owned_vllm_flags(arg: str, owned: Sequence[str] = tuple(OWNED_VLLM_FLAGS)) -> list[str]:
    """The program-owned flags `arg` may stand for, as `vllm serve` parses it.

    vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py) reads `_` as `-` in a long
    flag's name (up to its first `.`, the JSON-path separator; `-x.a` is `-x` too), then plain
    argparse with allow_abbrev (vLLM never turns it off):
    - an exact option string is itself, before any abbreviation (`-dp` is not `-dpl`);
    - any prefix of a long flag stands for it: `--tensor_parallel_size=2`, `--tensor-parallel`;
    - any prefix of a single-dash alias too: vLLM 0.26.0 (Python 3.12) read `-t 4` as
      `-tp 4`; recent argparse also splits `-t=4` at its `=` first (3.11's leaves it unknown);
    - a one-letter alias takes its value attached: `-n2` is `-n 2`, `-rX` is `-r X`.
    What this cannot know: the other flags of the vLLM in the image. A prefix shared with a
    flag that is not owned (`--p`: --pipeline-parallel-size, --port, --prefix-caching-hash-algo
    …; `-d`: -dp, -dcp …) is ambiguous to argparse, which exits: it is refused here too, naming
    every owned flag it could be, so that an image whose vLLM lacks the other flag, where it
    would resolve, is covered. A non-owned flag that equals a prefix of an owned one would be
    refused wrongly; vLLM 0.33.0 has none (tests/unit/test_spec.py checks its whole table).
    """
    name = arg.split("=", 1)[0].split(".", 1)[0]
    if name.startswith("--"):
        name = name.replace("_", "-")
        candidates = [f for f in owned if f.startswith("--")]
        if name == "--":
            return []
    elif name.startswith("-") and len(name) > 1:
        candidates = [f for f in owned if not f.startswith("--")]
    else:
        return []
    if name in candidates:
        return [name]
    return [f for f in candidates if f.startswith(name) or (len(f) == 2 and name.startswith(f))]
