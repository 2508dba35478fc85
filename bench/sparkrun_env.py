"""The peers' own venv: sparkrun 0.4.2 and kvfit 0.3.0 from PyPI, pinned by hash
(bench/sparkrun-0.4.2.lock), on CPython 3.12 (sparkrun requires >= 3.12; this repository's own
venv is 3.11), cached outside the repository.

The interpreter is the first of: $SPARK_VLLM_BENCH_PYTHON312, `python3.12` on PATH, pyenv's
3.12 builds (~/.pyenv/versions/3.12.*). Debian 12 packages no 3.12; a machine with none of
these gets a message naming them. The venv lives in
$XDG_CACHE_HOME/spark-vllm/bench/peers-<lock digest> (default ~/.cache/...), so a new lock
makes a new venv and an unchanged one is reused (a marker file is written only after the whole
install succeeded: a cut install is redone).

Every sparkrun process the bench starts gets `SPARKRUN_NO_TELEMETRY=1` and a HOME of its own
(sparkrun writes its config, cluster definitions and job metadata under ~/.config/sparkrun and
~/.cache/sparkrun): `env()`.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

LOCK = Path(__file__).resolve().parent / "sparkrun-0.4.2.lock"
SPARKRUN_VERSION = "0.4.2"
KVFIT_VERSION = "0.3.0"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spark-vllm" / "bench"


def venv_dir() -> Path:
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    return _cache_root() / f"peers-{digest}"


def home_dir() -> Path:
    """sparkrun's HOME: its config, clusters, job metadata and SSH settings, apart from the
    operator's own ~/.config/sparkrun."""
    return _cache_root() / "sparkrun-home"


def find_python312() -> str:
    candidates = [os.environ.get("SPARK_VLLM_BENCH_PYTHON312", ""), shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12.*/bin/python3.12")),
                         reverse=True)
    for c in candidates:
        if not c:
            continue
        try:
            out = subprocess.run([c, "-c", "import sys,venv; print(sys.version_info[:2] >= (3, 12))"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == "True":
            return c
    raise SystemExit(
        "bench: sparkrun 0.4.2 needs CPython 3.12 and none was found: set "
        "SPARK_VLLM_BENCH_PYTHON312 to a python3.12, put one on PATH, or install one with pyenv "
        "(`pyenv install 3.12`)")


def python() -> Path:
    """The peers' venv interpreter, created and installed from the lock on first use."""
    d = venv_dir()
    py = d / "bin" / "python"
    marker = d / ".installed"
    if marker.exists() and py.exists():
        return py
    if d.exists():
        shutil.rmtree(d)
    base = find_python312()
    print(f"bench: creating the peers' venv {d} (sparkrun {SPARKRUN_VERSION}, kvfit "
          f"{KVFIT_VERSION}, from {base})", file=sys.stderr, flush=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([base, "-m", "venv", str(d)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(LOCK)],
                   check=True)
    # Both import: a wheel that installs but does not import fails here, not mid-run.
    subprocess.run([str(py), "-c", "import sparkrun, kvfit, sparkrun.models.vram"], check=True,
                   env=env())
    marker.write_text(hashlib.sha256(LOCK.read_bytes()).hexdigest() + "\n")
    return py


def sparkrun_bin() -> Path:
    python()
    return venv_dir() / "bin" / "sparkrun"


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every sparkrun process: telemetry off, its own HOME."""
    e = dict(os.environ)
    home = home_dir()
    home.mkdir(parents=True, exist_ok=True)
    e.update({"SPARKRUN_NO_TELEMETRY": "1", "HOME": str(home), "HF_HUB_OFFLINE": "1",
              "NO_COLOR": "1"})
    for k in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        e.pop(k, None)
    if extra:
        e.update(extra)
    return e


if __name__ == "__main__":
    print(python())
