"""A rank's torch.compile and its on-disk cache, as vLLM 0.26.0 keeps it (simulated).

What real vLLM does (paths inside the 0.26.0 source):
- the cache root is VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm, with `~`
  expanded (vllm/envs.py "VLLM_CACHE_ROOT", get_default_cache_root)         -> cache_root
- VllmBackend.__call__ (vllm/compilation/backends.py:1020-1110): hash_key = the first 10 hex of
  sha256(str([env factors, vllm config hash, code hash of the traced files, compiler hash])),
  the rank's dir `<root>/torch_compile_cache/<hash_key>/rank_{rank}_{dp_rank}/<prefix>`
  ("backbone" for the language model); "Using cache directory: ... for vLLM's torch.compile",
  or "vLLM's torch.compile cache is disabled." (VLLM_DISABLE_COMPILE_CACHE=1,
  compiler_interface.py is_compile_cache_enabled; the dir and its cache_key_factors.json are
  still written, no compiled artefact is stored or read)
- inductor and Triton caches under the hash dir, `inductor_cache/` and `triton_cache/`
  (compiler_interface.py:462-480 initialize_cache)
- CompilerManager.compile (backends.py:263-396): a graph in vllm_compile_cache.py (the index,
  keyed by (compile range, graph index, compiler name)) is loaded: "Directly load the compiled
  graph(s) for compile range (1, 8192) from the cache, took 0.455 s" (observed, 0.26.0); else
  compiled: "Cache the graph of compile range ... for later use", "Compiling a graph for compile
  range ... takes X s". The artefact files are named `artifact_compile_range_{start}_{end}_
  subgraph_{i}` (InductorStandaloneAdaptor, the default); str(Range(1, 8192)) is "(1, 8192)", the
  range's end max_num_batched_tokens (vllm/config/vllm.py _set_compile_ranges; 8192 for the API
  server on a GPU of >= 70 GiB that is not an A100, engine/arg_utils.py get_batch_defaults)
- "torch.compile took %.2f s in total" (compilation/monitor.py), the rank's compilation time;
  the engine logs the largest over the ranks (v1/executor/abstract.py:124-136, v1/engine/core.py
  :326-348 "init engine ... (compilation: %.2f s)").

The simulator's key is a sha256 over the factors the caller passes (the version played, the
model and its revision, the parallel layout, the compile-affecting flags): it reads no source
file and knows no compiler. Its artefacts are small files: written to a temporary name and
os.replace'd, the index last, so a rank killed mid-compile leaves nothing a later start trusts
(vLLM writes its AOT artefact the same way, decorators.py save_aot_compiled_function). The
compile itself is a sleep of VLLM_SIM_COMPILE_S seconds (a simulator-only knob).
"""

import ast
import hashlib
import json
import os
import pprint
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from vllm_sim import simulated_version
from vllm_sim.logger import init_logger

logger = init_logger(__name__)

DEFAULT_COMPILE_S = 2.0  # VLLM_SIM_COMPILE_S unset
# The end of the compile range when --max-num-batched-tokens is not given (see above).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
PREFIX = "backbone"  # the language model's prefix in VllmBackend
COMPILER_NAME = "inductor_standalone"  # InductorStandaloneAdaptor.name
INDEX_FILE = "vllm_compile_cache.py"  # CompilerManager.cache_file_path
FACTORS_FILE = "cache_key_factors.json"
GRAPH_FILE = "computation_graph.py"
# `vllm serve` flags (argparse dests) whose values are in vLLM's config hash (model, cache,
# parallel, scheduler and compilation configs); the model and its revision come separately.
KEY_FLAGS = (
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_model_len",
    "dtype", "kv_cache_dtype", "quantization", "max_num_batched_tokens", "enforce_eager",
    "compilation_config", "optimization_level", "block_size", "hf_overrides",
    "enable_expert_parallel", "attention_backend", "performance_mode", "speculative_config",
    "enable_lora", "cudagraph_capture_sizes", "code_revision", "trust_remote_code",
)


def cache_root() -> str:
    """VLLM_CACHE_ROOT as vllm/envs.py computes it."""
    default = os.path.join(
        os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "vllm"
    )
    return os.path.expanduser(os.getenv("VLLM_CACHE_ROOT", default))


def cache_enabled() -> bool:
    """Not VLLM_DISABLE_COMPILE_CACHE (vllm/envs.py disable_compile_cache: bool(int(...)))."""
    return not bool(int(os.getenv("VLLM_DISABLE_COMPILE_CACHE", "0")))


def compile_seconds() -> float:
    """VLLM_SIM_COMPILE_S (simulator-only): how long a compile without a cache takes."""
    raw = os.environ.get("VLLM_SIM_COMPILE_S")
    return max(0.0, float(raw)) if raw else DEFAULT_COMPILE_S


def engine_factors(args: Any, model: str, extra: Iterable[str] = ()) -> dict[str, Any]:
    """The key's factors known to the engine (the driver): the model as the engine holds it
    (after HF_HUB_OFFLINE's resolution, a snapshot dir that names the commit), --revision, and
    every KEY_FLAGS flag that is set. `extra`: legacy mode's unparsed flags, all kept (the
    simulator cannot tell which of them vLLM hashes)."""
    factors: dict[str, Any] = {"model": model, "revision": getattr(args, "revision", None)}
    for name in KEY_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            factors[name] = value
    if extra:
        factors["other_flags"] = list(extra)
    return factors


def torch_compiles(factors: Mapping[str, Any]) -> bool:
    """--enforce-eager turns torch.compile off (vllm/config/vllm.py:1162-1168): no compile, and
    the engine's line has no "(compilation: ...)"."""
    return not factors.get("enforce_eager") and "--enforce-eager" not in factors.get(
        "other_flags", ()
    )


def rank_factors(factors: Mapping[str, Any]) -> dict[str, Any]:
    """What a rank hashes: the engine's factors and the vLLM version installed where the rank
    runs (VllmConfig.compute_hash takes vllm.__version__ in the worker's process)."""
    return {**factors, "vllm_version": simulated_version()}


def hash_key(factors: Mapping[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(dict(factors), sort_keys=True, default=str).encode()
    ).hexdigest()[:10]


def compile_range(factors: Mapping[str, Any]) -> tuple[int, int]:
    """(1, max_num_batched_tokens). V2 keeps the flag's text: read as vLLM's human_readable_int
    (k/m/g decimal, K/M/G binary, vllm/utils/argparse_utils.py); unreadable -> the default."""
    end = factors.get("max_num_batched_tokens")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([kmgKMG]?)\s*", str(end))
    if end is None or not m:
        return 1, DEFAULT_MAX_NUM_BATCHED_TOKENS
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    return 1, int(float(m.group(1)) * mult[m.group(2)])


def range_str(r: tuple[int, int]) -> str:
    return f"({r[0]}, {r[1]})"  # vllm/config/utils.py Range.__str__


def hash_dir(factors: Mapping[str, Any]) -> str:
    return os.path.join(cache_root(), "torch_compile_cache", hash_key(factors))


def rank_dir(rank: int, factors: Mapping[str, Any]) -> str:
    return os.path.join(hash_dir(factors), f"rank_{rank}_0", PREFIX)


def artifact_name(r: tuple[int, int], graph_index: int = 0) -> str:
    return f"artifact_compile_range_{r[0]}_{r[1]}_subgraph_{graph_index}"


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _index_key(r: tuple[int, int]) -> tuple[tuple[int, int], int, str]:
    return r, 0, COMPILER_NAME


def _load(local_dir: str, r: tuple[int, int]) -> bool:
    """True when the index names this range's graph and its artefact is whole. A dir without an
    index (never finished, or killed before the index) is no cache, silently; an index whose
    artefact is missing or not the one it recorded is reported and compiled again (vLLM's
    words for a failed AOT load, decorators.py _try_load_aot_compiled_fn)."""
    index_path = os.path.join(local_dir, INDEX_FILE)
    if not os.path.exists(index_path):
        return False
    artifact = os.path.join(local_dir, artifact_name(r))
    try:
        with open(index_path) as f:
            entry = ast.literal_eval(f.read())[_index_key(r)]
        with open(artifact, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != entry["cache_key"]:
            raise ValueError(f"{artifact} is not the artefact the index recorded")
    except KeyError:
        return False  # this range was never stored here
    except Exception as exc:
        logger.warning("Compiling model again due to a load failure from %s, reason: %s",
                       index_path, exc)
        return False
    return True


def _store(local_dir: str, base_dir: str, r: tuple[int, int], key: str, rank: int) -> None:
    for sub in ("inductor_cache", "triton_cache"):
        os.makedirs(os.path.join(base_dir, sub, key), exist_ok=True)
    _write_atomic(os.path.join(base_dir, "inductor_cache", key, f"c{key}_rank{rank}.py"),
                  f"# vllm-sim: an inductor kernel of hash {key}\n".encode())
    _write_atomic(os.path.join(base_dir, "triton_cache", key, f"triton_rank{rank}.json"),
                  json.dumps({"hash": key, "rank": rank}).encode())
    name = artifact_name(r)
    artifact = json.dumps({"simulated": True, "hash_key": key, "rank": rank,
                           "compile_range": list(r)}).encode()
    path = os.path.join(local_dir, name)
    _write_atomic(path, artifact)
    index = {_index_key(r): {"graph_handle": (name, path),
                             "cache_key": hashlib.sha256(artifact).hexdigest()}}
    _write_atomic(os.path.join(local_dir, INDEX_FILE), pprint.pformat(index, indent=4).encode())


def compile(rank: int, factors: dict[str, Any], compile_seconds: float) -> tuple[float, bool]:
    """One rank's torch.compile of the language model: loaded from the cache when the rank's
    dir holds it, else compiled (a sleep of compile_seconds) and stored. Returns (seconds
    spent, whether the cache was hit)."""
    t0 = time.perf_counter()
    r = compile_range(factors)
    key = hash_key(factors)
    base_dir = os.path.join(cache_root(), "torch_compile_cache", key)
    local_dir = os.path.join(base_dir, f"rank_{rank}_0", PREFIX)
    enabled = cache_enabled()
    os.makedirs(local_dir, exist_ok=True)
    if enabled:
        logger.info("Using cache directory: %s for vLLM's torch.compile", local_dir)
    else:
        logger.info("vLLM's torch.compile cache is disabled.")
    factors_path = os.path.join(local_dir, FACTORS_FILE)
    if not os.path.exists(factors_path):
        _write_atomic(factors_path, json.dumps(
            {"simulated": True, "factors": factors}, indent=2, sort_keys=True, default=str
        ).encode())

    if enabled and _load(local_dir, r):
        elapsed = time.perf_counter() - t0
        logger.info("Directly load the compiled graph(s) for compile range %s from the cache, "
                    "took %.3f s", range_str(r), elapsed)
        logger.info("torch.compile took %.2f s in total", elapsed)
        return elapsed, True

    time.sleep(compile_seconds)
    graph_path = os.path.join(local_dir, GRAPH_FILE)
    if not os.path.exists(graph_path):
        _write_atomic(graph_path, b"# vllm-sim: no graph was traced\n")
    if enabled:
        _store(local_dir, base_dir, r, key, rank)
        logger.info("Cache the graph of compile range %s for later use", range_str(r))
    elapsed = time.perf_counter() - t0
    logger.info("Compiling a graph for compile range %s takes %.2f s", range_str(r), elapsed)
    logger.info("torch.compile took %.2f s in total", elapsed)
    return elapsed, False
