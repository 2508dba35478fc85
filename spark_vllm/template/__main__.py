"""This project's program: spark-vllm, the package requirements.txt installs."""

from spark_vllm.program import run

run()
