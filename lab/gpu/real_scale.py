"""Real-scale memory recordings (issue 45): real vLLM 0.26.0's own memory lines for
real-dimension models (lab/gpu/real_scale_models.py) at the configurations an operator picks.

Runs on the GPU machine (lab/gpu/README.md, "Real scale"): `vllm serve SNAPSHOT --load-format
dummy ARGS` as one node runs it (the API server and its engine core; at TP 1 the engine core
holds the worker), with the GPU tier's env (runner.MACHINE_ENV, runner.SIZED_ENV) and one
VLLM_CACHE_ROOT kept across starts. A case ends when vLLM says its engine is up ("init
engine ... took": the profile, the KV cache and the CUDA-graph capture are behind it, so the
memory it was admitted with held), when it exits (a refusal: its lines say which), or at its
deadline. The engine is then stopped and the GPU's memory waited back before the next case.

Resumable across device calls: each finished case is kept in STATE (on the machine, which
stays warm ~30 s between calls) and every call writes all finished cases to OUT; a case the
call's deadline would cut is not started (its expected length: COLD_S for a model's first
start on the machine, WARM_S after), so calls made back to back go on where the last stopped.

    python3 lab/gpu/real_scale.py --hf DIR --out DIR --state DIR --until EPOCH [--cases a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_scale_models  # noqa: E402

# the GPU tier's process env (runner.py MACHINE_ENV, SIZED_ENV): NVLink multicast off,
# flashinfer's sampler off (it does not travel), DeepGEMM off (a GB10 does not run it; its
# warmup JIT takes minutes), Triton's JIT cache kept across starts
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
       "NVSHMEM_DISABLE_NVLS": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0",
       "TRITON_CACHE_DIR": "/root/vllm-cache/triton", "VLLM_USE_DEEP_GEMM": "0",
       "VLLM_MOE_USE_DEEP_GEMM": "0", "VLLM_DEEP_GEMM_WARMUP": "skip",
       "VLLM_CACHE_ROOT": "/root/vllm-cache", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
GDN = ("--additional-config", '{"gdn_prefill_backend": "triton"}')  # no flashinfer there
COLD_S, WARM_S, CASE_LIMIT_S = 330, 170, 480
PORT = 8123
MARKS = re.compile(
    r"GiB|memory|Memory|KV cache|graph|Graph|max_num_seqs|max_model_len|maximum model length|"
    r"oncurrency|Error|error|Traceback|OutOfMemory|took|block size|Mamba|Encoder cache|"
    r"Auto-fit|reduced|Free memory|capture|Capturing|Exception|Killed|profil")


def case(kind: str, *args: str) -> tuple[str, tuple[str, ...]]:
    return kind, ((*GDN, *args) if kind.startswith("q35") else args)


def _len(n: str | int, util: float, seqs: int | None = None,
         *extra: str) -> tuple[str, ...]:
    out = ("--max-model-len", str(n), "--gpu-memory-utilization", str(util))
    return out + (("--max-num-seqs", str(seqs)) if seqs else ()) + extra


KV8 = ("--kv-cache-dtype", "fp8")
# In the order they run: the seeds' class first (the nearly-full GPU with few sequences, and
# with vLLM's default 1024, which its CUDA-graph profile cannot hold), then the CUDA-graph
# estimate's growth with the model (half and a third of the 122B at 1024), the dense and the
# plain MoE, then the spread of --max-num-seqs, lengths and an fp8 KV cache.
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "q122_u095_s32_l32k": case("q35-122b", *_len(32768, 0.95, 32)),
    "q122_u095_s1024_l8k": case("q35-122b", *_len(8192, 0.95)),
    "q122h_u09_s1024_l64k": case("q35-122b-half", *_len(65536, 0.9)),
    "q35b_u05_s1024_l32k": case("q35-35b", *_len(32768, 0.5)),
    "dense32_u06_s1024_l16k": case("qwen3-32b", *_len(16384, 0.6)),
    "moe30_u05_s1024_l32k": case("qwen3-30b-a3b", *_len(32768, 0.5)),
    "q122_u095_s128_l8k": case("q35-122b", *_len(8192, 0.95, 128)),
    "q122h_u07_s64_l16k_kv8": case("q35-122b-half", *_len(16384, 0.7, 64, *KV8)),
    "q35b_u09_s32_auto": case("q35-35b", *_len("auto", 0.9, 32)),
    "dense32_u095_s32_auto": case("qwen3-32b", *_len("auto", 0.95, 32)),
    "moe30_u03_s64_l16k_kv8": case("qwen3-30b-a3b", *_len(16384, 0.3, 64, *KV8)),
    "q122_u09_s64_auto": case("q35-122b", *_len("auto", 0.9, 64)),
    "q122h_u095_s256_l32k": case("q35-122b-half", *_len(32768, 0.95, 256)),
    "q35b_u03_s512_l8k": case("q35-35b", *_len(8192, 0.3, 512)),
    "dense32_u08_s256_l32k_kv8": case("qwen3-32b", *_len(32768, 0.8, 256, *KV8)),
    "moe30_u09_s128_auto": case("qwen3-30b-a3b", *_len("auto", 0.9, 128)),
}


def gpu_facts() -> dict[str, Any]:
    code = ("import torch, json; f, t = torch.cuda.mem_get_info(); "
            "p = torch.cuda.get_device_properties(0); "
            "print(json.dumps({'free': f, 'total': t, 'name': p.name, "
            "'torch': torch.__version__}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,"
                          "driver_version", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)
    return {"torch": json.loads(r.stdout) if r.returncode == 0 else r.stderr[-500:],
            "nvidia_smi": smi.stdout.strip()}


def gpu_used_mib() -> int:
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                        "nounits"], capture_output=True, text=True, timeout=30)
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.strip() else -1


def stop(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    subprocess.run(["pkill", "-9", "-f", "vllm.entrypoints"], check=False)  # stray ranks


def run_case(name: str, snap: str, kind: str, args: tuple[str, ...], limit_s: float) -> dict:
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", snap,
            "--load-format", "dummy", "--served-model-name", kind, "--port", str(PORT), *args]
    env = {**os.environ, **ENV}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True, bufsize=1)
    lines: list[tuple[float, str]] = []
    up = threading.Event()

    def read() -> None:
        assert proc.stdout
        for line in proc.stdout:
            lines.append((round(time.monotonic() - t0, 1), line.rstrip()))
            if "init engine" in line or "Application startup complete" in line:
                up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    outcome = "cut"
    while time.monotonic() - t0 < limit_s:
        if up.wait(2):
            outcome = "started"
            break
        if proc.poll() is not None:
            outcome = "exited"
            break
    rc = proc.poll()
    seconds = round(time.monotonic() - t0, 1)
    stop(proc)
    reader.join(10)
    freed_by = time.monotonic() + 90
    while gpu_used_mib() > 2048 and time.monotonic() < freed_by:
        time.sleep(1)
    kept = [f"{t:7.1f} {ln[:500]}" for t, ln in lines if MARKS.search(ln)]
    return {"kind": kind, "args": list(args), "outcome": outcome, "rc": rc,
            "seconds": seconds, "gpu_used_mib_after": gpu_used_mib(), "log": kept[:300],
            "tail": [f"{t:7.1f} {ln[:700]}" for t, ln in lines[-40:]] if outcome != "started"
            else []}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hf", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--until", type=float, required=True, help="epoch seconds: start nothing "
                   "that would not end before it")
    p.add_argument("--cases", default="")
    a = p.parse_args()
    state, out = Path(a.state), Path(a.out)
    state.mkdir(parents=True, exist_ok=True)
    names = [n for n in a.cases.split(",") if n] or list(CASES)
    log = open(out / "real-scale-progress.log", "a")

    def say(msg: str) -> None:
        line = f"[real-scale {time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    facts = state / "_gpu.json"
    if not facts.exists():
        facts.write_text(json.dumps(gpu_facts()))
    models = state / "_models.json"
    made = json.loads(models.read_text()) if models.exists() else {}
    warm = set(json.loads((state / "_warm.json").read_text())) if (
        state / "_warm.json").exists() else set()
    for n in names:
        kind, args = CASES[n]
        if (state / f"{n}.json").exists():
            continue
        if kind not in made:
            made[kind] = real_scale_models.write(Path(a.hf), kind)
            models.write_text(json.dumps(made))
            say(f"model {kind}: {made[kind]['weight_bytes'] / 2**30:.2f} GiB of weights, "
                f"{made[kind]['disk_bytes'] >> 20} MiB on disk")
        need = WARM_S if kind in warm else COLD_S
        left = a.until - time.time()
        if left < need:
            say(f"{n}: not started ({left:.0f} s left, ~{need} s needed)")
            continue
        say(f"{n}: {kind} {' '.join(args)}")
        r = run_case(n, made[kind]["path"], kind, args, min(CASE_LIMIT_S, left - 15))
        say(f"{n}: {r['outcome']} rc={r['rc']} in {r['seconds']} s; "
            + " | ".join(ln.split(' ', 1)[-1][-160:] for ln in r["log"]
                         if "Available KV" in ln or "Error" in ln)[:600])
        if r["outcome"] != "cut":
            (state / f"{n}.json").write_text(json.dumps(r))
            warm.add(kind)
            (state / "_warm.json").write_text(json.dumps(sorted(warm)))
    done = {p.stem: json.loads(p.read_text()) for p in sorted(state.glob("[!_]*.json"))}
    header = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": os.environ.get("SPARK_VLLM_COMMIT", "unknown"),
              "gpu": json.loads(facts.read_text()), "models": made,
              "layout": "vllm serve SNAPSHOT --load-format dummy (TP 1: the engine core holds "
                        "the worker), env lab/gpu/real_scale.py ENV"}
    try:
        import vllm  # noqa: PLC0415
        header["vllm"] = vllm.__version__
    except Exception as err:  # noqa: BLE001
        header["vllm"] = f"not importable: {err}"
    (out / "real-scale.json").write_text(json.dumps({"header": header, "scenarios": done},
                                                    indent=1))
    say(f"{len(done)} of {len(CASES)} cases recorded")


if __name__ == "__main__":
    main()
