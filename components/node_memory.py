"""A node's free GPU memory, as vLLM will see it at start. Pure: the script and its parsing.

vLLM refuses to start when the free memory is less than `--gpu-memory-utilization` × total
("Free memory on device … is less than desired GPU memory utilization", vllm/v1/worker/
utils.py request_memory, 0.26.0). On a discrete GPU `nvidia-smi` says both numbers. On a
DGX Spark's GB10 (unified memory) it reports no memory numbers ("[N/A]"), and CUDA's free
memory follows the kernel's available memory, so /proc/meminfo's MemTotal and MemAvailable
stand in. A node without nvidia-smi (no NVIDIA driver: the lab) is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024.0
DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (0.26.0)

SCRIPT = r"""PATH="$PATH:/usr/sbin:/sbin"
if ! command -v nvidia-smi >/dev/null 2>&1; then echo "none"; exit 0; fi
out=$(nvidia-smi --query-gpu=memory.total,memory.free --format=csv,noheader,nounits 2>/dev/null)
if printf '%s\n' "$out" | head -n 1 | grep -Eq '^ *[0-9]+ *, *[0-9]+ *$'; then
  printf '%s\n' "$out" | sed 's/^/nvidia-smi /'
else
  awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2}
       END {printf "meminfo %d, %d\n", t / 1024, a / 1024}' /proc/meminfo
fi
"""


@dataclass(frozen=True)
class GpuMemory:
    source: str  # "nvidia-smi" or "meminfo" (unified memory)
    total_mib: int
    free_mib: int

    def describe(self) -> str:
        return (f"{self.free_mib / GIB:.1f} GiB free of {self.total_mib / GIB:.1f} GiB "
                f"({self.source})")


def parse(text: str) -> list[GpuMemory] | None:
    """The script's output: one entry per GPU, or None when the node has no nvidia-smi."""
    out = []
    for line in text.strip().splitlines():
        if line.strip() == "none":
            return None
        source, _, numbers = line.strip().partition(" ")
        total, _, free = numbers.partition(",")
        try:
            out.append(GpuMemory(source, int(total.strip()), int(free.strip())))
        except ValueError:
            continue
    return out or None


def flag_value(vllm_args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value of `--flag` in vLLM's args, either spelling (`--a-b` or `--a_b`, `=` or not)."""
    args = list(vllm_args)
    spellings = (flag, "--" + flag[2:].replace("-", "_"))
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in spellings:
            return value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return None


def utilization(vllm_args: list[str] | tuple[str, ...]) -> float:
    """--gpu-memory-utilization from vLLM's args, else vLLM's default."""
    try:
        return float(flag_value(vllm_args, "--gpu-memory-utilization") or DEFAULT_UTILIZATION)
    except ValueError:
        return DEFAULT_UTILIZATION


def shortfall(node: str, gpus: list[GpuMemory], util: float) -> str | None:
    """Why vLLM cannot start on `node` with these numbers, or None."""
    for i, g in enumerate(gpus):
        need = util * g.total_mib
        if g.free_mib < need:
            return (f"{node}: GPU {i}: {g.describe()}; vLLM needs {util:g} × "
                    f"{g.total_mib / GIB:.1f} = {need / GIB:.1f} GiB free to start")
    return None
