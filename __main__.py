"""spark-vllm: read the stack config, build the components, export the outputs."""

import pulumi

from components.program import deploy, read_config

spec, secrets = read_config()
for key, value in deploy(spec, secrets).items():
    pulumi.export(key, value)
