"""spark-vllm: one vLLM server across several GPU hosts on a Ray cluster, as Pulumi components."""
