"""An operator's spark-vllm project, as `spark-vllm init` writes it, in a directory outside the
clone: run in this repository's .venv (which has spark-vllm installed) instead of a second one
`pulumi install` would make, with its own file backend and passphrase."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from lab import envsh

CLI = Path(sys.executable).parent / "spark-vllm"
PASSPHRASE = "operator-passphrase"
# a well-formed ed25519 public key: what an operator pins in each node's hostKey (the committed
# example stacks cannot know a site's keys; a preview contacts no node)
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f"


def pin_host_keys(stack_file: Path) -> None:
    """Each node of the stack file gets HOST_KEY as its hostKey, as an operator pins theirs
    (the file's salt and secrets are kept; its comments are not)."""
    doc = yaml.safe_load(stack_file.read_text())
    for node in doc["config"]["spark-vllm:nodes"]:
        node.setdefault("hostKey", HOST_KEY)
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))


def use_venv(project: Path, venv: Path) -> None:
    """The project's Pulumi.yaml runs the program in `venv` (instead of the `venv/` that
    `pulumi install` would make from requirements.txt)."""
    doc = yaml.safe_load((project / "Pulumi.yaml").read_text())
    doc["runtime"]["options"]["virtualenv"] = str(venv)
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def make(root: Path) -> tuple[Path, dict[str, str], str]:
    """(project dir, the env pulumi runs with, what `init` printed)."""
    proj = root / "sparks"
    out = subprocess.run([str(CLI), "init", str(proj)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    use_venv(proj, Path(sys.executable).parents[1])
    (root / "state").mkdir()
    env = {**os.environ, **{k: v for k, v in envsh.sourced().items()
                            if k.startswith(("PATH", "PULUMI_"))},
           "PULUMI_BACKEND_URL": f"file://{root / 'state'}",
           "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE}
    return proj, env, out
