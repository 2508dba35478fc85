"""The lab's Python language host: the Python SDK's own language server, launched as a plugin.

No package registry serves ``pulumi-language-python`` (the Go host the official CLI tarball
ships), so the lab and CI serve the language server that the Python SDK itself carries for the
Automation API (``pulumi.automation._server.LanguageServer``, what ``LocalWorkspace`` serves and
the CLI drives with ``--client``) where the CLI looks for its language host, so the lab keeps
running plain ``pulumi up`` / ``preview`` / ``destroy`` on ``__main__.py``:

    pulumi-language-python [-flags...] <engine address>      (lab/engine/bin/pulumi-language-python)

It prints the port it listens on as its first stdout line (the plugin launch contract) and
serves the LanguageRuntime RPCs a launched host is asked for.

Run: the SDK's server runs an *inline* program in one of its threads. spark-vllm's program is a
process program, as every `pulumi up` with the official host runs it: it installs a SIGINT
handler and ends with exit code 32 when it has shown its own error (components/program.py), which
only a process's main thread can do. So Run starts the program the way the official host does:
the SDK's own ``pulumi-language-python-exec`` (served in the sdk/v3 module, bundled beside the
CLI) in the project's virtualenv (the bash launcher picks the interpreter from Pulumi.yaml's
``runtime.options.virtualenv``, as the SDK's ``pulumi-resource-pulumi-python`` script does), with
the config in ``PULUMI_CONFIG`` / ``PULUMI_CONFIG_SECRET_KEYS`` (read by that script); exit code
32 is a *bail* (the engine adds no second error), another non-zero code an error naming it. The
engine's SIGINT is passed on to the program, then SIGKILL after 5 s.

GetRequiredPackages reads the ``pulumi-plugin.json`` files the installed provider SDKs carry
(pulumi_command ships one naming ``command`` 1.2.1): the engine then loads those plugins before
the program runs and names a missing one up front, as with the official host.

A missing or empty virtualenv is created before this server starts (lab/engine/bin/
pulumi-language-python, as the official host's EnsureVenv). ``pulumi about`` gets what the
official host answers for a pip virtualenv: the interpreter, its version, the toolchain as
Pulumi.yaml names it (``Pip``; ``Auto`` when it names none) with pip's version, and the venv's top-level packages as its Dependencies
(``pip list --format json --not-required``; all of them when the CLI asks for transitive ones;
names normalised as PEP 503 says): pulumi/pulumi sdk/python/toolchain/pip.go, v3.259.0.

What it does not do (the official host does): ``pulumi install`` (InstallDependencies; the lab's
Makefile builds the venv), toolchains other than a plain virtualenv (uv, poetry), Python policy
packs. Each answers UNIMPLEMENTED with that reason.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
from concurrent import futures
from importlib import metadata

import grpc
from pulumi.automation._server import LanguageServer
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

# the exit code of a program that has already shown its error (the SDK's exec script's
# PYTHON_PROCESS_EXITED_AFTER_SHOWING_USER_ACTIONABLE_MESSAGE_CODE): the engine adds none
BAIL_EXIT_CODE = 32
# SIGINT, then SIGKILL after this long: what a program gets to end when the engine cancels
INTERRUPT_GRACE_S = 5.0
NOT_HERE = "not served by spark-vllm's lab language launcher (the official pulumi-language-python does it)"


def required_packages() -> list[tuple[str, str, str]]:
    """(kind, name, version) of every plugin an installed provider SDK declares it needs: the
    `pulumi-plugin.json` at the top of its package (pulumi_command/pulumi-plugin.json). Asked
    on every preview: a glob of the import path, not a read of every distribution's RECORD."""
    found = set()
    for entry in filter(os.path.isdir, sys.path):
        for path in glob.glob(os.path.join(entry, "*", "pulumi-plugin.json")):
            try:
                with open(path) as f:
                    info = json.load(f)
            except (OSError, ValueError):
                continue
            if info.get("resource") and info.get("name"):
                found.add(("resource", info["name"], str(info.get("version", "")).lstrip("v")))
    return sorted(found)


def pip(*args: str) -> str:
    """`python -m pip ARGS` in the venv this runs in, its stdout."""
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=120, check=True).stdout


def semver(text: str) -> str:
    """"26.3" -> "26.3.0": the version as the official host prints it (Go's semver)."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    return ".".join(g or "0" for g in m.groups()) if m else ""


def dependencies(transitive: bool) -> list[tuple[str, str]]:
    """(name, version) of the venv's packages: the top-level ones, or all when transitive (the
    official host's ``pip list --format json [--not-required]``), names normalised (PEP 503)."""
    listed = json.loads(pip("list", "--format", "json",
                            *([] if transitive else ["--not-required"])))
    return [(re.sub(r"[-_.]+", "-", p["name"].lower()), p["version"]) for p in listed]


def entry_point(program_directory: str, entry: str) -> str:
    """The file to run: ``entry`` in the program directory, or its ``__main__.py``."""
    path = os.path.join(program_directory, entry or ".")
    return os.path.join(path, "__main__.py") if os.path.isdir(path) else path


class Launcher(LanguageServer):
    """The SDK's language server, with Run running the program as a process (see the module's
    docstring) and the plugin RPCs the CLI asks a launched host for."""

    def __init__(self, engine_address: str, exec_script: str) -> None:
        super().__init__(lambda: None)
        self.engine_address = engine_address
        self.exec_script = exec_script
        self._child: subprocess.Popen[bytes] | None = None

    def Run(self, request, context):  # noqa: N802 (gRPC method names)
        info = request.info
        pwd = request.pwd or info.root_directory or os.getcwd()
        program = entry_point(info.program_directory or pwd, info.entry_point or request.program)
        if not os.path.exists(program):
            return language_pb2.RunResponse(error=f"no Pulumi program at {program}")
        argv = [sys.executable, "-u", self.exec_script,
                "--monitor", request.monitor_address, "--engine", self.engine_address,
                "--project", request.project, "--stack", request.stack, "--pwd", pwd,
                "--dry_run", "true" if request.dryRun else "false",
                "--parallel", str(request.parallel), "--organization", request.organization,
                "--root_directory", info.root_directory or pwd,
                # a directory: the exec script runs its __main__.py as `python DIR` would
                os.path.dirname(program) if program.endswith("__main__.py") else program,
                *request.args]
        env = {**os.environ, "PULUMI_CONFIG": json.dumps(dict(request.config)),
               "PULUMI_CONFIG_SECRET_KEYS": json.dumps(list(request.configSecretKeys))}
        self._child = subprocess.Popen(argv, cwd=pwd, env=env)
        code = self._child.wait()
        self._child = None
        if code == BAIL_EXIT_CODE:
            return language_pb2.RunResponse(bail=True)
        if code != 0:
            return language_pb2.RunResponse(error=f"program exited with non-zero exit code: {code}")
        return language_pb2.RunResponse()

    def interrupt(self) -> None:
        """The engine's SIGINT (cancel, or its end of the deployment) reaches the program, then
        a SIGKILL if it has not ended within the grace the official host gives it."""
        child = self._child
        if child is None:
            return
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()

    def GetRequiredPackages(self, request, context):  # noqa: N802
        packages = [
            plugin_pb2.PackageDependency(kind=kind, name=name, version=version)
            for kind, name, version in required_packages()
        ]
        return language_pb2.GetRequiredPackagesResponse(packages=packages)

    def GetRequiredPlugins(self, request, context):  # noqa: N802
        plugins = [
            plugin_pb2.PluginDependency(kind=kind, name=name, version=version)
            for kind, name, version in required_packages()
        ]
        return language_pb2.GetRequiredPluginsResponse(plugins=plugins)

    def About(self, request, context):  # noqa: N802
        options = dict(request.info.options) if request.HasField("info") else {}
        toolchain = {"": "Auto", "auto": "Auto", "pip": "Pip"}.get(
            str(options.get("toolchain", "")).lower(), "Unknown")
        typechecker = {"": "None", "mypy": "Mypy", "pyright": "Pyright"}.get(
            str(options.get("typechecker", "")).lower(), "None")
        try:
            toolchain_version = semver(pip("--version").split()[1])
        except (OSError, IndexError, subprocess.SubprocessError):
            toolchain_version = "0.0.0"  # the official host leaves it zero when pip fails
        return language_pb2.AboutResponse(
            executable=sys.executable, version=semver(sys.version.split()[0]),
            metadata={"toolchain": toolchain, "toolchainVersion": toolchain_version,
                      "typechecker": typechecker})

    def GetProgramDependencies(self, request, context):  # noqa: N802
        try:
            found = dependencies(bool(request.transitiveDependencies))
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to get python dependencies: {e}")
        return language_pb2.GetProgramDependenciesResponse(dependencies=[
            language_pb2.DependencyInfo(name=name, version=version) for name, version in found])

    def GetPluginInfo(self, request, context):  # noqa: N802
        return plugin_pb2.PluginInfo(version=metadata.version("pulumi"))

    def InstallDependencies(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"pulumi install: {NOT_HERE}")



def main(argv: list[str]) -> None:
    positional = [a for a in argv if not a.startswith("-")]
    exec_script = os.environ.get("SPARK_VLLM_LANGUAGE_EXEC", "")
    if not positional or not os.path.isfile(exec_script):
        sys.exit("usage: SPARK_VLLM_LANGUAGE_EXEC=<sdk's pulumi-language-python-exec> "
                 "pulumi-language-python [-flags] <engine address>")
    # The engine ends a host with SIGINT. Python keeps SIGINT ignored when it starts with it
    # ignored (a background job of a non-interactive shell: `cmd &` in a script, CI, nohup),
    # and the program it starts inherits that; the official Go host handles SIGINT however it
    # started (Go's os/signal.Notify un-ignores it), so its program starts with the default.
    # Without this, every `pulumi up` run in the background waited ~5 s for the host to end.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    launcher = Launcher(positional[-1], exec_script)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 400 * 1024 * 1024)],
    )
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(launcher, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:  # the engine's SIGINT: its end of the deployment, or a cancel
        launcher.interrupt()
        server.stop(grace=1)


if __name__ == "__main__":
    main(sys.argv[1:])
