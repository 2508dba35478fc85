"""The clocks of a start, pure: vLLM's per-step limit and the smoke request's bound over it, the
bound of a vLLM start (vllmTimeout, the weights' read, a cold compile cache) and the phase a
timed-out start was in (configuration.md, "The clocks of a cold start"). commands.py's
readiness and the backends' start scripts use them.
"""

from __future__ import annotations

import shlex

from ..spec import ClusterSpec

# vLLM's own per-step limit: its multiproc executor waits this long for each rank's reply to
# execute_model and sample_tokens, then fails the engine (vLLM 0.26.0 vllm/envs.py
# VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, default 300; vllm/v1/executor/multiproc_executor.py
# execute_model). An operator's env value is read instead (spec.py checks it is a number).
VLLM_EXECUTE_MODEL_TIMEOUT_S = 300
EXECUTE_MODEL_TIMEOUT_ENV = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
# The smoke request's bound over that limit: its first step (prefill, kernels compiled on
# first use) may take the whole per-step limit before vLLM itself gives up; the 15 decode
# steps after it and the HTTP round trip take well under a second on a warm engine, and the
# margin leaves them a minute more for kernels of their own shapes.
SMOKE_MARGIN_S = 60

# The start's bound grows with what the node must do (start_bound_lines), over vllmTimeout:
# reading the weights into memory (per node, at a rate a Spark reaching its memory limit
# still holds: its NVMe reads GB/s, page-cache reclaim under pressure far less) and, with a
# cold compile cache, vLLM's torch.compile, Triton autotuning and CUDA graph capture from
# nothing (vLLM 0.26.0 on one H200, tiny model: 16 s cold against 1 s warm for the compile
# alone; a 122B MoE on a GB10 compiles for minutes: an allowance, not a measurement).
LOAD_RATE_MIB_S = 100
COLD_COMPILE_S = 900
# vLLM's wait for its engine cores in a layout with more than one API server or the Rust
# front end (vLLM 0.26.0 vllm/envs.py VLLM_ENGINE_READY_TIMEOUT_S, default 600;
# vllm/v1/engine/core_client.py MPClient: the API servers start while the engines load and
# each waits this long for their ready message; vllm/v1/utils.py passes it to the Rust front
# end as engine_ready_timeout_secs). With one API server vLLM waits for the engines before
# it starts it (launch_core_engines), so the variable changes nothing there. The API
# server's container always gets the program's start bound (exported by the start script,
# passed by name to docker): no layout's own clock ends a load the program still waits for.
ENGINE_READY_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"

# What vLLM 0.26.0 logs as a start goes (the first match of the last such line in its log
# names the phase a timed-out start was in). Sources, vLLM 0.26.0: gpu_model_runner.py
# load_model ("Starting to load model", "Model loading took"), model_loader/weight_utils.py
# ("Loading safetensors checkpoint shards"), default_loader.py ("Loading weights took"),
# compilation/backends.py ("Dynamo bytecode transform time", "Compiling a graph for compile
# range", "Directly load the compiled graph"), compilation/monitor.py ("torch.compile took",
# "Initial profiling/warmup run took"), gpu_worker.py ("Available KV cache memory"),
# gpu_model_runner.py ("Profiling CUDA graph memory", "Capturing CUDA graphs", "Graph
# capturing finished"), v1/engine/core.py ("init engine (profile, create kv cache, warmup
# model) took"); recorded in tests/fixtures/real-vllm/.
VLLM_PHASES = (
    ("init engine (profile, create kv cache, warmup model) took",
     "starting its API server (the engine is up)"),
    ("Graph capturing finished", "finishing the engine's start (CUDA graphs captured)"),
    ("Capturing CUDA graphs", "capturing CUDA graphs"),
    ("Profiling CUDA graph memory", "capturing CUDA graphs"),
    ("Available KV cache memory", "allocating the KV cache"),
    ("Initial profiling/warmup run took", "profiling memory (compiled)"),
    ("torch.compile took", "profiling memory (compiled)"),
    ("Compiling a graph for compile range", "compiling (torch.compile)"),
    ("Directly load the compiled graph", "compiling (torch.compile, from the cache)"),
    ("Dynamo bytecode transform time", "compiling (torch.compile)"),
    ("Model loading took", "compiling or profiling (the weights are loaded)"),
    ("Loading weights took", "compiling or profiling (the weights are loaded)"),
    ("Loading safetensors checkpoint shards", "loading the weights"),
    ("Starting to load model", "loading the weights"),
)



def execute_model_timeout(spec: ClusterSpec) -> int:
    """vLLM's per-step limit as the containers get it: the operator's env value, else 0.26.0's
    default."""
    raw = spec.user_env.get(EXECUTE_MODEL_TIMEOUT_ENV)
    return int(raw) if raw else VLLM_EXECUTE_MODEL_TIMEOUT_S


def smoke_timeout(spec: ClusterSpec) -> int:
    """The smoke request's bound: vLLM's per-step limit and a margin, so that a first request
    slowed by kernels compiled on first use keeps the vLLM it took minutes to load."""
    return execute_model_timeout(spec) + SMOKE_MARGIN_S


def start_bound_lines(spec: ClusterSpec) -> list[str]:
    """Before the API server's container starts, on its node: the bound of this start, in
    $bound (why in $why), from what the node must do: vllmTimeout, plus the weights' read
    (the model's size in hfCache over the nodes, at LOAD_RATE_MIB_S), plus COLD_COMPILE_S when
    the node's compile cache holds no compiled graph (or compileCache is none). Exported as
    VLLM_ENGINE_READY_TIMEOUT_S, which the container takes by name.

    The weights are the served revision's snapshot (huggingface_hub's refs/<revision> names its
    commit; a commit given as modelRevision is its own): an hfCache that also holds an older
    revision of the model does not count it. With no such snapshot, every snapshot counts (a
    longer bound, never a shorter one)."""
    lines = [f"bound={spec.vllm_timeout}; why='vllmTimeout {spec.vllm_timeout} s'"]
    org_name = spec.model.split("/")
    if len(org_name) == 2 and not spec.model.startswith(("/", ".")):
        repo = f"{spec.hf_cache.rstrip('/')}/hub/models--{org_name[0]}--{org_name[1]}"
        rev = shlex.quote(spec.model_revision or "main")
        nodes = len(spec.nodes)
        per = f" over {nodes} nodes" if nodes > 1 else ""
        lines += [
            f"repo={shlex.quote(repo)}",
            f'snap="$repo/snapshots/$(cat "$repo/refs/"{rev} 2>/dev/null || echo {rev})"',
            '[ -d "$snap" ] || snap="$repo/snapshots"',
            'kib=$(du -sLk "$snap" 2>/dev/null | cut -f1); kib=${kib:-0}',
            f"w=$((kib / 1024 / {LOAD_RATE_MIB_S} / {nodes}))",
            'if [ "$w" -gt 0 ]; then bound=$((bound + w)); '
            f'why="$why + $w s to read $((kib / 1048576)).$((kib * 10 / 1048576 % 10)) GiB of '
            f'weights{per} at '
            f'{LOAD_RATE_MIB_S} MiB/s"; fi',
        ]
    cold = f"{COLD_COMPILE_S} s for a cold compile cache"
    if spec.compile_cache_dir:
        lines += [
            f"if [ \"$(find {shlex.quote(spec.compile_cache_dir)} -path '*/torch_compile_cache/*' "
            "-name 'rank_*' 2>/dev/null | wc -l)\" -eq 0 ]; then "
            f'bound=$((bound + {COLD_COMPILE_S})); why="$why + {cold}"; fi',
        ]
    else:
        lines.append(f'bound=$((bound + {COLD_COMPILE_S})); why="$why + {cold} (compileCache: '
                     'none)"')
    smoke = (f"; of its smoke request: {smoke_timeout(spec)} s ({EXECUTE_MODEL_TIMEOUT_ENV} "
             f"{execute_model_timeout(spec)} s + {SMOKE_MARGIN_S} s)" if spec.smoke_test else "")
    return [*lines, f'log "bound of this start: $bound s ($why){smoke}"',
            f"export {ENGINE_READY_ENV}=$bound"]


def phase_lines() -> list[str]:
    """`phase`: the phase vLLM's log shows it in (VLLM_PHASES), and its last such line."""
    pattern = "|".join(marker.replace("(", "\\(").replace(")", "\\)").replace(".", "\\.")
                       for marker, _ in VLLM_PHASES)
    cases = " ".join(f'*{shlex.quote(marker)}*) p={shlex.quote(what)} ;;'
                     for marker, what in VLLM_PHASES)
    return [
        "phase() {",
        f'  l=$(docker logs "$name" 2>&1 | tr "\\r" "\\n" | grep -E "{pattern}" | tail -n 1)',
        '  p="starting (nothing loaded yet: Python modules, the engine config, the ranks joining)"',
        f'  case "$l" in {cases} esac',
        '  [ -z "$l" ] || l=" (its last step: $(echo "${l#*] }" | cut -c1-160))"',
        '  echo "vLLM was $p$l"',
        "}",
    ]
