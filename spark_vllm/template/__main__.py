"""This project's program: spark-vllm, the package requirements.txt installs."""

from spark_vllm.components.program import run

run()
