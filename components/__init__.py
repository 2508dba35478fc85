"""The Pulumi component resources of spark-vllm: what `pulumi up` builds.

In a clone they live at the top level (components/); the package imports them as
spark_vllm.components (spark_vllm/components links here), and the wheel installs them there.
"""
