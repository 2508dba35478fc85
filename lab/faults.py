"""Faults the lab puts on a node: a wedged vLLM rank, and a GPU's memory as nvidia-smi says it.

`wedge`: SIGSTOP (or, thawing, SIGCONT) the vLLM rank processes in a node's Ray container, as
the GPU tier froze one rank of real vLLM 0.26.0 (tests/fixtures/real-vllm/vllm-0.26.0.json,
scenarios frozen_*): /health stays 200, no request gets a first token, the token counter
stands still. A rank is a Ray actor process, which Ray titles `ray::<actor class>` (its argv,
so /proc/PID/cmdline), `ray::<class>.<method>` while a method runs: RayWorkerProc (vllm-sim
V2, named as vLLM's own, vllm/v1/executor/ray_executor_v2.py) or RaySimWorker (vllm-sim
legacy). The Ray container is the program's, named `spark-vllm-<stack>-ray-head` on the head
node and `spark-vllm-<stack>-ray-worker` on the others (components/render/commands.py
container_name); the program's vLLM container holds only the driver.

`gpu-memory`: the lab's nodes have no GPU. This installs a fake `nvidia-smi` on the node host
(the lab node container, where the program's preflight and memory check run their shell) that
answers the one query the program makes, `nvidia-smi --query-gpu=memory.total,memory.free
--format=csv,noheader,nounits`, with "TOTAL, FREE" in MiB read from a values file, so the
numbers can be changed without reinstalling; any other call prints a one-line notice, exit 0.
`--clear` removes both (only a fake of the lab's: a real nvidia-smi is never touched).

Both run through `docker exec` on the node container, as lab/fabric.py does, so they work
whatever state the node's SSH is in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lab.config import NodeAddrs
from lab.run import LabError, run

# --- wedge ------------------------------------------------------------------------------------

RANK_CLASSES = ("RayWorkerProc", "RaySimWorker")
RANK_PATTERN = r"^ray::(" + "|".join(RANK_CLASSES) + r")\b"
# what the lab names the program's containers: spark_vllm.components.render.commands LABEL, HEAD, WORKER
RAY_ROLES = ("ray-head", "ray-worker")


def ray_containers(stack: str) -> list[str]:
    return [f"spark-vllm-{stack}-{role}" for role in RAY_ROLES]


# Run inside a Ray container with its python3: argv SIGNAL CONTAINER. Signal "0" only lists.
# One JSON line per rank process; exit 4 when there is none.
FINDER = r"""
import json, os, re, signal, sys
pattern = re.compile(PATTERN)
name, container = sys.argv[1], sys.argv[2]
sig = 0 if name == "0" else getattr(signal, name)
found = 0
for entry in sorted(os.listdir("/proc"), key=lambda e: (len(e), e)):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:
        with open("/proc/%s/cmdline" % entry, "rb") as f:
            title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    if not pattern.match(title):
        continue
    found += 1
    error = None
    try:
        os.kill(int(entry), sig)
    except OSError as err:
        error = str(err)
    print(json.dumps({"pid": int(entry), "cmdline": title, "container": container,
                      "signal": name, "error": error}))
sys.exit(0 if found else 4)
""".replace("PATTERN", repr(RANK_PATTERN))

# Run on the node host: argv STACK SIGNAL FINDER. The finder in every running Ray container
# of the stack; exit 0 when one held a rank process, 4 when there is no such container or no
# rank process in it, another code when `docker exec` itself failed.
_WEDGE_NODE_SH = r"""
stack=$1 sig=$2 finder=$3 seen= rc=4
for role in ray-head ray-worker; do
  c="spark-vllm-$stack-$role"
  [ "$(docker inspect -f '{{.State.Running}}' "$c" 2>/dev/null)" = true ] || continue
  seen="$seen $c"
  r=0; docker exec "$c" python3 -c "$finder" "$sig" "$c" || r=$?
  if [ "$r" = 0 ]; then rc=0
  elif [ "$r" != 4 ]; then
    echo "docker exec in $c failed (exit $r)" >&2; [ "$rc" = 0 ] || rc=$r
  fi
done
[ -n "$seen" ] || echo "no running Ray container (spark-vllm-$stack-ray-head or" \
  "spark-vllm-$stack-ray-worker) on this node" >&2
[ -z "$seen" ] || [ "$rc" != 4 ] || echo "no vLLM rank process in$seen" >&2
exit "$rc"
"""


@dataclass(frozen=True)
class RankProcess:
    pid: int
    cmdline: str
    container: str
    signal: str
    error: str | None = None


def parse_finder_output(text: str) -> list[RankProcess]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        out.append(RankProcess(d["pid"], d["cmdline"], d["container"], d["signal"], d.get("error")))
    return out


def wedge_argv(node: NodeAddrs, stack: str, thaw: bool) -> list[str]:
    sig = "SIGCONT" if thaw else "SIGSTOP"
    return ["docker", "exec", node.container, "sh", "-c", _WEDGE_NODE_SH, "sh", stack, sig,
            FINDER]


def wedge(node: NodeAddrs, stack: str, thaw: bool = False) -> list[RankProcess]:
    """SIGSTOP (thaw: SIGCONT) every vLLM rank process in the node's Ray container(s)."""
    proc = run(wedge_argv(node, stack, thaw), check=False, timeout=60)
    ranks = parse_finder_output(proc.stdout)
    if proc.returncode == 4 or (proc.returncode == 0 and not ranks):
        why = proc.stderr.strip() or "no vLLM rank process"
        raise LabError(f"{node.name}: {why} (a rank is a process titled "
                       f"{' or '.join('ray::' + c for c in RANK_CLASSES)}: is vLLM serving "
                       f"with stack {stack!r}?)")
    if proc.returncode != 0:
        raise LabError(f"{node.name}: wedge failed (exit {proc.returncode}): "
                       f"{proc.stderr.strip()}")
    failed = [r for r in ranks if r.error]
    if failed:
        raise LabError(f"{node.name}: could not signal " + "; ".join(
            f"pid {r.pid} ({r.cmdline}): {r.error}" for r in failed))
    return ranks


# --- gpu-memory --------------------------------------------------------------------------------

NVIDIA_SMI = "/usr/local/bin/nvidia-smi"
GPU_MEMORY_FILE = "/var/lib/spark-vllm-lab/gpu-memory"
FAKE_MARK = "lab: simulated nvidia-smi"
QUERY = ("--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits")

_FAKE_NVIDIA_SMI = r"""#!/bin/sh
# MARK, installed by `python -m lab gpu-memory` (spark-vllm's lab: this node has no GPU).
# Answers `nvidia-smi Q1 Q2` with "TOTAL, FREE" (MiB) from VALUES
# (lines total_mib=N and free_mib=N: edit them to change the answer); anything else: a notice.
values='VALUES'
if [ "$#" -eq 2 ] && { [ "$1 $2" = "Q1 Q2" ] || [ "$2 $1" = "Q1 Q2" ]; }; then
  total= free=
  if [ -r "$values" ]; then
    while IFS='=' read -r key value; do
      case $key in total_mib) total=$value ;; free_mib) free=$value ;; esac
    done < "$values"
  fi
  case "$total,$free" in
    ,*|*,|*[!0-9,]*) echo "MARK: no memory values in $values" >&2; exit 9 ;;
  esac
  printf '%s, %s\n' "$total" "$free"
  exit 0
fi
echo "MARK (no GPU on this lab node; only Q1 Q2 is answered)"
exit 0
"""


def fake_nvidia_smi(values_path: str = GPU_MEMORY_FILE) -> str:
    """The fake's text, reading its numbers from `values_path`."""
    if "'" in values_path:
        raise ValueError(f"values path with a quote: {values_path!r}")
    return (_FAKE_NVIDIA_SMI.replace("MARK", FAKE_MARK).replace("VALUES", values_path)
            .replace("Q1", QUERY[0]).replace("Q2", QUERY[1]))


def values_text(total_mib: int, free_mib: int) -> str:
    return f"total_mib={total_mib}\nfree_mib={free_mib}\n"


def to_mib(gib: float) -> int:
    return int(round(gib * 1024))


def check_gpu_memory_args(total_gib: float | None, free_gib: float | None,
                          clear: bool) -> str | None:
    """What is wrong with `gpu-memory`'s arguments, or None."""
    if clear:
        if total_gib is not None or free_gib is not None:
            return "--clear takes no --total-gib/--free-gib"
        return None
    if total_gib is None or free_gib is None:
        return "give --total-gib and --free-gib, or --clear"
    if total_gib <= 0:
        return f"--total-gib must be > 0, got {total_gib:g}"
    if not 0 <= free_gib <= total_gib:
        return f"--free-gib must be within 0..{total_gib:g} (--total-gib), got {free_gib:g}"
    return None


# argv BIN VALUES TOTAL_MIB FREE_MIB, the fake on stdin. Never replaces an nvidia-smi that is
# not the lab's (exit 3). Prints the answer of the installed fake and what `nvidia-smi` on
# PATH resolves to.
_INSTALL_SH = r"""
set -e
bin=$1 values=$2
if [ -e "$bin" ] && ! grep -q "MARK" "$bin"; then
  echo "$bin exists and is not the lab's fake nvidia-smi: left alone" >&2; exit 3
fi
umask 022
mkdir -p "$(dirname "$values")" "$(dirname "$bin")"
printf 'total_mib=%s\nfree_mib=%s\n' "$3" "$4" > "$values.tmp"
mv -f "$values.tmp" "$values"
cat > "$bin.lab-tmp"
chmod 0755 "$bin.lab-tmp"
mv -f "$bin.lab-tmp" "$bin"
echo "answer: $("$bin" Q1 Q2)"
echo "on PATH: $(command -v nvidia-smi || echo none)"
""".replace("MARK", FAKE_MARK).replace("Q1", QUERY[0]).replace("Q2", QUERY[1])

# argv BIN VALUES: removes the fake and its values; a real nvidia-smi is left alone (exit 3).
_CLEAR_SH = r"""
set -e
bin=$1 values=$2
if [ -e "$bin" ] && ! grep -q "MARK" "$bin"; then
  echo "$bin is not the lab's fake nvidia-smi: left alone" >&2; exit 3
fi
rm -f "$bin" "$values"
echo "on PATH: $(command -v nvidia-smi || echo none)"
""".replace("MARK", FAKE_MARK)


def install_script() -> str:
    return _INSTALL_SH


def clear_script() -> str:
    return _CLEAR_SH


def gpu_memory_argv(node: NodeAddrs, script: str, *args: str) -> list[str]:
    return ["docker", "exec", "-i", node.container, "sh", "-c", script, "sh", *args]


def set_gpu_memory(node: NodeAddrs, total_mib: int, free_mib: int) -> str:
    """Install the fake nvidia-smi on the node with these numbers; returns its report."""
    argv = gpu_memory_argv(node, install_script(), NVIDIA_SMI, GPU_MEMORY_FILE,
                           str(total_mib), str(free_mib))
    proc = run(argv, input=fake_nvidia_smi(), check=False, timeout=60)
    if proc.returncode != 0:
        raise LabError(f"{node.name}: installing the fake nvidia-smi failed "
                       f"(exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


def clear_gpu_memory(node: NodeAddrs) -> str:
    proc = run(gpu_memory_argv(node, clear_script(), NVIDIA_SMI, GPU_MEMORY_FILE),
               check=False, timeout=60)
    if proc.returncode != 0:
        raise LabError(f"{node.name}: removing the fake nvidia-smi failed "
                       f"(exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()

