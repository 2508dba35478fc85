"""Two "nodes" on one machine for the CPU tier: network namespaces joined by a veth pair.

Each node is what a host is to the program, as far as multi-node vLLM can tell:
- its own network stack (a network namespace) with two links to the other node, as the
  seeds' two Sparks had: the fabric (10.99.0.0/24, their RoCE link) and a LAN (10.98.0.0/24,
  their external NIC), each interface under the node's own name (`spvf0`/`spvl0` on n0,
  `spvf1`/`spvl1` on n1: each node's GLOO_SOCKET_IFNAME must be its own, as on hosts cabled
  differently), and loopback;
- its own /dev/shm (a tmpfs in its own mount namespace: POSIX shared memory is a file under
  /dev/shm, so `unshare --ipc` alone would still share it) and its own shim state (the
  node's "Docker": containers, anonymous volumes) and $HOME (the program's env-files);
- n0 also has a link to the machine (10.97.0.10 on `spvo0`, 10.97.0.1 on `spvo-host`): the
  operator's way in, which the runner reaches the API through. Point-to-point links only: a
  bridge on the machine would put the nodes' traffic through the machine's firewall (Docker's
  FORWARD policy is DROP).
The machine's CPUs, memory, PIDs and files (the venv, the model) are shared.

A node's namespaces live while a holder process (`sleep`) does; every command for the node
enters them with nsenter. `down()` kills every process in each node's namespaces by PID,
deletes the namespaces (the veth pairs with them) and the machine's end of the operator link, and
removes the run directory; `leftovers()` says what would remain.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "spark-vllm-cpu"
FABRIC_NET = "10.99.0"
LAN_NET = "10.98.0"
OPERATOR_NET = "10.97.0"
OPERATOR_HOST_IF = "spvo-host"  # the machine's end of n0's operator link


@dataclass
class Node:
    name: str  # n0, n1
    fabric_ip: str
    fabric_if: str
    lan_ip: str
    lan_if: str
    operator_ip: str | None  # n0 only: the runner's way in
    holder: int = 0  # the holder's PID: its namespaces are the node's

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"


def _run(argv: list[str], timeout: float = 20, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)


class Nodes:
    def __init__(self, run_dir: str = f"/run/{PREFIX}") -> None:
        self.run_dir = Path(run_dir)
        self.nodes = [Node("n0", f"{FABRIC_NET}.10", "spvf0", f"{LAN_NET}.10", "spvl0",
                           f"{OPERATOR_NET}.10"),
                      Node("n1", f"{FABRIC_NET}.11", "spvf1", f"{LAN_NET}.11", "spvl1", None)]

    def __getitem__(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # --- up --------------------------------------------------------------------------------

    def up(self, deadline_s: float = 30) -> None:
        """Create both nodes; on any failure remove what was made and raise."""
        end = time.monotonic() + deadline_s
        self.down()  # a killed earlier run's leftovers
        try:
            for n in self.nodes:
                _run(["ip", "netns", "add", n.netns])
            a, b = self.nodes
            for ia, ib in ((a.fabric_if, b.fabric_if), (a.lan_if, b.lan_if)):
                _run(["ip", "link", "add", ia, "netns", a.netns, "type", "veth", "peer",
                      "name", ib, "netns", b.netns])
            _run(["ip", "link", "add", OPERATOR_HOST_IF, "type", "veth", "peer", "name",
                  "spvo0", "netns", a.netns])
            _run(["ip", "addr", "add", f"{OPERATOR_NET}.1/24", "dev", OPERATOR_HOST_IF])
            _run(["ip", "link", "set", OPERATOR_HOST_IF, "up"])
            for n in self.nodes:
                ns = ["ip", "-n", n.netns]
                _run([*ns, "link", "set", "lo", "up"])
                links = [(n.fabric_if, n.fabric_ip), (n.lan_if, n.lan_ip)]
                if n.operator_ip:
                    links.append(("spvo0", n.operator_ip))
                for ifname, ip in links:
                    _run([*ns, "addr", "add", f"{ip}/24", "dev", ifname])
                    _run([*ns, "link", "set", ifname, "up"])
                self._hold(n, end)
        except BaseException:
            self.down()
            raise

    def _hold(self, n: Node, end: float) -> None:
        home = self.run_dir / n.name / "home"
        home.mkdir(parents=True, exist_ok=True)
        # the node's own /dev/shm, in its own mount namespace; `ready` once it is mounted
        script = ("mount -t tmpfs -o mode=1777 tmpfs /dev/shm && echo ready "
                  "&& exec sleep infinity")
        proc = subprocess.Popen(["ip", "netns", "exec", n.netns, "unshare", "--mount",
                                 "--propagation", "private", "sh", "-c", script],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # bounded: the mount either works or fails
        if line != "ready" or time.monotonic() > end:
            proc.kill()
            raise RuntimeError(f"{n.name}: its /dev/shm did not mount: {proc.stderr.read()}")
        n.holder = proc.pid  # `ip netns exec` execs unshare, which execs sh, then sleep
        (self.run_dir / n.name / "holder").write_text(str(proc.pid))

    # --- running on a node -----------------------------------------------------------------

    def env(self, n: Node) -> dict[str, str]:
        """What differs per node in a command's env: its Docker's state and its $HOME."""
        d = self.run_dir / n.name
        return {"SHIM_STATE": str(d / "shim"), "SHIM_VOLUMES": str(d / "volumes"),
                "HOME": str(d / "home")}

    def argv(self, n: Node, argv: list[str]) -> list[str]:
        return ["nsenter", "-t", str(n.holder), "-m", "-n", "--", *argv]

    # --- processes -------------------------------------------------------------------------

    def netns_inode(self, n: Node) -> str | None:
        try:
            st = os.stat(f"/run/netns/{n.netns}")
        except FileNotFoundError:
            return None
        return f"net:[{st.st_ino}]"

    def pids(self, n: Node) -> list[int]:
        """Every process in the node's network namespace (its containers' included)."""
        ns = self.netns_inode(n)
        out = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if ns and os.readlink(p / "ns" / "net") == ns:
                        out.append(int(p.name))
                except OSError:
                    pass
        return out

    def node_of(self, pid: int) -> str | None:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        return next((n.name for n in self.nodes if self.netns_inode(n) == ns), None)

    # --- down ------------------------------------------------------------------------------

    def down(self, deadline_s: float = 20) -> None:
        end = time.monotonic() + deadline_s
        for n in self.nodes:
            while time.monotonic() < end:
                pids = self.pids(n)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            try:
                held = int((self.run_dir / n.name / "holder").read_text())
                os.kill(held, signal.SIGKILL)
            except (FileNotFoundError, ValueError, ProcessLookupError):
                pass
            _run(["ip", "netns", "del", n.netns], check=False)
            n.holder = 0
        _run(["ip", "link", "del", OPERATOR_HOST_IF], check=False)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of the tier remains on the machine: namespaces, links, processes, files."""
        found = []
        netns = _run(["ip", "netns", "list"], check=False).stdout
        found += [f"netns {ln.split()[0]}" for ln in netns.splitlines()
                  if ln.startswith(PREFIX)]
        links = _run(["ip", "-o", "link", "show"], check=False).stdout
        found += [f"link {ln.split(':')[1].strip()}" for ln in links.splitlines()
                  if ln.split(":")[1].strip().split("@")[0] == OPERATOR_HOST_IF]
        for n in self.nodes:
            found += [f"process {pid} in {n.name}" for pid in self.pids(n)]
        if self.run_dir.exists():
            found.append(f"dir {self.run_dir}")
        return found
