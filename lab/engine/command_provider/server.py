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

import argparse
import json
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


def _engine_address(argv: list[str]) -> str:
    p = argparse.ArgumentParser(prog="pulumi-resource-command", add_help=False)
    p.add_argument("--logtostderr", action="store_true")
    p.add_argument("--logflow", action="store_true")
    p.add_argument("-v", default=None)
    p.add_argument("--tracing", default=None)
    p.add_argument("rest", nargs="*")
    ns, _ = p.parse_known_args(argv)
    return ns.rest[-1] if ns.rest else ""


def serve(argv: list[str], *, write_port: Callable[[int], None] | None = None) -> None:
    engine = _engine_address(argv)
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
    if len(sys.argv) > 1 and sys.argv[1] in ("--version", "-version"):
        print(f"v{VERSION} (spark-vllm stand-in: lab/engine/command_provider)")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--schema":
        print(json.dumps(json.loads(schema_json()), indent=2))
        return
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    serve(sys.argv[1:])
