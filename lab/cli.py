"""`python -m lab up|down|images|status|ssh|reboot|power-off|power-on|block-fabric|unblock-fabric|wedge|gpu-memory|model|info` (stdlib + PyYAML)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from lab import cluster, config, faults, keys, model
from lab.run import LabError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lab",
        description="Simulated DGX Spark nodes (Docker-in-Docker) for spark-vllm.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="create or converge the lab; writes stacks/Pulumi.<stack>.yaml")
    up.add_argument("--nodes", type=int, default=config.DEFAULT_NODES, help="number of nodes (default %(default)s)")
    up.add_argument("--mgmt-subnet", default=config.DEFAULT_MGMT_SUBNET, help="default %(default)s")
    up.add_argument("--fabric-subnet", default=config.DEFAULT_FABRIC_SUBNET, help="default %(default)s")
    up.add_argument("--stack", default=config.DEFAULT_STACK, help="stack name (default %(default)s)")
    up.add_argument("--tp", type=int, default=None, help="tensorParallelSize (default: --nodes)")
    up.add_argument("--pp", type=int, default=1, help="pipelineParallelSize (default %(default)s)")
    up.add_argument("--sim-vllm-version", default=config.SIM_VLLM_VERSION,
                    choices=[config.SIM_VLLM_VERSION, config.LEGACY_SIM_VLLM_VERSION],
                    help="the vLLM release vllm-sim plays (default %(default)s)")
    up.add_argument("--backend", default="ray", choices=["ray", "native"],
                    help="spark-vllm's backend in the stack file (default %(default)s)")
    up.add_argument("--model-size", type=model.parse_size, default=config.LAB_MODEL_BYTES,
                    help="the generated model's size on node-1 (default 3G; e.g. 512M)")
    up.add_argument("-q", "--quiet", action="store_true", help="no progress lines")

    down = sub.add_parser("down", help="remove every lab container, network and volume")
    down.add_argument("--keep-volumes", action="store_true",
                      help="keep the nodes' /var/lib/docker volumes (next up skips the image load)")
    down.add_argument("-q", "--quiet", action="store_true")

    img = sub.add_parser("images", help="build the lab's images (node, and vllm-sim for every vLLM "
                         "release it plays) unless current; `up` builds what it needs itself")
    img.add_argument("-q", "--quiet", action="store_true")

    sub.add_parser("status", help="one line per node: state, addresses, ssh, simulator image")

    ssh = sub.add_parser("ssh", help="ssh to a node with the lab key and pinned host key")
    ssh.add_argument("node", help="node-<i>, <i>, or one of its addresses")
    ssh.add_argument("command", nargs=argparse.REMAINDER, help="remote command (default: login shell)")

    rb = sub.add_parser("reboot", help="reboot nodes (dockerd and every container on them stop)")
    rb.add_argument("nodes", nargs="+", help="node-<i>, <i>, or one of its addresses")
    rb.add_argument("--hard", action="store_true", help="a power cut: no graceful shutdown")
    rb.add_argument("-q", "--quiet", action="store_true")

    off = sub.add_parser("power-off", help="shut nodes down and leave them off")
    off.add_argument("nodes", nargs="+")
    off.add_argument("--hard", action="store_true", help="pull the plug: no graceful shutdown")
    on = sub.add_parser("power-on", help="boot nodes that are off; waits for ssh + dockerd")
    on.add_argument("nodes", nargs="+")

    for name, verb in (("block-fabric", "drop"), ("unblock-fabric", "restore")):
        b = sub.add_parser(name, help=f"{verb} all traffic between two nodes' fabric addresses")
        b.add_argument("node_a")
        b.add_argument("node_b")

    wd = sub.add_parser("wedge", help="freeze (SIGSTOP) the vLLM rank process(es) in a node's "
                        "Ray container: /health stays 200, no token comes; --thaw: SIGCONT")
    wd.add_argument("node", help="node-<i>, <i>, or one of its addresses")
    wd.add_argument("--thaw", action="store_true", help="SIGCONT instead: the ranks run again")
    wd.add_argument("--stack", default=config.DEFAULT_STACK,
                    help="the stack whose spark-vllm-<stack>-ray-head/-worker container holds "
                         "the ranks (default %(default)s)")

    gm = sub.add_parser("gpu-memory", help="install (or --clear) a fake nvidia-smi on a node that "
                        "reports this GPU memory (the lab has no GPU)")
    gm.add_argument("node", help="node-<i>, <i>, or one of its addresses")
    gm.add_argument("--total-gib", type=float, default=None, help="memory.total, GiB")
    gm.add_argument("--free-gib", type=float, default=None, help="memory.free, GiB")
    gm.add_argument("--clear", action="store_true",
                    help=f"remove the fake {faults.NVIDIA_SMI} and its values file")

    mdl = sub.add_parser("model", help="generate a fake model (not real weights) in a node's HF cache")
    mdl.add_argument("--node", default=config.node_name(1), help="default %(default)s")
    mdl.add_argument("--repo", default=config.LAB_MODEL, help="default %(default)s")
    mdl.add_argument("--size", type=model.parse_size, default=config.LAB_MODEL_BYTES,
                     help="tensor bytes, e.g. 3G or 512M (default 3G)")
    mdl.add_argument("--shards", type=int, default=config.LAB_MODEL_SHARDS, help="default %(default)s")
    mdl.add_argument("--hf-home", default=model.DEFAULT_HF_HOME, help="default %(default)s")
    mdl.add_argument("--owner", default=None, help="chown the model to this user (non-root SSH user)")

    inf = sub.add_parser("info", help="describe the running lab")
    inf.add_argument("--json", action="store_true", help="machine-readable")
    inf.add_argument("--stack", default=config.DEFAULT_STACK)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.cmd == "gpu-memory":
        problem = faults.check_gpu_memory_args(args.total_gib, args.free_gib, args.clear)
        if problem:
            ap.error(f"gpu-memory: {problem}")
    try:
        return _dispatch(args)
    except LabError as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.cmd == "up":
        cluster.up(cluster.UpOptions(
            nodes=args.nodes, mgmt_subnet=args.mgmt_subnet, fabric_subnet=args.fabric_subnet,
            stack=args.stack, tp=args.tp, pp=args.pp, quiet=args.quiet,
            sim_vllm_version=args.sim_vllm_version, backend=args.backend,
            model_bytes=args.model_size,
        ))
        for line in cluster.status():
            print(line)
    elif args.cmd == "down":
        cluster.down(keep_volumes=args.keep_volumes, quiet=args.quiet)
    elif args.cmd == "images":
        for tag, image_id in cluster.build_images(quiet=args.quiet).items():
            print(f"{tag} {image_id}")
    elif args.cmd == "status":
        lines = cluster.status()
        print("\n".join(lines) if lines else "lab is down (no nodes)")
    elif args.cmd == "ssh":
        remote = " ".join(args.command)  # like ssh itself: words joined for the remote shell
        tty = None if not remote else False
        argv = cluster.ssh_argv(args.node, remote, tty=tty)
        sys.stdout.flush()
        os.execvp(argv[0], argv)
    elif args.cmd == "reboot":
        took = cluster.reboot(args.nodes, hard=args.hard, quiet=args.quiet)
        print(f"{', '.join(args.nodes)}: up again after {took:.1f} s")
    elif args.cmd == "power-off":
        cluster.power_off(args.nodes, hard=args.hard)
        print(f"{', '.join(args.nodes)}: off")
    elif args.cmd == "power-on":
        cluster.power_on(args.nodes)
        print(f"{', '.join(args.nodes)}: up")
    elif args.cmd == "block-fabric":
        cluster.block_fabric(args.node_a, args.node_b)
        print(f"fabric blocked between {args.node_a} and {args.node_b}")
    elif args.cmd == "unblock-fabric":
        cluster.unblock_fabric(args.node_a, args.node_b)
        print(f"fabric restored between {args.node_a} and {args.node_b}")
    elif args.cmd == "wedge":
        node = cluster.find_node(args.node)
        ranks = faults.wedge(node, args.stack, thaw=args.thaw)
        for r in ranks:
            print(f"{node.name} {r.container}: {r.signal} pid {r.pid}: {r.cmdline}")
        if args.thaw:
            print(f"{node.name}: {len(ranks)} rank process(es) running again")
        else:
            print(f"{node.name}: {len(ranks)} rank process(es) frozen; thaw with "
                  f"`python -m lab wedge {node.name} --thaw"
                  f"{'' if args.stack == config.DEFAULT_STACK else ' --stack ' + args.stack}`")
    elif args.cmd == "gpu-memory":
        node = cluster.find_node(args.node)
        if args.clear:
            report = faults.clear_gpu_memory(node)
            print(f"{node.name}: fake {faults.NVIDIA_SMI} removed ({report})")
        else:
            total, free = faults.to_mib(args.total_gib), faults.to_mib(args.free_gib)
            report = faults.set_gpu_memory(node, total, free)
            print(f"{node.name}: fake {faults.NVIDIA_SMI} reports {total} MiB total, {free} MiB "
                  f"free (values in {faults.GPU_MEMORY_FILE}); {'; '.join(report.splitlines())}")
    elif args.cmd == "model":
        summary = model.ensure(cluster.find_node(args.node), repo=args.repo, size=args.size,
                               shards=args.shards, hf_home=args.hf_home, owner=args.owner)
        print(json.dumps(summary, indent=2))
    elif args.cmd == "info":
        lab = cluster.info(args.stack)
        if args.json:
            print(json.dumps(lab.to_json(), indent=2))
        else:
            d = lab.to_json()
            print(f"mgmt {d['mgmtSubnet']}  fabric {d['fabricSubnet']}  ssh key {d['sshKey']}")
            print(f"stack file {d['stackFile']}  ssh config: ssh -F {keys.ssh_config()} node-1")
            for n in d["nodes"]:
                print(f"{n['name']:8} {n['container']:24} mgmt {n['mgmtIp']:15} "
                      f"fabric {n['fabricIp']} spare {n['spareFabricIp']}")
    return 0
