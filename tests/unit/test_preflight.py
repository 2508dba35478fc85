"""The preflight script run for real, on a PATH where `docker`, `ip`, `nvidia-smi` and `rsync`
are fakes that fail in each way a Spark can: every check must stop the script with its own
message (naming the field to fix), before any container of the stack is started. The host's
own rsync and ssh are never on that PATH: the tests pass, and fail, the same without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from spark_vllm.components.render import preflight_commands
from tests.unit.harness import fake_rsync, spec_from

FAKE_TOOL = r"""#!/bin/sh
# $0's name is the tool; $FAKE_MODE says how it misbehaves; calls are logged to $FAKE_LOG
tool=$(basename "$0")
echo "$tool $*" >> "$FAKE_LOG"
case "$tool:$1:$FAKE_MODE" in
  docker:version:daemon-down) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2; exit 1 ;;
  docker:version:*) echo 28.3.3 ;;
  docker:image:image-missing|docker:image:pull-fails) echo "Error: No such image: $4" >&2; exit 1 ;;
  docker:image:*) echo sha256:feedface ;;
  docker:pull:pull-fails) echo "Error response from daemon: pull access denied" >&2; exit 1 ;;
  docker:pull:*) exit 0 ;;
  docker:run:no-vllm) echo "no vllm command in the image"; exit 1 ;;
  docker:run:no-ray) echo "none 3.12.3 0.33.0" ;;
  docker:run:*) echo "2.60.0 3.12.3 0.33.0" ;;
  nvidia-smi:*:no-gpu) echo "No devices were found" ;;
  nvidia-smi:*:*) echo "GPU 0: NVIDIA GB10 (UUID: GPU-1)" ;;
  ip:*:ip-elsewhere) echo "2: lo    inet 10.9.9.9/24 scope global lo" ;;
  ip:*:*) echo "2: lo    inet 192.168.200.12/24 scope global lo"
          echo "2: lo    inet 192.168.200.13/24 scope global lo"; echo "3: eth0 inet 10.1.230.180/24 scope global eth0" ;;
esac
"""


FAKED = ("docker", "ip", "nvidia-smi", "rsync")


def node(**over: object) -> dict[str, object]:
    # `lo` exists on every Linux machine, so /sys/class/net/lo is real
    return {"name": "spark-a", "host": "10.1.230.180", "user": "aurora",
            "fabricIp": "192.168.200.12", "fabricInterface": "lo", **over}


def preflight(tmp: Path, mode: str, at: int = 0,
              **top: object) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    nodes = top.pop("nodes", None) or [top.pop("node", node())]
    spec = spec_from(nodes, stack="pf", image="img:1", model="org/m",
                     tensorParallelSize=len(nodes), **{"checkGpu": False, "imagePull": "never", **top})
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    # every system tool but the faked ones (and ssh, which no check runs), so "docker is not
    # installed" can happen for real and the host's rsync/ssh (present or not) play no part
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(d).iterdir() if Path(d).is_dir() else []:
            link = bin_dir / tool.name
            # lexists: a host's dangling link (slogin -> an absent ssh) is linked once, not twice
            if tool.name not in (*FAKED, "ssh") and not os.path.lexists(link):
                link.symlink_to(tool)
    fakes = [] if mode == "no-docker" else ["docker"]
    fakes += ["ip", "nvidia-smi"]
    for name in fakes:
        (bin_dir / name).write_text(FAKE_TOOL)
        (bin_dir / name).chmod(0o755)
    if mode != "no-rsync":
        fake_rsync(bin_dir)
    log = tmp / "calls"
    log.touch()
    proc = subprocess.run(
        ["/bin/sh", "-c", preflight_commands.preflight_script(spec, spec.nodes[at])], capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "HOME": str(tmp), "FAKE_MODE": mode, "FAKE_LOG": str(log)},
        timeout=30)
    return proc, log.read_text().splitlines()


@pytest.mark.parametrize(("mode", "top", "message"), [
    ("no-docker", {}, "docker is not installed or not on PATH"),
    ("daemon-down", {}, "docker daemon not reachable as "),
    ("no-gpu", {"checkGpu": True},
     "nvidia-smi sees 0 GPU(s), the spec says gpus: 1 (checkGpu: false only where no GPU exists)"),
    ("ok", {"node": node(fabricInterface="nosuch0")},
     "fabricInterface nosuch0 not found; interfaces here: "),
    ("ip-elsewhere", {}, "fabricIp 192.168.200.12 is not on lo; addresses there: 10.9.9.9/24"),
    ("ip-elsewhere", {"node": {"name": "spark-a", "host": "10.1.230.180"}},
     "host 10.1.230.180 is the node identity but no interface has it (NAT?); set "
     "fabricIp/fabricInterface"),
    ("image-missing", {}, "image img:1 is not on the node (imagePull: never); load it with: "
                          "docker save IMAGE | ssh NODE docker load"),
    ("pull-fails", {"imagePull": "always"}, "docker pull img:1 failed"),
    ("pull-fails", {"imagePull": "missing"}, "docker pull img:1 failed"),
    ("no-vllm", {}, "image has no python3 with vllm: no vllm command in the image"),
    # vLLM images without Ray (vLLM dropped the dependency): the ray backend names the other
    ("no-ray", {}, "image img:1 has no Ray (python3 cannot import ray): backend ray starts Ray "
                   "from it; use an image with Ray, or set backend: native (vLLM's own "
                   "multi-node, no Ray)"),
    ("no-rsync", {}, "rsync is not installed: modelStaging download copies the model with rsync "
                     "and checks it with python3 (or set modelStaging: none)"),
], ids=["no-docker", "daemon-down", "no-gpu", "no-interface", "ip-not-on-interface",
        "nat-identity", "image-missing", "pull-always-fails", "pull-missing-fails", "no-vllm",
        "no-ray", "no-rsync"])
def test_each_check_fails_with_its_own_message(tmp_path: Path, mode: str,
                                               top: dict[str, object], message: str) -> None:
    proc, calls = preflight(tmp_path, mode, **top)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"[spark-vllm] spark-a: preflight: FAILED: {message}" in proc.stderr, proc.stderr
    assert proc.stdout == ""  # no summary: the gate and the outputs never see a half result
    # nothing of the stack was started: the only container is the throwaway version read
    runs = [call for call in calls if call.startswith("docker run")]
    assert all("--rm --network none --entrypoint python3" in call for call in runs), runs


def test_a_healthy_node_passes_with_its_summary(tmp_path: Path) -> None:
    """The same fakes, answering well: the checks above fail because of their fault only."""
    proc, calls = preflight(tmp_path, "ok", checkGpu=True, imagePull="missing")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary == {"node": "spark-a", "identity": "192.168.200.12", "docker": "28.3.3",
                       "gpus": "1", "image_id": "sha256:feedface", "ray": "2.60.0",
                       "python": "3.12.3", "vllm": "0.33.0"}
    assert not any(call.startswith("docker pull") for call in calls)  # present: not pulled
    assert os.path.exists(tmp_path / ".spark-vllm" / "image-versions" / "feedface")


def test_backend_native_accepts_an_image_without_ray(tmp_path: Path) -> None:
    proc, _ = preflight(tmp_path, "no-ray", backend="native")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ray"] == "none"


def test_a_worker_is_checked_against_its_own_fields(tmp_path: Path) -> None:
    """A worker cabled on another port is checked on its interface, not the head's."""
    nodes = [node(name="spark-a", fabricInterface="nosuch0"),
             node(name="spark-b", host="10.1.230.181", fabricIp="192.168.200.13")]
    proc, _ = preflight(tmp_path, "ok", at=1, nodes=nodes)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["node"] == "spark-b"
    head, _ = preflight(tmp_path, "ok", at=0, nodes=nodes)
    assert "FAILED: fabricInterface nosuch0 not found" in head.stderr
