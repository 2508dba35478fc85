"""The LanguageRuntime gRPC service of the stand-in (pulumirpc.LanguageRuntime, language.proto).

Mirrors sdk/python/cmd/pulumi-language-python/main.go of the real host for the methods the CLI
uses to run a Python program: Handshake, GetPluginInfo, GetRequiredPackages (GetRequiredPlugins
stays Unimplemented, as in the real host: the CLI falls back only the other way round),
InstallDependencies, RuntimeOptionsPrompts, About, GetProgramDependencies, Run and RunPlugin.
Code generation (GenerateProject/Program/Package), Pack, Link and Template are left
Unimplemented: they need the Go codegen and are used by `pulumi convert`, `pulumi package` and
SDK generation only.
"""

# ruff: noqa: N802  (the RPC method names are fixed by language.proto)
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format
from pulumi.runtime.proto import (
    engine_pb2,
    engine_pb2_grpc,
    language_pb2,
    language_pb2_grpc,
    plugin_pb2,
)

from . import STAND_IN_VERSION, log
from .packages import required_packages
from .toolchain import ToolchainError, parse_options, resolve_toolchain

# The exec script exits with this code after showing the user an actionable error itself (an
# unhandled exception with its trimmed traceback, or a missing __main__.py): Run then answers
# `bail` so the engine prints nothing more.
PYTHON_EXITED_AFTER_SHOWING_USER_ACTIONABLE_MESSAGE = 32

MAX_RPC_MESSAGE_SIZE = 400 * 1024 * 1024  # rpcutil.maxRPCMessageSize
HEALTHCHECK_PERIOD = 5 * 60.0  # rpcutil.Healthcheck(ctx, engine, 5*time.Minute, cancel)


def _program_options(info: language_pb2.ProgramInfo) -> dict[str, Any]:
    if not info.HasField("options"):
        return {}
    options: dict[str, Any] = json_format.MessageToDict(info.options)
    return options


def _options(info: language_pb2.ProgramInfo) -> Any:
    """The project's runtime options, as every RPC that gets a ProgramInfo reads them."""
    return parse_options(info.root_directory, info.program_directory, _program_options(info))


def _go_json_string_map(m: Any) -> str:
    """json.Marshal of a Go map[string]string: keys sorted, no spaces."""
    return json.dumps(dict(m), sort_keys=True, separators=(",", ":"))


class EngineLog:
    """Writers that log to the engine as ephemeral messages (the real host's logWriter)."""

    def __init__(self, engine_address: str) -> None:
        self.channel = grpc.insecure_channel(
            engine_address, options=[("grpc.max_receive_message_length", MAX_RPC_MESSAGE_SIZE)])
        self.stub = engine_pb2_grpc.EngineStub(self.channel)
        self.stream_id = random.randint(0, 2**31 - 1)

    def _write(self, severity: Any, text: str) -> None:
        self.stub.Log(engine_pb2.LogRequest(severity=severity, message=text, urn="",
                                            streamId=self.stream_id, ephemeral=True))

    def info(self, text: str) -> None:
        self._write(engine_pb2.INFO, text)

    def error(self, text: str) -> None:
        self._write(engine_pb2.ERROR, text)

    def close(self) -> None:
        self.channel.close()


class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
    """STAND-IN for pulumi-language-python (see the package docstring)."""

    def __init__(self, exec_path: str, engine_address: str, tracing: str,
                 on_engine_gone: Any = None) -> None:
        self.exec_path = exec_path
        self.engine_address = engine_address
        self.tracing = tracing
        self.on_engine_gone = on_engine_gone
        self._health_started = False
        self._lock = threading.Lock()

    # --- engine liveness --------------------------------------------------------------------
    def start_healthcheck(self) -> None:
        """`rpcutil.Healthcheck`: every 5 minutes ask the engine's grpc.health.v1 service;
        any error but Unimplemented means the engine is gone: stop serving."""
        with self._lock:
            if self._health_started or not self.engine_address:
                return
            self._health_started = True
        address = self.engine_address

        def loop() -> None:
            ch = grpc.insecure_channel(address)
            check = ch.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
            while True:
                time.sleep(HEALTHCHECK_PERIOD)
                try:
                    check(b"", timeout=60)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                        log.v(3, f"engine {address} health check failed: {e.code()}; stopping")
                        if self.on_engine_gone:
                            self.on_engine_gone()
                        return

        threading.Thread(target=loop, name="engine-healthcheck", daemon=True).start()

    # --- plugin info ------------------------------------------------------------------------
    def Handshake(self, request: language_pb2.LanguageHandshakeRequest,
                  context: grpc.ServicerContext) -> language_pb2.LanguageHandshakeResponse:
        self.engine_address = request.engine_address
        self.start_healthcheck()
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(self, request: empty_pb2.Empty,
                      context: grpc.ServicerContext) -> plugin_pb2.PluginInfo:
        return plugin_pb2.PluginInfo(version=STAND_IN_VERSION)

    # --- dependencies -----------------------------------------------------------------------
    def GetRequiredPackages(self, request: language_pb2.GetRequiredPackagesRequest,
                            context: grpc.ServicerContext
                            ) -> language_pb2.GetRequiredPackagesResponse:
        info = request.info
        try:
            opts = _options(info)
            tc = resolve_toolchain(opts)
            if opts.virtualenv and not os.path.isfile(
                    os.path.join(tc.virtualenv_path, "bin", "python")):
                engine = EngineLog(self.engine_address)
                try:
                    tc.ensure_venv(info.program_directory, engine.info, engine.error)
                finally:
                    engine.close()
            # (the real host goes on and fails listing packages with "fork/exec ...: no such
            # file or directory"; the stand-in reports the venv problem as Run would)
            tc.validate_venv()
            self._validate_version(tc)
            deps = required_packages(tc.installed_packages())
        except (ToolchainError, ValueError, OSError) as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        out = []
        for d in deps:
            pkg = plugin_pb2.PackageDependency(name=d.name, kind=d.kind, version=d.version,
                                               server=d.server)
            if d.parameterization:
                p = d.parameterization
                pkg.parameterization.CopyFrom(plugin_pb2.PackageParameterization(
                    name=p.name, version=p.version, value=p.value))
            if d.extension:
                p = d.extension
                pkg.extension.CopyFrom(plugin_pb2.PackageParameterization(
                    name=p.name, version=p.version, value=p.value))
            out.append(pkg)
        log.v(5, f"GetRequiredPackages: {[(d.name, d.version) for d in deps]}")
        return language_pb2.GetRequiredPackagesResponse(packages=out)

    @staticmethod
    def _validate_version(tc: Any) -> None:
        """`validateVersion`: warn on stderr (shown by the CLI) below Python 3.7."""
        try:
            v = tc.output(["--version"]).strip().removeprefix("Python ")
            major, minor = (int(x) for x in v.split(".")[:2])
        except (ToolchainError, ValueError) as e:
            print(f"Failed to resolve python version command: {e}", file=sys.stderr, flush=True)
            return
        if (major, minor) < (3, 7):
            print(f"Pulumi does not support Python {v}. Please upgrade to at least 3.7.0",
                  file=sys.stderr, flush=True)

    def InstallDependencies(self, request: language_pb2.InstallDependenciesRequest,
                            context: grpc.ServicerContext
                            ) -> Iterator[language_pb2.InstallDependenciesResponse]:
        info = request.info
        try:
            opts = _options(info)
        except ToolchainError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        # Plugins never run on the ambient Python: default their venv to `venv`.
        if request.is_plugin and opts.toolchain in ("pip", "auto") and not opts.virtualenv:
            opts.virtualenv = "venv"
        chunks: list[language_pb2.InstallDependenciesResponse] = []
        cond = threading.Condition()
        state: dict[str, Any] = {"done": False, "error": None}

        def out(text: str) -> None:
            with cond:
                chunks.append(language_pb2.InstallDependenciesResponse(stdout=text.encode()))
                cond.notify()

        def err(text: str) -> None:
            with cond:
                chunks.append(language_pb2.InstallDependenciesResponse(stderr=text.encode()))
                cond.notify()

        def work() -> None:
            try:
                out("Installing dependencies...\n\n")
                tc = resolve_toolchain(opts)
                tc.install_dependencies(info.program_directory, out, err, reuse_existing=True)
                out("Finished installing dependencies\n\n")
            except (ToolchainError, OSError) as e:
                state["error"] = str(e)
            finally:
                with cond:
                    state["done"] = True
                    cond.notify()

        threading.Thread(target=work, daemon=True).start()
        while True:
            with cond:
                while not chunks and not state["done"]:
                    cond.wait()
                batch, chunks[:] = list(chunks), []
                done = state["done"]
            yield from batch
            if done and not batch:
                break
        if state["error"]:
            context.abort(grpc.StatusCode.UNKNOWN, state["error"])

    def RuntimeOptionsPrompts(self, request: language_pb2.RuntimeOptionsRequest,
                              context: grpc.ServicerContext
                              ) -> language_pb2.RuntimeOptionsResponse:
        raw = _program_options(request.info)
        P = language_pb2.RuntimeOptionPrompt  # noqa: N806
        prompts = []
        if "toolchain" not in raw:
            pip = P.RuntimeOptionValue(promptType=P.STRING, stringValue="pip", displayName="pip")
            found = [(n, shutil.which(n) is not None) for n in ("poetry", "uv")]
            found.sort(key=lambda x: not x[1])  # stable: found ones first
            choices = [pip] + [P.RuntimeOptionValue(
                promptType=P.STRING, stringValue=n,
                displayName=n if ok else f"{n} [not found]") for n, ok in found]
            prompts.append(P(key="toolchain",
                             description="The toolchain to use for installing dependencies "
                                         "and running the program",
                             promptType=P.STRING, choices=choices, default=pip))
        if raw.get("toolchain") == "pip" and "virtualenv" not in raw:
            venv = P.RuntimeOptionValue(promptType=P.STRING, stringValue="venv")
            prompts.append(P(key="virtualenv", description="The virtualenv to use",
                             promptType=P.STRING, choices=[venv], default=venv))
        return language_pb2.RuntimeOptionsResponse(prompts=prompts)

    def About(self, request: language_pb2.AboutRequest,
              context: grpc.ServicerContext) -> language_pb2.AboutResponse:
        try:
            if request.HasField("info"):
                opts = _options(request.info)
            else:
                opts = parse_options("", "", {"toolchain": "pip"})
            executable, version = resolve_toolchain(opts).about()
        except ToolchainError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        return language_pb2.AboutResponse(executable=executable, version=version)

    def GetProgramDependencies(self, request: language_pb2.GetProgramDependenciesRequest,
                               context: grpc.ServicerContext
                               ) -> language_pb2.GetProgramDependenciesResponse:
        info = request.info
        try:
            opts = _options(info)
            pkgs = resolve_toolchain(opts).list_packages(request.transitiveDependencies)
        except (ToolchainError, ValueError) as e:
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to get python dependencies: {e}")
        return language_pb2.GetProgramDependenciesResponse(dependencies=[
            language_pb2.DependencyInfo(name=p.name, version=p.version) for p in pkgs])

    # --- running the program ----------------------------------------------------------------
    def construct_arguments(self, req: language_pb2.RunRequest) -> list[str]:
        """The exec script's command line, in the real host's order; empty values omitted."""
        args: list[str] = []

        def maybe(k: str, v: str) -> None:
            if v:
                args.extend(["--" + k, v])

        maybe("monitor", req.monitor_address)
        maybe("engine", self.engine_address)
        maybe("project", req.project)
        maybe("root_directory", req.info.root_directory)
        maybe("stack", req.stack)
        maybe("pwd", req.pwd)
        maybe("dry_run", "true" if req.dryRun else "false")
        maybe("parallel", str(req.parallel))
        maybe("tracing", self.tracing)
        maybe("organization", req.organization)
        # The engine always names an entry point, "." for the program directory.
        args.append(req.info.entry_point)
        args.extend(req.args)
        return args

    def Run(self, request: language_pb2.RunRequest,
            context: grpc.ServicerContext) -> language_pb2.RunResponse:
        if not self.engine_address:
            context.abort(grpc.StatusCode.UNKNOWN,
                          "when debugging or running explicitly, must call Handshake before Run")
        info = request.info
        try:
            opts = _options(info)
        except ToolchainError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        if request.attach_debugger:
            return language_pb2.RunResponse(
                error="attaching a debugger (debugpy) is not implemented by spark-vllm's "
                      "STAND-IN pulumi-language-python")

        args = [self.exec_path, *self.construct_arguments(request)]
        config = _go_json_string_map(request.config) if len(request.config) else ""
        secret_keys = json.dumps(list(request.configSecretKeys), separators=(",", ":"))
        log.v(5, f"Language host launching process: {self.exec_path} {' '.join(args)}")
        try:
            tc = resolve_toolchain(opts)
            tc.validate_venv()
            argv, env = tc.command(args)
        except ToolchainError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        env = dict(os.environ if env is None else env)
        if config:
            env["PULUMI_CONFIG"] = config
        env["PULUMI_CONFIG_SECRET_KEYS"] = secret_keys

        if opts.typechecker:
            err = self._typecheck(tc, opts.typechecker, info.program_directory)
            if err:
                context.abort(grpc.StatusCode.UNKNOWN, err)

        # stdout/stderr inherited: the program writes straight into the pipes the CLI reads
        # from this plugin (shown as the program's output). No cwd: the exec script changes
        # to --pwd itself.
        try:
            proc = subprocess.Popen(argv, env=env)
        except OSError as e:
            return language_pb2.RunResponse(
                error=f"problem executing program (could not run language executor): {e}")

        def on_done() -> None:  # the RPC was cancelled (CLI gone): exec.CommandContext kills
            if proc.poll() is None:
                proc.kill()

        context.add_callback(on_done)
        rc = proc.wait()
        sys.stdout.flush()
        sys.stderr.flush()
        if rc == 0:
            return language_pb2.RunResponse()
        if rc == PYTHON_EXITED_AFTER_SHOWING_USER_ACTIONABLE_MESSAGE:
            return language_pb2.RunResponse(error="", bail=True)
        # Go's WaitStatus.ExitStatus() is -1 for a signalled process
        code = rc if rc > 0 else -1
        return language_pb2.RunResponse(error=f"program exited with non-zero exit code: {code}")

    @staticmethod
    def _typecheck(tc: Any, checker: str, program_dir: str) -> str:
        args = ["-m", checker]
        if checker == "mypy" and tc.virtualenv_path:
            args += ["--exclude", os.path.relpath(tc.virtualenv_path, program_dir)]
        args.append(program_dir)
        installed = {p.name for p in tc.list_packages(True)}
        if checker not in installed:
            return (f"The typechecker option is set to {checker}, but {checker} is not "
                    f"installed. Please add an entry for {checker} to requirements.txt and run "
                    f"`{tc.virtualenv_option}/bin/pip install -r requirements.txt`")
        argv, env = tc.command(args)
        r = subprocess.run(argv, env=env, cwd=program_dir)
        if r.returncode != 0:
            return f"{checker} failed: exit status {r.returncode}"
        return ""

    def RunPlugin(self, request: language_pb2.RunPluginRequest,
                  context: grpc.ServicerContext) -> Iterator[language_pb2.RunPluginResponse]:
        """Run a Python plugin (a policy pack, a component provider): `python <dir> ARGS` for a
        bare directory with __main__.py, `python -m pulumi.run.plugin <name> ARGS` for a
        buildable package; output streamed back, then the exit code."""
        info = request.info
        try:
            opts = _options(info)
            if opts.toolchain in ("pip", "auto") and not opts.virtualenv:
                opts.virtualenv = "venv"
            tc = resolve_toolchain(opts)
            has_main = os.path.exists(os.path.join(opts.root, "__main__.py"))
            argv, env = tc.command(["-c", "import pulumi.run.plugin"])
            chk = subprocess.run(argv, env=env, capture_output=True, text=True)
            has_run_module = "ModuleNotFoundError" not in (chk.stdout + chk.stderr)
            if has_run_module and not has_main:
                name = _pyproject_name(opts.root)
                argv, env = tc.module_command("pulumi.run.plugin", [name, *request.args])
            else:
                argv, env = tc.command([info.program_directory, *request.args])
        except (ToolchainError, OSError) as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        env = dict(os.environ if env is None else env)
        for kv in request.env:
            k, _, v = kv.partition("=")
            env[k] = v
        proc = subprocess.Popen(argv, env=env, cwd=request.pwd or None, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        def on_done() -> None:
            if proc.poll() is None:
                proc.kill()

        context.add_callback(on_done)
        q: list[language_pb2.RunPluginResponse] = []
        cond = threading.Condition()
        open_streams = [2]

        def pump(stream: Any, field: str) -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                with cond:
                    q.append(language_pb2.RunPluginResponse(**{field: chunk}))
                    cond.notify()
            with cond:
                open_streams[0] -= 1
                cond.notify()

        for s, f in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            threading.Thread(target=pump, args=(s, f), daemon=True).start()
        while True:
            with cond:
                while not q and open_streams[0]:
                    cond.wait()
                batch, q[:] = list(q), []
                finished = not open_streams[0]
            yield from batch
            if finished and not batch:
                break
        rc = proc.wait()
        if rc != 0:
            yield language_pb2.RunPluginResponse(exitcode=rc if rc > 0 else -1)


def _pyproject_name(root: str) -> str:
    import tomllib
    path = os.path.join(root, "pyproject.toml")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise ToolchainError("plugin is not runnable, it provides neither __main__.py nor a "
                             "buildable pyproject.toml") from e
    name = data.get("project", {}).get("name")
    if not name or "build-system" not in data:
        raise ToolchainError("plugin is not runnable, it provides neither __main__.py nor a "
                             "buildable pyproject.toml")
    return str(name)

