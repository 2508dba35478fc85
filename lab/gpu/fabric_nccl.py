"""The fabric check's NCCL path on the GPU machine (issue 37): the check's own script
(components/scripts/fabric_check.py) run as the program runs it on a node, on one H200.

Two halves:

  python3 lab/gpu/fabric_nccl.py plan PLAN.json
      here (the .venv): each scenario's nodes, with the argv and env the program renders for
      their check containers (render/fabric_commands.py docker_argv: the `--env` pairs, and
      what follows `--entrypoint python3 IMAGE -`). The machine there has no pydantic.
  python3 lab/gpu/fabric_nccl.py run PLAN.json SCRIPT OUT.json
      there (stdlib only): every scenario, each node's rank at once, as `python3 - ARGS` with
      the script on stdin and the machine's env plus the node's; bounded (the script's own
      deadline, then ours: a rank past it is killed and said). OUT.json holds every rank's
      JSON line, exit code, seconds, stderr tail, and the NCCL INFO lines it wrote.

The scenarios. One GPU holds every rank, with the loopback interface as the fabric (nodes on
127.0.0.1, .2, .3; fabricInterface lo):
- `one-gpu-two-ranks`: two nodes exactly as the program would run them: NCCL refuses two ranks
  on one GPU ("Duplicate GPU detected"), and the script must say so, not hang;
- `self-test`: one node, `--world-size 1` (never rendered by the program, which runs the check
  from two nodes: fabric_commands.needed): NCCL's init, version and timings on this GPU alone;
- `two-hosts-one-gpu`, `three-hosts-one-gpu`: each rank also gets NCCL_HOSTID (its node's
  name), which the program never sets: NCCL then takes the ranks for separate hosts (its host
  hash is NCCL_HOSTID's, github.com/NVIDIA/nccl src/misc/utils.cc getHostHash at v2.28.9-1) and
  connects them with its network transport, NET/Socket over lo: real inter-"node" NCCL lines,
  with figures that are the GPU's time slicing between processes, not a fabric;
- `two-hosts-ibhca`: the same with the nodes' ibHca set (NCCL_IB_HCA) on a machine with no IB
  device: the field's silent fallback to TCP sockets, which the verdict must name.
Every rank runs with NVLink multicast off (NCCL_NVLS_ENABLE=0 …), as the machine requires.
The record of a run and how its files reached the machine: tests/fixtures/fabric-nccl/README.md.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
# name, nodes, NCCL_HOSTID per rank, the nodes' ibHca, what the scenario shows
SCENARIOS = (
    ("one-gpu-two-ranks", 2, False, None, "two ranks on one GPU, as the program runs them"),
    ("self-test", 1, False, None, "--world-size 1: NCCL on this GPU alone"),
    ("two-hosts-one-gpu", 2, True, None, "NCCL_HOSTID per rank: NET/Socket over lo"),
    ("three-hosts-one-gpu", 3, True, None,
     "NCCL_HOSTID per rank: three pairs, NET/Socket over lo"),
    ("two-hosts-ibhca", 2, True, "rocep1s0f1,roceP2p1s0f1",
     "ibHca set (a Spark's two HCAs) where no IB device is: NCCL falls back to NET/Socket"),
)
MARGIN_S = 30  # ours over the script's own deadline


def plan(path: str) -> None:
    """Each scenario's nodes as the program renders their check (run here, in the .venv)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from components.render import fabric_commands as fabric
    from components.spec import parse_spec

    out = []
    for k, (name, n, hostid, hca, what) in enumerate(SCENARIOS):
        raw = {"nodes": [{"name": f"n{i}", "host": f"127.0.0.{i + 1}", "gpus": 1,
                          "fabricIp": f"127.0.0.{i + 1}", "fabricInterface": "lo",
                          **({"ibHca": hca} if hca else {})}
                         for i in range(n)],
               "image": "vllm/vllm-openai:v0.26.0", "model": "Qwen/Qwen3-0.6B",
               "tensorParallelSize": n, "insecureAcceptAnyHostKey": True,
               "masterPort": 29500 + 20 * k, "fabricCheck": {"timeout": 60}}
        spec = parse_spec(raw, "gpu", frozenset({"sshPrivateKey"}))
        nodes = []
        for node in spec.nodes:
            argv = fabric.docker_argv(spec, node)
            env = dict(kv.split("=", 1) for flag, kv in zip(argv, argv[1:], strict=False)
                       if flag == "--env")
            entry = argv.index("--entrypoint")
            assert argv[entry + 1:entry + 4] == ["python3", spec.image, "-"], argv
            nodes.append({"node": node.name, "env": env, "args": argv[entry + 4:],
                          "docker": argv})
        out.append({"name": name, "hostid": hostid, "what": what, "nodes": nodes})
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


def _sh(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"({err})"


def machine() -> dict[str, Any]:
    probe = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': "
             "torch.version.cuda, 'nccl': '.'.join(map(str, torch.cuda.nccl.version())), "
             "'gpus': torch.cuda.device_count()}))")
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hostname": socket.gethostname(), "kernel": platform.release(),
            "python": _sh(["python3", "-c", "import sys; print(sys.version.split()[0])"]),
            "versions": json.loads(_sh(["python3", "-c", probe]) or "{}"),
            "gpu": _sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id",
                        "--format=csv,noheader"]),
            "interfaces": [n for _, n in socket.if_nameindex()]}


def run_scenario(sc: dict[str, Any], script: str, logs: str) -> dict[str, Any]:
    procs = []
    t0 = time.monotonic()
    for node in sc["nodes"]:
        keep = os.path.join(logs, sc["name"], node["node"])
        env = {**os.environ, **MULTICAST_OFF, **node["env"]}
        if sc["hostid"]:
            env["NCCL_HOSTID"] = f"spark-vllm-{node['node']}"
        with open(script) as stdin:
            procs.append((node, keep, subprocess.Popen(
                ["python3", "-", *node["args"], "--keep-logs", keep], stdin=stdin,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)))
    deadline = float(sc["nodes"][0]["args"][sc["nodes"][0]["args"].index("--deadline") + 1])
    ranks = []
    for node, keep, p in procs:
        left = max(1.0, deadline + MARGIN_S - (time.monotonic() - t0))
        try:
            stdout, stderr = p.communicate(timeout=left)
            killed = False
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate(timeout=10)
            killed = True
        files = {}
        for f in sorted(Path(keep).glob("*.log")) if os.path.isdir(keep) else []:
            files[f.name] = f.read_text(errors="replace")
        ranks.append({"node": node["node"], "args": node["args"], "env": node["env"],
                      "exit": p.returncode, "killedByRunner": killed,
                      "seconds": round(time.monotonic() - t0, 2),
                      "stdout": stdout, "stderrTail": stderr[-3000:], "logs": files})
    return {"name": sc["name"], "what": sc["what"], "ncclHostid": sc["hostid"],
            "ranks": ranks}


def run(plan_path: str, script: str, out: str) -> int:
    scenarios = json.loads(Path(plan_path).read_text())
    result: dict[str, Any] = {"machine": machine(), "scenarios": []}
    with tempfile.TemporaryDirectory(prefix="fabric-nccl-") as logs:
        for sc in scenarios:
            r = run_scenario(sc, script, logs)
            result["scenarios"].append(r)
            for rank in r["ranks"]:
                print(f"[{sc['name']}] {rank['node']}: exit {rank['exit']} in "
                      f"{rank['seconds']} s: {rank['stdout'].strip()[:600]}", flush=True)
            Path(out).write_text(json.dumps(result, indent=1) + "\n")  # kept as it goes
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["plan"] and len(sys.argv) == 3:
        plan(sys.argv[2])
    elif sys.argv[1:2] == ["run"] and len(sys.argv) == 5:
        sys.exit(run(*sys.argv[2:]))
    else:
        sys.exit(__doc__)
