"""spark-vllm: read the stack config, build the components, export the outputs."""

from spark_vllm.components.program import run

run()
