"""spark-vllm: read the stack config, build the components, export the outputs."""

from spark_vllm.program import exit_quietly_when_interrupted, main

exit_quietly_when_interrupted()
main()
