"""Two labs on one machine (lab/test.sh runs lab 2 beside lab 1): SPARK_VLLM_LAB=N gives lab N
names, addresses, a stack, state and locks of its own, and lab 1 keeps the documented ones.
Anything the two shared would let one lab's `down`, `up` or test reach into the other's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import egress
from tests.unit.test_lab_env import fake_checkout

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json
from lab import cluster, config, egress
print(json.dumps({
    "state": str(config.STATE_DIR), "ssh": str(config.SSH_DIR), "stack": config.DEFAULT_STACK,
    "mgmt": config.DEFAULT_MGMT_SUBNET, "fabric": config.DEFAULT_FABRIC_SUBNET,
    "nets": [config.MGMT_NET, config.FABRIC_NET], "label": config.LABEL_VALUE,
    "containers": [config.container_name(1), config.container_name(2)],
    "volumes": [config.volume_name(1), config.volume_name(2)],
    "lock": str(cluster._lock_file()), "images_lock": str(cluster._images_lock()),
    "egress": egress.COMMENT, "images": [config.BASE_IMAGE, config.NODE_IMAGE_REPO],
}))
"""


def lab(n: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_VLLM_LAB"}
    if n is not None:
        env["SPARK_VLLM_LAB"] = n
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_lab_1_keeps_the_documented_names() -> None:
    one = lab(None)
    assert lab("1") == one
    assert (one["stack"], one["mgmt"], one["fabric"]) == ("lab", "10.231.0.0/24", "192.168.231.0/24")
    assert one["state"] == str(REPO / ".lab")
    assert one["nets"] == ["spark-vllm-lab-mgmt", "spark-vllm-lab-fabric"]
    assert one["containers"][0] == "spark-vllm-lab-node-1"
    assert one["egress"] == "spark-vllm-lab egress"


def test_lab_2_shares_nothing_with_lab_1_but_the_images() -> None:
    one, two = lab("1"), lab("2")
    assert two["images"] == one["images"]  # built once for the machine
    assert two["images_lock"] == one["images_lock"]
    for key in ("state", "ssh", "stack", "mgmt", "fabric", "label", "lock", "egress"):
        assert two[key] != one[key], key
    for key in ("nets", "containers", "volumes"):
        assert not set(two[key]) & set(one[key]), key
    assert two["stack"] == "lab2" and two["mgmt"] == "10.232.0.0/24"
    # lab 1's state dir holds lab 2's, but nothing lab 1 keeps is under lab 2's name
    assert Path(two["state"]).parent == Path(one["state"])
    assert Path(two["state"]).name not in ("ssh", "state", "logs", "pulumi-home")


@pytest.mark.parametrize("bad", ["0", "10", "two", "-1"])
def test_a_bad_instance_is_refused_by_name(bad: str) -> None:
    env = {**os.environ, "SPARK_VLLM_LAB": bad}
    r = subprocess.run([sys.executable, "-c", "import lab.config"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"SPARK_VLLM_LAB={bad!r}: must be a number within 1..9" in r.stderr


def test_env_sh_puts_lab_n_state_where_config_says(tmp_path: Path) -> None:
    """The engine's file backend (lab/env.sh) and the lab's STATE_DIR (lab/config.py) are one
    place per lab: a test reading lab 2's state must read the state lab 2's engine wrote."""
    fake_checkout(tmp_path, (REPO / "lab" / "env.sh").read_text())
    for n, want in (("1", tmp_path / ".lab" / "state"), ("2", tmp_path / ".lab" / "lab2" / "state")):
        r = subprocess.run(["bash", "-c", 'source lab/env.sh >/dev/null && echo "$PULUMI_BACKEND_URL"'],
                           cwd=tmp_path, env={**os.environ, "SPARK_VLLM_LAB": n},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"file://{want}"
        # the same relative place config.STATE_DIR gives this lab in the repository
        assert Path(lab(n)["state"]).relative_to(REPO) == want.parent.relative_to(tmp_path)


class FakeIptables:
    """iptables -S/-C/-D over a list of rules (DOCKER-USER) as iptables prints them."""

    def __init__(self, rules: list[str]) -> None:
        self.rules = rules

    def __call__(self, argv: list[str], check: bool = False, timeout: int = 0):  # noqa: ANN204
        args = argv[2:]  # iptables -w …
        if args[0] == "-S":
            out = "\n".join(["-N DOCKER-USER", *self.rules])
            return subprocess.CompletedProcess(argv, 0, out, "")
        rule = self.render(args[2:])
        if args[0] == "-C":
            return subprocess.CompletedProcess(argv, 0 if rule in self.rules else 1, "", "")
        if args[0] == "-D":
            self.rules.remove(rule)
            return subprocess.CompletedProcess(argv, 0, "", "")
        raise AssertionError(args)

    @staticmethod
    def render(words: list[str]) -> str:
        w = " ".join(f'"{x}"' if " " in x else x for x in words)
        return f"-A DOCKER-USER {w}"


def test_a_labs_down_removes_its_egress_rule_and_not_another_labs(monkeypatch) -> None:  # noqa: ANN001
    mine = FakeIptables.render(egress._rule("10.231.0.0/24"))
    other = mine.replace("10.231.", "10.232.").replace("spark-vllm-lab egress", "spark-vllm-lab2 egress")
    fake = FakeIptables([other, mine])
    monkeypatch.setattr(egress, "run", fake)
    egress.unblock_all()
    assert fake.rules == [other]
