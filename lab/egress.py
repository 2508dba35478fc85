"""Keep the lab's traffic on this machine: nodes may reach each other and the host, not beyond.

The mgmt network must be a plain bridge (it carries the nodes' default route, which is what
Ray and vLLM's get_ip() auto-detect, as on a Spark's external NIC), so Docker would NAT the
nodes' traffic out of the host. One REJECT rule in DOCKER-USER (the chain Docker reserves for
the operator and never flushes) stops anything from the mgmt subnet that is not for the mgmt
subnet: an accidental `docker pull` on a node fails at once instead of leaving the machine.
The fabric network is --internal already. Traffic to the host itself (INPUT) is not affected.
"""

from __future__ import annotations

from lab import config
from lab.run import LabError, run

CHAIN = "DOCKER-USER"
COMMENT = f"{config.LAB_PREFIX} egress"  # per lab: another lab's `down` leaves this one's rule


def _rule(subnet: str) -> list[str]:
    return ["-s", subnet, "!", "-d", subnet, "-m", "comment", "--comment", COMMENT, "-j", "REJECT"]


def _ipt(*args: str) -> int:
    return run(["iptables", "-w", *args], check=False, timeout=30).returncode


def block(subnet: str) -> None:
    if _ipt("-C", CHAIN, *_rule(subnet)) == 0:
        return
    if _ipt("-I", CHAIN, "1", *_rule(subnet)) != 0:
        raise LabError(f"cannot add the egress rule for {subnet} to {CHAIN} (iptables)")


def unblock_all() -> None:
    """Remove every egress rule this lab added (whatever subnet it was for), no other lab's."""
    out = run(["iptables", "-w", "-S", CHAIN], check=False, timeout=30).stdout
    for line in out.splitlines():
        words = line.split()
        # `iptables -S` quotes a comment with a space: --comment "spark-vllm-lab egress"
        if f'--comment "{COMMENT}"' in line and "-s" in words:
            subnet = words[words.index("-s") + 1]
            while _ipt("-C", CHAIN, *_rule(subnet)) == 0:
                _ipt("-D", CHAIN, *_rule(subnet))
