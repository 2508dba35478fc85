"""What `vllm serve` does around the executor, for every mode (cli.py's Ray paths and native.py):
the API socket bound before the engine, SIGTERM, the engine's init line, the HTTP server and
its watchdog on the engine."""

import asyncio
import os
import re
import signal
import socket
import time
from typing import Any

from vllm_sim import compile_cache
from vllm_sim.logger import init_logger

logger = init_logger("vllm_sim.cli")

# Seconds of pretend weight loading; VLLM_SIM_LOAD_SECONDS overrides.
DEFAULT_LOAD_SECONDS = 3.0


def _bind_server_socket(host: str | None, port: int) -> socket.socket:
    # Bound before the engine starts, as vLLM does, so a taken port fails at once.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host or "", port))
    return sock


def _exit_on_sigterm(signum: int, _frame: Any) -> None:
    # As PID 1 in a container the default SIGTERM action is ignored; exit like vLLM would.
    raise SystemExit(128 + signum)


def _init_engine(executor: Any, factors: dict[str, Any]) -> None:
    """EngineCore._initialize_kv_caches (vllm/v1/engine/core.py:243-348), of which the simulator
    does the profile run's torch.compile: on every rank (the executor's), or here without Ray
    (rank 0 is this process), through the compile cache (compile_cache.py); then its line."""
    start = time.time()
    compile_s = 0.0
    if compile_cache.torch_compiles(factors):
        seconds = compile_cache.compile_seconds()
        if executor is not None:
            compile_s = executor.compile_or_warm_up_model(factors, seconds)
        else:
            compile_s, _hit = compile_cache.compile(0, compile_cache.rank_factors(factors), seconds)
    elapsed = time.time() - start
    if compile_s > 0:
        logger.info("init engine (profile, create kv cache, warmup model) took %.2f s "
                    "(compilation: %.2f s)", elapsed, compile_s)
    else:
        logger.info("init engine (profile, create kv cache, warmup model) took %.2f s", elapsed)


def _max_model_len(value: Any) -> int | None:
    """Legacy parses an int. V2 keeps the text, read here as vLLM's human_readable_int does
    (vllm/utils/argparse_utils.py:30-60: k/m/g/t decimal, K/M/G/T binary); "auto" -> None."""
    if value is None or isinstance(value, int):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    if not m:
        return None
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
            "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def add_user_middleware(app: Any, paths: list[str]) -> None:
    """`--middleware MODULE.NAME`, as vLLM applies it after its own middleware
    (vllm/entrypoints/serve/middleware/register.py:66-74, 0.33.0): a class is added with
    `app.add_middleware`, a coroutine function as an "http" middleware, anything else is a
    ValueError; an import error ends the server as it does vLLM's."""
    import importlib
    import inspect

    for middleware in paths:
        module_path, object_name = middleware.rsplit(".", 1)
        imported = getattr(importlib.import_module(module_path), object_name)
        if inspect.isclass(imported):
            app.add_middleware(imported)
        elif inspect.iscoroutinefunction(imported):
            app.middleware("http")(imported)
        else:
            raise ValueError(f"Invalid middleware {middleware}. Must be a function or a class.")


def _run_http(args, sock, model, served_name, api_keys, pc, rank_ips, executor, v2) -> int:  # type: ignore[no-untyped-def]
    import uvicorn

    from vllm_sim.api_server import DEFAULT_MAX_NUM_SEQS, ServerState, build_app

    max_num_seqs = DEFAULT_MAX_NUM_SEQS if args.max_num_seqs is None else args.max_num_seqs
    logger.info("Scheduler: max_num_seqs=%d (at most that many requests per engine step, "
                "the rest wait first come first served)", max_num_seqs)
    state = ServerState(
        served_model_name=served_name,
        model=model,
        tensor_parallel_size=pc.tensor_parallel_size,
        pipeline_parallel_size=pc.pipeline_parallel_size,
        rank_ips=rank_ips,
        max_model_len=_max_model_len(args.max_model_len),
        api_key=api_keys[0] if api_keys else None,
        api_keys=api_keys,
        v2=v2,
        rank_reports=getattr(executor, "rank_reports", None),
        check_health=executor.check_health if executor else (lambda: True),
        step=getattr(executor, "step", None) or (lambda: None),
        reasoning_parser=getattr(args, "reasoning_parser", None),
        max_num_seqs=max_num_seqs,
    )
    app = build_app(state)
    add_user_middleware(app, args.middleware or [])
    shown_host = args.host or "0.0.0.0"
    logger.info("Starting vLLM API server 0 on http://%s:%d", shown_host, args.port)
    logger.info("Available routes are:")
    for route in app.routes:
        methods = getattr(route, "methods", None)
        if methods and not route.path.startswith(("/docs", "/openapi", "/redoc")):
            logger.info("Route: %s, Methods: %s", route.path, ", ".join(sorted(methods)))
    config = uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    v2_executor = v2 and hasattr(executor, "shutdown")  # not the legacy executor's
    if executor is not None and (v2_executor or getattr(executor, "native", False)):
        _exit_when_engine_dies(executor, server)
    # SIGTERM while serving: uvicorn's graceful shutdown, then exit 0, as real vLLM 0.26.0 did
    # (tests/fixtures/real-vllm, scenario sigterm: "Shutting down", exit 0 in 0.6 s). Ray's
    # driver installed its own handler (sys.exit(signum), exit 15), and uvicorn re-raises the
    # signal it captured once it has stopped: that lands here and does nothing more.
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        if getattr(executor, "native", False):  # native.py: no Ray
            executor.shutdown()
        else:
            logger.info("Shutting down Ray distributed executor (simulated).")
            if executor is not None:
                import ray

                if v2_executor:
                    executor.shutdown()  # kills the actors, removes the ipc sockets and /dev/shm

                ray.shutdown()
    return 0


# vllm/entrypoints/launchers/launcher.py:314-337: every 5 s the watchdog checks the engine and
# sets uvicorn's should_exit when it is dead (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it up).
WATCHDOG_S = 5.0


def _exit_when_engine_dies(executor: Any, server: Any) -> None:
    """V2: a dead rank ends the process, the way vLLM 0.33.0 gets there.

    The executor's failure callback queues EXECUTOR_FAILED (vllm/v1/engine/core.py:1186-1188),
    the engine core raises RuntimeError("Executor failed.") (:1778-1779) and exits, the client
    notices (vllm/v1/engine/core_client.py:833-842), the watchdog stops uvicorn. Nothing
    re-raises afterwards, so the process exits 0 (vllm issue #48966; fix proposed in PR #52178).
    """
    import threading

    dead = threading.Event()

    def on_failure() -> None:
        # native.py's executor names its own error (execute_model's timeout)
        error = getattr(executor, "failure_error", None)
        try:
            if error is not None:
                raise error
            raise RuntimeError("Executor failed.")
        except Exception:
            logger.exception("EngineCore encountered a fatal error.")
        logger.warning("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")
        dead.set()

    executor.register_failure_callback(on_failure)
    keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") not in ("", "0")

    def watchdog() -> None:
        while True:
            time.sleep(WATCHDOG_S)
            if dead.is_set() and not keep_alive:
                server.should_exit = True
                return

    threading.Thread(target=watchdog, daemon=True, name="watchdog").start()
