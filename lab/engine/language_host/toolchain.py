"""The Python toolchain as the real host sees it (sdk/python/toolchain in the sdk/v3 module):
runtime options, the virtualenv, how a `python` command is built, package listing.

Only the pip toolchain is implemented (spark-vllm's Pulumi.yaml says `toolchain: pip`). A
project that asks for uv or poetry, or whose directory has a uv.lock / poetry.lock while the
toolchain option is unset, gets a clear error instead of a silent pip fallback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

Writer = Callable[[str], None]


class ToolchainError(Exception):
    """An error the real host returns as an RPC error (its Go error text)."""


@dataclass
class PythonOptions:
    root: str = ""
    program_dir: str = ""
    virtualenv: str = ""
    typechecker: str = ""  # "", "mypy", "pyright"
    toolchain: str = "auto"  # "auto" (option unset), "pip", "poetry", "uv"


def parse_options(root: str, program_dir: str, options: Mapping[str, Any]) -> PythonOptions:
    """`parseOptions` of the real host: Pulumi.yaml `runtime.options`, as sent in ProgramInfo."""
    opts = PythonOptions(root=root, program_dir=program_dir)
    if "virtualenv" in options:
        v = options["virtualenv"]
        if not isinstance(v, str):
            raise ToolchainError("virtualenv option must be a string")
        opts.virtualenv = v
    if "typechecker" in options:
        t = options["typechecker"]
        if not isinstance(t, str):
            raise ToolchainError("typechecker option must be a string")
        if t not in ("mypy", "pyright"):
            raise ToolchainError(f"unsupported typechecker option: {t}")
        opts.typechecker = t
    if "toolchain" in options:
        tc = options["toolchain"]
        if not isinstance(tc, str):
            raise ToolchainError("toolchain option must be a string")
        if tc not in ("pip", "poetry", "uv"):
            raise ToolchainError(f"unsupported toolchain option: {tc}")
        opts.toolchain = tc
    return opts


def _searchup(start: str, name: str) -> str | None:
    d = Path(start or ".").resolve()
    for p in (d, *d.parents):
        if (p / name).exists():
            return str(p)
    return None


def resolve_toolchain(opts: PythonOptions) -> Pip:
    """`ResolveToolchain`: unset toolchain = uv if a uv.lock is found above the program
    directory, poetry if a poetry.lock is, else pip."""
    tc = opts.toolchain
    if tc == "auto":
        if _searchup(opts.program_dir, "uv.lock"):
            tc = "uv (found uv.lock)"
        elif _searchup(opts.program_dir, "poetry.lock"):
            tc = "poetry (found poetry.lock)"
        else:
            tc = "pip"
    if tc != "pip":
        raise ToolchainError(
            f"the Python toolchain {tc} is not supported by spark-vllm's STAND-IN "
            "pulumi-language-python (lab/engine/language_host): only `toolchain: pip` is; "
            "set runtime.options.toolchain to pip in Pulumi.yaml")
    return Pip(opts.root, opts.virtualenv)


def resolve_virtualenv_path(root: str, virtualenv: str) -> str:
    if not virtualenv:
        return ""
    return virtualenv if os.path.isabs(virtualenv) else os.path.join(root, virtualenv)


def is_virtualenv(path: str) -> bool:
    """`IsVirtualEnv`: the directory holds bin/python."""
    return bool(path) and os.path.isfile(os.path.join(path, "bin", "python"))


def activate_virtualenv(environ: Mapping[str, str], venv: str) -> dict[str, str]:
    """`ActivateVirtualEnv`: venv/bin first on PATH, PYTHONHOME dropped, VIRTUAL_ENV set."""
    vbin = os.path.join(venv, "bin")
    out: dict[str, str] = {}
    has_path = False
    for k, v in environ.items():
        ku = k.upper()
        if ku == "PATH":
            has_path = True
            out[k] = vbin + os.pathsep + v
        elif ku in ("PYTHONHOME", "VIRTUAL_ENV"):
            continue
        else:
            out[k] = v
    if not has_path:
        out["PATH"] = vbin
    out["VIRTUAL_ENV"] = venv
    return out


def ambient_python() -> str:
    """`CommandPath`: $PULUMI_PYTHON_CMD, else python3, else python, on PATH."""
    cmds = [os.environ["PULUMI_PYTHON_CMD"]] if os.environ.get("PULUMI_PYTHON_CMD") else [
        "python3", "python"]
    for c in cmds:
        p = shutil.which(c)
        if p:
            return p
    raise ToolchainError(f"failed to locate any of {json.dumps(cmds)} on your PATH. "
                         "Have you installed Python 3.10 or greater?")


def virtualenv_error(option: str, full: str) -> ToolchainError:
    """`NewVirtualEnvError`, same text."""
    message = "doesn't exist" if not os.path.exists(full) else \
        "doesn't appear to be a virtual environment"
    vpy = os.path.join(full, "bin", "python")
    cmds = (f"    1. python3 -m venv {full}\n"
            f"    2. {vpy} -m pip install --upgrade pip setuptools wheel\n"
            f"    3. {vpy} -m pip install -r requirements.txt\n")
    return ToolchainError(
        f"The 'virtualenv' option in Pulumi.yaml is set to {json.dumps(option)}, but "
        f"{json.dumps(full)} {message}; run the following commands to create the virtual "
        f"environment and install dependencies into it:\n\n{cmds}\n\n"
        "For more information see: "
        "https://www.pulumi.com/docs/intro/languages/python/#virtual-environments")


_NORM = re.compile(r"[-_.]+")


def normalize_name(name: str) -> str:
    """PEP 503 normalisation, as the toolchain applies to `pip list` names."""
    return _NORM.sub("-", name.lower())


# Run inside the program's interpreter: every installed distribution, first on sys.path wins
# (what `pip list` shows), with the directory it is installed in.
_LIST_SCRIPT = r"""
import json, sys
from importlib import metadata
seen, out = set(), []
for d in metadata.distributions():
    name = d.metadata["Name"]
    if not name or name.lower() in seen:
        continue
    seen.add(name.lower())
    out.append({"name": name, "version": d.version, "location": str(d.locate_file(""))})
json.dump(out, sys.stdout)
"""


@dataclass
class Package:
    name: str  # normalised
    version: str
    location: str = ""


class Pip:
    """The pip toolchain: `<venv>/bin/python` with the venv activated, or the ambient python."""

    def __init__(self, root: str, virtualenv_option: str) -> None:
        self.root = root
        self.virtualenv_option = virtualenv_option
        self.virtualenv_path = resolve_virtualenv_path(root, virtualenv_option)

    # --- commands ---------------------------------------------------------------------------
    def command(self, args: list[str]) -> tuple[list[str], dict[str, str] | None]:
        """argv and env (None = inherit) for `python ARGS...`."""
        if not self.virtualenv_path:
            return [ambient_python(), *args], None
        return ([os.path.join(self.virtualenv_path, "bin", "python"), *args],
                activate_virtualenv(os.environ, self.virtualenv_path))

    def module_command(self, module: str, args: list[str]) -> tuple[list[str], dict[str, str] | None]:
        return self.command(["-m", module, *args])

    def output(self, args: list[str], cwd: str | None = None) -> str:
        argv, env = self.command(args)
        try:
            r = subprocess.run(argv, env=env, cwd=cwd or None, capture_output=True, text=True)
        except OSError as e:
            raise ToolchainError(f"calling `{' '.join(argv)}`: {e}") from e
        if r.returncode != 0:
            raise ToolchainError(f"calling `{' '.join(argv)}`: exit status {r.returncode}: "
                                 f"{r.stderr.strip()}")
        return r.stdout

    # --- the virtualenv ---------------------------------------------------------------------
    def validate_venv(self) -> None:
        if self.virtualenv_option and not is_virtualenv(self.virtualenv_path):
            raise virtualenv_error(self.virtualenv_option, self.virtualenv_path)

    def ensure_venv(self, cwd: str, out: Writer, err: Writer) -> None:
        """`EnsureVenv`: create the venv and install requirements only if it is missing/empty."""
        if not self.virtualenv_option or is_virtualenv(self.virtualenv_path):
            return
        p = self.virtualenv_path
        if os.path.exists(p):
            if not os.path.isdir(p):
                raise ToolchainError(f"the 'virtualenv' option in Pulumi.yaml is set to "
                                     f"{json.dumps(p)} but it is not a directory")
            if os.listdir(p):
                return  # not empty: ValidateVenv reports it later, as the real host does
        self.install_dependencies(cwd, out, err)

    def install_dependencies(self, cwd: str, out: Writer, err: Writer,
                             reuse_existing: bool = False) -> None:
        """`InstallDependencies` (pip): `python3 -m venv`, upgrade pip/setuptools/wheel, then
        `pip install -r requirements.txt` from `cwd`, streaming pip's output.

        reuse_existing (stand-in only, used by the InstallDependencies RPC): when the venv is
        already valid, skip re-creating it and the pip/setuptools/wheel upgrade, so that
        `pulumi install` on a ready venv only checks requirements.txt (quick, offline)."""
        venv = self.virtualenv_path
        if venv and not (reuse_existing and is_virtualenv(venv)):
            out("Creating virtual environment...\n")
            if not os.path.isabs(venv):
                raise ToolchainError(f"virtual environment path must be absolute: {venv}")
            r = subprocess.run([ambient_python(), "-m", "venv", venv], capture_output=True,
                               text=True)
            if r.returncode != 0:
                if r.stdout or r.stderr:
                    err(r.stdout + r.stderr + "\n")
                raise ToolchainError(f"creating virtual environment at '{venv}': exit status "
                                     f"{r.returncode}")
            out("Finished creating virtual environment\n")
            out("Updating pip, setuptools, and wheel in virtual environment...\n")
            self._pip_install(cwd, out, err, "updating pip, setuptools, and wheel",
                              ["--upgrade", "pip", "setuptools", "wheel"])
            out("Finished updating\n")
        elif venv:
            out(f"Using the existing virtual environment {venv}\n")
        if not os.path.exists(os.path.join(cwd, "requirements.txt")):
            return
        out("Installing dependencies in virtual environment...\n")
        self._pip_install(cwd, out, err, "installing dependencies", ["-r", "requirements.txt"])
        out("Finished installing dependencies\n")

    def _pip_install(self, cwd: str, out: Writer, err: Writer, what: str,
                     args: list[str]) -> None:
        if self.virtualenv_path:
            argv = [os.path.join(self.virtualenv_path, "bin", "python"), "-m", "pip", "install",
                    *args]
            env: dict[str, str] | None = activate_virtualenv(os.environ, self.virtualenv_path)
        else:
            argv = [ambient_python(), "-m", "pip", "install", *args]
            env = None
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1)
        stderr_buf: list[str] = []

        def pump(stream: IO[str], write: Writer, keep: list[str] | None) -> None:
            for line in stream:
                write(line)
                if keep is not None:
                    keep.append(line)

        assert proc.stdout is not None and proc.stderr is not None
        t = threading.Thread(target=pump, args=(proc.stderr, err, stderr_buf), daemon=True)
        t.start()
        pump(proc.stdout, out, None)
        rc = proc.wait()
        t.join()
        if rc != 0:
            tail = "".join(stderr_buf).strip()
            raise ToolchainError(f"{what} via '{' '.join(argv)}': exit status {rc}"
                                 + (f": {tail}" if tail else ""))

    # --- packages ---------------------------------------------------------------------------
    def installed_packages(self) -> list[Package]:
        """Every distribution the program's interpreter sees, with its install location (the
        real host lists them with the toolchain and looks for pulumi-plugin.json there)."""
        raw = json.loads(self.output(["-c", _LIST_SCRIPT]))
        return [Package(normalize_name(r["name"]), r["version"], r["location"]) for r in raw]

    def list_packages(self, transitive: bool) -> list[Package]:
        """`ListPackages`: `python -m pip list --format json [--not-required]`."""
        args = ["list", "--format", "json"]
        if not transitive:
            args.append("--not-required")
        raw = json.loads(self.output(["-m", "pip", *args]))
        return [Package(normalize_name(r["name"]), r["version"]) for r in raw]

    def about(self) -> tuple[str, str]:
        """(executable, python version) like `About`: the version is "" if it cannot be read."""
        executable = self.output(["-c", "import sys; print(sys.executable)"]).strip()
        try:
            version = parse_python_version(self.output(["--version"]))
        except (ToolchainError, ValueError):
            version = ""
        return executable, version


def parse_python_version(text: str) -> str:
    """`ParsePythonVersion`: "Python 3.11.7" -> "3.11.7", "3.12.0rc1" -> "3.12.0-rc.1"."""
    s = text.strip().removeprefix("Python ")
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:(a|b|rc|dev)(\d+))?", s)
    if not m:
        raise ValueError(f"invalid Python version format: {s!r}")
    v = f"{m.group(1)}.{m.group(2)}.{m.group(3) or '0'}"
    if m.group(4):
        v += {"a": "-alpha.", "b": "-beta.", "rc": "-rc.", "dev": "-dev."}[m.group(4)] + m.group(5)
    return v
