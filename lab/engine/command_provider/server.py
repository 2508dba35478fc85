"""The gRPC ``pulumirpc.ResourceProvider`` server the engine launches as
``pulumi-resource-command <engine address>``.

Plugin protocol (Pulumi's provider-plugin contract, as the CLI v3.274 launches any resource
plugin; the messages are the SDK's own pulumirpc stubs): the engine runs the binary with flags (``--logtostderr``, ``-v=N``, ``--tracing <url>``) and its
own gRPC address as the last argument; the plugin listens on 127.0.0.1:<free port> and writes only
``<port>\\n`` to stdout. The engine then calls Handshake (we answer like Configure:
acceptSecrets, acceptResources, supportsPreview is implied), GetPluginInfo, CheckConfig,
Configure, and the resource calls. stderr and any other stdout go to the engine's debug log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any, NoReturn

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import (
    engine_pb2,
    engine_pb2_grpc,
    plugin_pb2,
    provider_pb2,
    provider_pb2_grpc,
)

from . import VERSION, ssh
from .props import from_struct, to_struct
from .resources import RESOURCES, Context, Resource, ResourceError
from .schema import schema_json

_MAX_MSG = 400 * 1024 * 1024
_OPTIONS = [("grpc.max_receive_message_length", _MAX_MSG),
            ("grpc.max_send_message_length", _MAX_MSG)]


def _type_of(urn: str, typ: str = "") -> str:
    if typ:
        return typ
    # urn:pulumi:<stack>::<project>::<parent$...$type>::<name>
    parts = urn.split("::")
    return parts[2].split("$")[-1] if len(parts) >= 4 else ""


def _name_of(urn: str, name: str = "") -> str:
    return name or urn.split("::")[-1]


class _Engine:
    """Log lines to the engine (the provider's ``InfoStatus``: ephemeral, per resource)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stub: engine_pb2_grpc.EngineStub | None = None
        self._addr = ""

    def connect(self, addr: str) -> None:
        with self._lock:
            if not addr or addr == self._addr:
                return
            self._addr = addr
            self._stub = engine_pb2_grpc.EngineStub(grpc.insecure_channel(addr, options=_OPTIONS))

    def log(self, urn: str, message: str, *, ephemeral: bool = True,
            severity: engine_pb2.LogSeverity.ValueType = engine_pb2.INFO) -> None:
        stub = self._stub
        if stub is None:
            return
        try:
            stub.Log(engine_pb2.LogRequest(severity=severity, message=message, urn=urn,
                                           ephemeral=ephemeral), timeout=10)
        except grpc.RpcError:
            pass


class _Running:
    """Child processes of in-flight operations (killed only by Cancel)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen[bytes]] = set()


class Provider(provider_pb2_grpc.ResourceProviderServicer):
    def __init__(self, engine_address: str) -> None:
        self.engine = _Engine()
        self.engine.connect(engine_address)
        self.cancelled = threading.Event()

    # --- plumbing ----------------------------------------------------------------------------
    def _resource(self, urn: str, typ: str, context: grpc.ServicerContext) -> Resource:
        t = _type_of(urn, typ)
        r = RESOURCES.get(t)
        if r is None:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"unknown resource type '{t}' (the pulumi-command stand-in implements "
                   f"{', '.join(sorted(RESOURCES))})")
        return r

    def _ctx(self, urn: str) -> Context:
        def status(line: str) -> None:
            self.engine.log(urn, line)
        return Context(log_status=status, cancelled=self.cancelled)

    # --- protocol --------------------------------------------------------------------------------
    def Handshake(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.engine.connect(request.engine_address)
        return provider_pb2.ProviderHandshakeResponse(
            accept_secrets=True, accept_resources=True, accept_outputs=False)

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return plugin_pb2.PluginInfo(version=VERSION)

    def GetSchema(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return provider_pb2.GetSchemaResponse(schema=schema_json())

    def Attach(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.engine.connect(request.address)
        return empty_pb2.Empty()

    def Cancel(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        # The real provider's context is cancelled: dial retries stop. A command already
        # running is left alone (the real session.Run is not interrupted either).
        self.cancelled.set()
        return empty_pb2.Empty()

    def CheckConfig(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return provider_pb2.CheckResponse(inputs=request.news)

    def DiffConfig(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return provider_pb2.DiffResponse(changes=provider_pb2.DiffResponse.DIFF_NONE)

    def Configure(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return provider_pb2.ConfigureResponse(acceptSecrets=True, supportsPreview=True,
                                              acceptResources=True, acceptOutputs=False)

    def Invoke(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        _abort(context, grpc.StatusCode.UNIMPLEMENTED,
               f"function '{request.tok}' is not implemented by the pulumi-command stand-in")

    # --- resources -------------------------------------------------------------------------------
    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        r = self._resource(request.urn, request.type, context)
        inputs, failures = r.check(from_struct(request.news))
        return provider_pb2.CheckResponse(
            inputs=to_struct(inputs),
            failures=[provider_pb2.CheckFailure(property=f.property, reason=f.reason)
                      for f in failures])

    def Diff(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        r = self._resource(request.urn, request.type, context)
        d = r.diff(from_struct(request.olds), from_struct(request.news),
                   list(request.ignoreChanges))
        kinds = {
            ("ADD", False): provider_pb2.PropertyDiff.ADD,
            ("ADD", True): provider_pb2.PropertyDiff.ADD_REPLACE,
            ("DELETE", False): provider_pb2.PropertyDiff.DELETE,
            ("DELETE", True): provider_pb2.PropertyDiff.DELETE_REPLACE,
            ("UPDATE", False): provider_pb2.PropertyDiff.UPDATE,
            ("UPDATE", True): provider_pb2.PropertyDiff.UPDATE_REPLACE,
        }
        return provider_pb2.DiffResponse(
            changes=(provider_pb2.DiffResponse.DIFF_SOME if d.changed
                     else provider_pb2.DiffResponse.DIFF_NONE),
            replaces=d.replaces,
            diffs=sorted(d.detailed),
            detailedDiff={k: provider_pb2.PropertyDiff(kind=kinds[v], inputDiff=False)
                          for k, v in d.detailed.items()},
            hasDetailedDiff=True,
            deleteBeforeReplace=False)

    def Create(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        r = self._resource(request.urn, request.type, context)
        try:
            rid, props = r.create(_name_of(request.urn, request.name),
                                  from_struct(request.properties), request.preview,
                                  self._ctx(request.urn))
        except ResourceError as e:
            _abort(context, grpc.StatusCode.UNKNOWN, str(e))
        return provider_pb2.CreateResponse(id=rid, properties=to_struct(props))

    def Update(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        r = self._resource(request.urn, request.type, context)
        try:
            props = r.update(from_struct(request.olds), from_struct(request.news),
                             request.preview, self._ctx(request.urn))
        except ResourceError as e:
            _abort(context, grpc.StatusCode.UNKNOWN, str(e))
        return provider_pb2.UpdateResponse(properties=to_struct(props))

    def Delete(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        r = self._resource(request.urn, request.type, context)
        try:
            r.delete(from_struct(request.properties), self._ctx(request.urn))
        except ResourceError as e:
            _abort(context, grpc.StatusCode.UNKNOWN, str(e))
        return empty_pb2.Empty()

    def Read(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._resource(request.urn, request.type, context)
        # no CustomRead: the stored state and inputs, as they are
        return provider_pb2.ReadResponse(id=request.id, properties=request.properties,
                                         inputs=request.inputs)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    context.abort(code, msg)
    raise AssertionError("unreachable")  # context.abort raises


# The real plugin's command line: Go's flag package over glog's flags and --tracing, nothing else
# (no --version: `pulumi-resource-command --version` prints the usage and exits 2, as here).
# name -> (takes a value, usage line)
FLAGS = {
    "alsologtostderr": (False, "log to standard error as well as files"),
    "log_backtrace_at": (True, "when logging hits line file:N, emit a stack trace"),
    "log_dir": (True, "If non-empty, write log files in this directory"),
    "log_link": (True, "If non-empty, add symbolic links in this directory to the log files"),
    "logbuflevel": (True, "Buffer log messages logged at this level or lower"),
    "logtostderr": (False, "log to standard error instead of files"),
    "stderrthreshold": (True, "logs at or above this threshold go to stderr (default 2)"),
    "tracing": (True, "Emit tracing to a Zipkin-compatible tracing endpoint"),
    "v": (True, "log level for V logs"),
    "vmodule": (True, "comma-separated list of pattern=N settings for file-filtered logging"),
}


def usage(prog: str) -> str:
    lines = [f"Usage of {prog}:"]
    for name, (takes, text) in FLAGS.items():
        lines += [f"  -{name}{' value' if takes else ''}", f"    \t{text}"]
    return "\n".join(lines)


def engine_address(argv: list[str], prog: str = "pulumi-resource-command") -> str:
    """The engine's address (the first argument after the flags), the flags parsed as Go's flag
    package does (-name, --name, -name=value, -name value; parsing stops at the first argument
    that is not a flag). An unknown flag is Go's error and usage, exit 2; -h/-help the usage,
    exit 0."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if len(arg) < 2 or not arg.startswith("-"):
            break
        name = arg.lstrip("-")
        name, has_value, _ = name.partition("=")
        if name in ("h", "help"):
            print(usage(prog), file=sys.stderr)
            sys.exit(0)
        if name not in FLAGS:
            print(f"flag provided but not defined: -{name}\n{usage(prog)}", file=sys.stderr)
            sys.exit(2)
        i += 2 if FLAGS[name][0] and not has_value else 1
    rest = argv[i:]
    return rest[0] if rest else ""


def serve(argv: list[str], *, write_port: Callable[[int], None] | None = None) -> None:
    engine = engine_address(argv)
    threading.Thread(target=ssh.remove_stale_workdirs, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=128), options=_OPTIONS)
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(Provider(engine), server)
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        print("pulumi-resource-command (stand-in): could not listen on 127.0.0.1", file=sys.stderr)
        sys.exit(1)
    server.start()
    if write_port is None:
        sys.stdout.write(f"{port}\n")
        sys.stdout.flush()
    else:
        write_port(port)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    stop.wait()
    server.stop(grace=1)


def main() -> None:
    engine_address(sys.argv[1:])  # the usage, exit 2, for a flag the real one lacks
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    serve(sys.argv[1:])
