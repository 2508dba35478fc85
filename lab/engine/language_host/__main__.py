"""Entry point of the STAND-IN pulumi-language-python: `python -m lab.engine.language_host
[flags] [ENGINE_ADDRESS]` (normally through lab/engine/bin/pulumi-language-python)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from concurrent import futures

EXEC_NAME = "pulumi-language-python-exec"


def _restore_environment() -> None:
    """The wrapper puts the repo on PYTHONPATH to import this package; the program's Python
    must not inherit that. It saves the caller's value as "=VALUE" (set) or "" (unset)."""
    saved = os.environ.pop("SPARK_VLLM_LANGHOST_SAVED_PYTHONPATH", None)
    if saved is None:
        return
    if saved.startswith("="):
        os.environ["PYTHONPATH"] = saved[1:]
    else:
        os.environ.pop("PYTHONPATH", None)


def find_executor(given: str, bin_dir: str) -> str:
    """The exec script: -use-executor, else beside the host's executable (the real host's only
    place), else on PATH, else in the lab toolchain's bin dir ($SPARK_VLLM_TOOLCHAIN_BIN, where
    lab/tools.sh copies it from the sdk/v3 module)."""
    if given:
        return given
    candidates = []
    if bin_dir:
        candidates.append(os.path.join(bin_dir, EXEC_NAME))
    on_path = shutil.which(EXEC_NAME)
    if on_path:
        candidates.append(on_path)
    if os.environ.get("SPARK_VLLM_TOOLCHAIN_BIN"):
        candidates.append(os.path.join(os.environ["SPARK_VLLM_TOOLCHAIN_BIN"], EXEC_NAME))
    for c in candidates:
        if os.path.isfile(c):
            return os.path.abspath(c)
    where = os.path.join(bin_dir, EXEC_NAME) if bin_dir else EXEC_NAME
    raise FileNotFoundError(
        f"missing executor {where}: not beside the language host, not on PATH, not in "
        "$SPARK_VLLM_TOOLCHAIN_BIN (lab/tools.sh copies it from the pulumi sdk/v3 module; "
        "`source lab/env.sh`)")


def main(argv: list[str] | None = None) -> None:
    _restore_environment()
    from . import flags, log

    args = flags.parse_or_exit(sys.argv[1:] if argv is None else argv)
    log.configure(args.verbosity, args.flag("logtostderr") or args.flag("alsologtostderr"))
    try:
        exec_path = find_executor(args.get("use-executor"), args.get("stand-in-bin-dir"))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    log.v(3, f"language host identified executor: `{exec_path}`")
    engine_address = args.positional[0] if args.positional else ""

    import grpc
    from pulumi.runtime.proto import language_pb2_grpc

    from .server import MAX_RPC_MESSAGE_SIZE, LanguageHost

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="langhost"),
        options=[("grpc.max_receive_message_length", MAX_RPC_MESSAGE_SIZE),
                 ("grpc.max_send_message_length", MAX_RPC_MESSAGE_SIZE)])
    stopping = threading.Event()

    def stop() -> None:
        # GracefulStop: no new RPCs, the running ones (a Run waiting for its program) finish
        if not stopping.is_set():
            stopping.set()
            server.stop(grace=3600)

    host = LanguageHost(exec_path, engine_address, args.get("tracing"), on_engine_gone=stop)
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(host, server)
    try:
        port = server.add_insecure_port("127.0.0.1:0")
    except RuntimeError as e:
        print(f"error: could not start language host RPC server: {e}", file=sys.stderr,
              flush=True)
        sys.exit(1)
    if not port:
        print("error: could not start language host RPC server: no port", file=sys.stderr,
              flush=True)
        sys.exit(1)
    server.start()
    host.start_healthcheck()
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=stop, daemon=True).start())

    # The spawner reads exactly one line from stdout: the port.
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
