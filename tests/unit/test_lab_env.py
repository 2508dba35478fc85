"""lab/env.sh when several shells source it at once: `make test` starts the lab suite and the
rest side by side, and each sources it first (a CI run failed 12 tests on `ln: File exists`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "resource-command-v1.2.1"


def fake_checkout(root: Path, env_sh: str) -> Path:
    """lab/env.sh as given, beside a tools.sh that prints an engine whose plugin is a file."""
    (root / "lab").mkdir(parents=True)
    (root / "lab" / "env.sh").write_text(env_sh)
    engine = root / "engine"
    (engine / "bin").mkdir(parents=True)
    plugin = engine / "plugins" / PLUGIN / "pulumi-resource-command"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    tools = root / "lab" / "tools.sh"
    tools.write_text(f"#!/bin/sh\necho {engine / 'bin'}\n")
    tools.chmod(0o755)
    return plugin


def source_at_once(root: Path, n: int) -> list[subprocess.CompletedProcess[str]]:
    procs = [subprocess.Popen(["bash", "-c", "source lab/env.sh >/dev/null"], cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_shells_sourcing_it_at_once_all_succeed_with_one_right_link(tmp_path: Path) -> None:
    env_sh = (REPO / "lab" / "env.sh").read_text()
    for attempt in range(5):  # each attempt starts from no plugin cache: the race's window
        root = tmp_path / f"c{attempt}"
        plugin = fake_checkout(root, env_sh)
        runs = source_at_once(root, 8)
        assert [r.returncode for r in runs] == [0] * 8, [r.stderr for r in runs if r.returncode]
        link = root / ".lab" / "pulumi-home" / "engine" / "plugins" / PLUGIN / "pulumi-resource-command"
        assert link.resolve() == plugin.resolve()
        assert sorted(p.name for p in link.parent.iterdir()) == ["pulumi-resource-command"]
        shutil.rmtree(root)


def test_a_stale_link_is_replaced(tmp_path: Path) -> None:
    plugin = fake_checkout(tmp_path, (REPO / "lab" / "env.sh").read_text())
    link = tmp_path / ".lab" / "pulumi-home" / "engine" / "plugins" / PLUGIN / "pulumi-resource-command"
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / "elsewhere")
    assert [r.returncode for r in source_at_once(tmp_path, 1)] == [0]
    assert link.resolve() == plugin.resolve()
