"""The spark-vllm lab: simulated DGX Spark nodes on one machine (Docker-in-Docker).

Each node is a container running sshd and its own dockerd, on two networks: `mgmt` (default
route, like a Spark's external NIC) and `fabric` (internal, like the RoCE link, renamed to
`enp1s0f1np1` inside the node, with a spare secondary address). The nodes run the simulator
image `spark-vllm-sim:lab` (Ray + vllm-sim), loaded with `docker save | ssh NODE docker load`.

CLI: ``python -m lab up|down|status|ssh|block-fabric|unblock-fabric|info`` (``--help``).

Library (integration tests, benchmarks)::

    from lab import cluster
    lab = cluster.up(cluster.UpOptions(nodes=2, quiet=True))   # idempotent; ≈1 s when up
    cluster.block_fabric("node-1", "node-2")                   # and unblock_fabric
    argv = cluster.ssh_argv("node-1", ["docker", "ps"])
    cluster.info().to_json(); cluster.down()

Modules: config (names, addresses, defaults), images (debootstrap base, node and inner
images), nodes (node containers), cluster (up/down/info/status), keys (SSH material in
.lab/ssh), stackfile (stacks/Pulumi.<stack>.yaml), fabric (block/unblock), egress (keeps the
nodes' traffic on this machine), run (subprocess + progress), cli.
Host scripts: system-deps.sh (apt packages), dockerd.sh (start dockerd without systemd).
"""
