"""Every installed module the suite's Python processes import has its bytecode made at install.

Where PYTHONDONTWRITEBYTECODE is set (CI's machine sets it), Python never writes a .pyc: a module
installed without one is compiled again by every process that imports it. `make venv` and
lab/cpu_tier/install.sh install with pip's --no-compile and then byte-compile in parallel; when
the second step was missing (main 04187ce), each `pulumi up`'s three Python processes (the
program, the language host, the command provider) compiled pulumi, grpc and the provider stubs
again, and the lab suite took 3047 s against 2255 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from lab.config import REPO_DIR
from tests.cpu_tier.tier import cpu_venv

# Run in the interpreter under test: imports the modules named in argv with the import system
# recording each module it had to compile from source, i.e. whose .pyc was missing or stale by
# importlib's own check (SourceLoader.get_code calls source_to_code only then).
_PROBE = """
import importlib, importlib.machinery, json, sys
compiled = []
_source_to_code = importlib.machinery.SourceFileLoader.source_to_code
def _recorded(self, data, path, *, _optimize=-1):
    compiled.append(path)
    return _source_to_code(self, data, path, _optimize=_optimize)
importlib.machinery.SourceFileLoader.source_to_code = _recorded
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({"loaded": sorted({getattr(m, "__file__", None) or "" for m in
                                    list(sys.modules.values())}), "compiled": compiled}))
"""


def compiled_at_import(python: str | Path, modules: list[str], prefix: str,
                       where: Path = REPO_DIR) -> tuple[list[str], list[str]]:
    """(the .py files under `prefix` that importing `modules` from `where` loaded, those of them
    Python had to compile from source), with PYTHONDONTWRITEBYTECODE set as on CI's machine."""
    out = subprocess.run([str(python), "-c", _PROBE, *modules], cwd=where,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
                              "PYTHONPATH": str(where)},
                         capture_output=True, text=True, timeout=300, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    under = [f for f in found["loaded"] if f.startswith(prefix) and f.endswith(".py")]
    return under, [f for f in found["compiled"] if f.startswith(prefix)]


def test_the_probe_sees_a_missing_and_an_outdated_pyc(tmp_path: Path) -> None:
    fresh, edited, never = (tmp_path / f"{n}.py" for n in ("fresh", "edited", "never"))
    for f in (fresh, edited, never):
        f.write_text("x = 1\n")
    for f in (fresh, edited):
        subprocess.run([sys.executable, "-m", "py_compile", str(f)], check=True, timeout=60)
    edited.write_text("x = 22\n")  # another size: the .pyc no longer matches
    _, compiled = compiled_at_import(sys.executable, ["fresh", "edited", "never"], str(tmp_path),
                                     where=tmp_path)
    assert compiled == [str(edited), str(never)]


# what one `pulumi up` starts in .venv: the program, the language host (the SDK's server), the
# lab's command provider; and the lab's CLI
_IMPORTS = ["spark_vllm.components.program", "pulumi.automation._server",
            "lab.engine.command_provider.server", "lab.cli"]


def test_the_programs_imports_are_byte_compiled_in_the_venv() -> None:
    site = sysconfig.get_paths()["purelib"]
    files, stale = compiled_at_import(REPO_DIR / ".venv/bin/python", _IMPORTS, site)
    assert len(files) > 200, f"the probe imported only {len(files)} installed modules"
    assert not stale, (f"{len(stale)} of the {len(files)} installed modules one `pulumi up` "
                       f"imports have no current .pyc (make venv's compileall): {stale[:5]}")


def test_the_cpu_tiers_vllm_torch_and_ray_are_byte_compiled() -> None:
    venv = Path(cpu_venv())
    # what a rank's start imports: vLLM's API server (torch, transformers with it) and Ray
    files, stale = compiled_at_import(venv / "bin/python",
                                      ["vllm.entrypoints.openai.api_server", "ray"], str(venv))
    assert len(files) > 2000, f"the probe imported only {len(files)} modules from {venv}"
    assert not stale, (f"{len(stale)} of the {len(files)} modules a rank imports from the CPU "
                       f"tier's venv have no current .pyc (install.sh's compileall): {stale[:5]}")
