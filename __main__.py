"""spark-vllm: read the stack config, build the components, export the outputs."""

from spark_vllm.program import run

run()
