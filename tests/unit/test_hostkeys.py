"""Pinned host keys: the program's own check before an update (components/hostkeys.py),
against OpenSSH's tools: real `ssh-keygen` for keys and fingerprints, a fake `ssh-keyscan`
standing for the nodes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spark_vllm.components import hostkeys
from tests.unit.harness import spec_from


def new_key(tmp: Path, name: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)],
                   check=True)
    return " ".join((tmp / f"{name}.pub").read_text().split()[:2])


def test_fingerprint_is_openssh_s(tmp_path: Path) -> None:
    key = new_key(tmp_path, "k")
    out = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True,
                         text=True, check=True).stdout
    assert hostkeys.fingerprint(key) == out.split()[1]


@pytest.fixture
def nodes_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """host -> the key it presents (a missing host does not answer)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scan = bin_dir / "ssh-keyscan"
    scan.write_text(f"""#!/bin/sh
for a; do host=$a; done
echo "$*" >> {tmp_path}/calls
f={tmp_path}/answers/$host
[ -f "$f" ] || exit 1
echo "# $host:22 SSH-2.0-OpenSSH_9.2" >&2
echo "$host $(cat "$f")"
""")
    scan.chmod(0o755)
    (tmp_path / "answers").mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    class Answers(dict[str, str]):
        def __setitem__(self, host: str, key: str) -> None:
            (tmp_path / "answers" / host).write_text(key)
            super().__setitem__(host, key)
    return Answers()


def test_a_wrong_pinned_key_is_named_with_both_fingerprints(tmp_path: Path,
                                                            nodes_answer: dict[str, str]) -> None:
    good, pinned_b, real_b = (new_key(tmp_path, n) for n in ("a", "b-pinned", "b-real"))
    nodes_answer["10.0.0.1"] = good
    nodes_answer["10.0.0.2"] = real_b
    spec = spec_from([{"name": "spark-a", "host": "10.0.0.1", "hostKey": good},
                      {"name": "spark-b", "host": "10.0.0.2", "hostKey": pinned_b}],
                     image="i", model="org/m", tensorParallelSize=2)
    problems = hostkeys.mismatches(spec)
    assert len(problems) == 1
    assert problems[0].startswith(
        f"nodes[1].hostKey: spark-b at 10.0.0.2:22 presents ssh-ed25519 "
        f"{hostkeys.fingerprint(real_b)}, not the pinned {hostkeys.fingerprint(pinned_b)}; "
        "nothing was run on spark-b.")
    calls = (tmp_path / "calls").read_text().splitlines()
    assert sorted(calls) == ["-T 5 -t ed25519 -p 22 10.0.0.1", "-T 5 -t ed25519 -p 22 10.0.0.2"]


def test_matching_unpinned_and_silent_nodes_pass(tmp_path: Path,
                                                 nodes_answer: dict[str, str]) -> None:
    """A silent node is left to the commands' own dial error; an unpinned one is not asked."""
    key = new_key(tmp_path, "a")
    nodes_answer["10.0.0.1"] = key
    spec = spec_from([{"name": "spark-a", "host": "10.0.0.1", "hostKey": key},
                      {"name": "spark-b", "host": "10.0.0.2", "hostKey": new_key(tmp_path, "b")},
                      {"name": "spark-c", "host": "10.0.0.3"}],
                     image="i", model="org/m", tensorParallelSize=3,
                     insecureAcceptAnyHostKey=True)
    assert hostkeys.mismatches(spec) == []
    assert "10.0.0.3" not in (tmp_path / "calls").read_text()
