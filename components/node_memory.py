"""A node's GPU memory, as vLLM will see it at start. Pure: the script and its parsing.

vLLM refuses to start when the free memory is less than `--gpu-memory-utilization` × total
("Free memory on device … is less than desired GPU memory utilization", vllm/v1/worker/
utils.py request_memory, 0.26.0), and budgets utilization × total for itself. Both numbers are
vllm/utils/mem_utils.py MemorySnapshot.measure's: `torch.accelerator.get_memory_info` (CUDA's
cudaMemGetInfo) for the total, on every GPU; for the free memory the same call on a discrete
GPU, and on an integrated one (`torch.cuda.get_device_properties().is_integrated`: a DGX
Spark's GB10, GH200, Jetson; vllm/platforms/cuda.py is_integrated_gpu) psutil's
`virtual_memory().available`, which is /proc/meminfo's MemAvailable.

CUDA's total is not nvidia-smi's: the driver keeps a part back (615 MiB on an H200: 143771 MiB
for nvidia-smi, 143156 MiB for CUDA), and a budget computed from nvidia-smi's total is larger
than vLLM's by utilization × that part. So the script asks CUDA itself, without a context
(libcuda's cuDeviceTotalMem_v2, the total cudaMemGetInfo reports, and the device's INTEGRATED
attribute), through the node's python3 and ctypes, bounded by `timeout`; where that cannot run
(no python3, no libcuda: the lab's simulated nvidia-smi) nvidia-smi's total stands in. The free
memory is nvidia-smi's on a discrete GPU; on GB10 nvidia-smi reports no memory numbers
("[N/A]") and MemTotal/MemAvailable stand in (the free one is exactly vLLM's). A node without
nvidia-smi (no NVIDIA driver: the lab) is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024.0
DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (0.26.0)

# CU_DEVICE_ATTRIBUTE_INTEGRATED = 18 (cuda.h); one line per device: index, bytes, integrated
CUDA_PY = ("import ctypes\n"
           "c = ctypes.CDLL('libcuda.so.1'); n = ctypes.c_int(); t = ctypes.c_size_t()\n"
           "d = ctypes.c_int(); g = ctypes.c_int()\n"
           "assert c.cuInit(0) == 0 and c.cuDeviceGetCount(ctypes.byref(n)) == 0\n"
           "for i in range(n.value):\n"
           "    assert c.cuDeviceGet(ctypes.byref(d), i) == 0\n"
           "    assert c.cuDeviceTotalMem_v2(ctypes.byref(t), d) == 0\n"
           "    assert c.cuDeviceGetAttribute(ctypes.byref(g), 18, d) == 0\n"
           "    print('cuda-total %d %d %d' % (i, t.value, g.value))\n")

SCRIPT = r"""PATH="$PATH:/usr/sbin:/sbin"
if ! command -v nvidia-smi >/dev/null 2>&1; then echo "none"; exit 0; fi
timeout 10 python3 -c "CUDA_PY" 2>/dev/null || true
out=$(nvidia-smi --query-gpu=memory.total,memory.free --format=csv,noheader,nounits 2>/dev/null)
if printf '%s\n' "$out" | head -n 1 | grep -Eq '^ *[0-9]+ *, *[0-9]+ *$'; then
  printf '%s\n' "$out" | sed 's/^/nvidia-smi /'
else
  awk '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2}
       END {printf "meminfo %d, %d\n", t / 1024, a / 1024}' /proc/meminfo
fi
""".replace("CUDA_PY", CUDA_PY)


@dataclass(frozen=True)
class GpuMemory:
    source: str  # "nvidia-smi" or "meminfo" (unified memory): where total_mib/free_mib come from
    total_mib: int
    free_mib: int
    cuda_total: int = 0  # bytes, CUDA's own total (what vLLM budgets from); 0: not read

    @property
    def total_bytes(self) -> int:
        """The total vLLM multiplies by --gpu-memory-utilization: CUDA's, else the source's."""
        return self.cuda_total or self.total_mib << 20

    @property
    def free_bytes(self) -> int:
        return self.free_mib << 20

    def describe(self) -> str:
        cuda = " (CUDA's total)" if self.cuda_total else ""
        return (f"{self.free_mib / GIB:.1f} GiB free of {self.total_bytes / 2**30:.1f} GiB "
                f"({self.source}{cuda})")


def parse(text: str) -> list[GpuMemory] | None:
    """The script's output: one entry per GPU, or None when the node has no nvidia-smi.
    `cuda-total I BYTES INTEGRATED` lines give GPU I CUDA's total."""
    out: list[GpuMemory] = []
    cuda: dict[int, int] = {}
    for line in text.strip().splitlines():
        if line.strip() == "none":
            return None
        source, _, numbers = line.strip().partition(" ")
        if source == "cuda-total":
            try:
                index, total_bytes, _integrated = (int(x) for x in numbers.split())
                cuda[index] = total_bytes
            except ValueError:
                pass
            continue
        total, _, free = numbers.partition(",")
        try:
            out.append(GpuMemory(source, int(total.strip()), int(free.strip())))
        except ValueError:
            continue
    if out and out[0].source == "meminfo" and len(out) == 1 and len(cuda) == 1:
        cuda = {0: next(iter(cuda.values()))}  # unified memory: one line stands for the GPU
    out = [GpuMemory(g.source, g.total_mib, g.free_mib, cuda.get(i, 0))
           for i, g in enumerate(out)]
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
        need = util * g.total_bytes
        if g.free_bytes < need:
            return (f"{node}: GPU {i}: {g.describe()}; vLLM needs {util:g} × "
                    f"{g.total_bytes / 2**30:.1f} = {need / 2**30:.1f} GiB free to start")
    return None


def start_order_free(total_bytes: int, free_bytes: int, held: float,
                     shares: list[tuple[str, float]]) -> list[tuple[str, int]]:
    """Several models on one node (spec_models.py), started in order: the free memory each one
    sees at its start. vLLM takes utilization × total for itself at start (its KV cache fills
    the budget), so the second start sees the first's share gone. `held`: the utilizations of
    the stack's own models running there now, summed: the ones this `up` replaces give theirs
    back first, and the ones it keeps are counted in `shares` again, so the whole set is
    checked as it will run."""
    free = min(total_bytes, free_bytes + int(held * total_bytes))
    out = []
    for name, util in shares:
        out.append((name, free))
        free -= int(util * total_bytes)
    return out


def share_lines(node: str, total_bytes: int, free_bytes: int, held: float,
                shares: list[tuple[str, float]]) -> list[str]:
    """A node's shares, for the refusal: every model's utilization × total, then the sum
    against what the node has free."""
    gib = 2 ** 30
    lines = [f"{node}: total {total_bytes / gib:.1f} GiB, free now {free_bytes / gib:.1f} GiB"
             + (f" (+ {held * total_bytes / gib:.1f} GiB of this stack's models running there)"
                if held else "")]
    lines += [f"  {name}: {util:g} × {total_bytes / gib:.1f} = {util * total_bytes / gib:.1f} GiB"
              for name, util in shares]
    want = sum(u for _, u in shares)
    have = min(total_bytes, free_bytes + int(held * total_bytes))
    lines.append(f"  together: {want:g} × total = {want * total_bytes / gib:.1f} GiB of "
                 f"{have / gib:.1f} GiB free" + (" — does not fit" if want * total_bytes > have
                                                 else ""))
    return lines
