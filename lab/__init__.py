"""The spark-vllm lab: simulated DGX Spark nodes on one machine (Docker-in-Docker).

Each node is a container running sshd and its own dockerd, on two networks: `mgmt` (default
route, like a Spark's external NIC) and `fabric` (internal, like the RoCE link, interface
`enp1s0f1np1`). The nodes run the simulator image `spark-vllm-sim:lab` (Ray + vllm-sim).

Library use (integration tests, benchmarks)::

    from lab import cluster
    lab = cluster.up(cluster.UpOptions(nodes=2))
    cluster.block_fabric("node-1", "node-2")
    cluster.down()

CLI: ``python -m lab --help``.
"""
