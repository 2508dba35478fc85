"""spark-vllm: read the stack config, build the components, export the outputs."""

import pulumi

from components.program import deploy, exit_quietly_when_interrupted, read_config_or_exit

exit_quietly_when_interrupted()
spec, secrets = read_config_or_exit()
for key, value in deploy(spec, secrets).items():
    pulumi.export(key, value)
