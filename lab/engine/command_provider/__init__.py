"""STAND-IN for pulumi-command 1.2.1's provider plugin (``pulumi-resource-command``).

The real provider (github.com/pulumi/pulumi-command/provider, a Go binary) cannot be built here:
the Go module proxy refuses that module at every version. This package is a faithful stand-in
that the real Pulumi engine launches exactly like the real one (``lab/engine/bin/
pulumi-resource-command`` on PATH), so that the program, written against the real
``pulumi_command`` Python SDK, runs unchanged and behaves as it will with the real provider.

It implements ``command:remote:Command`` completely (over the OpenSSH client) and
``command:local:Command`` without ``assetPaths``/``archivePaths``; see README.md for the protocol,
the secret flow and every known difference. GetPluginInfo reports version 1.2.1 and the command line
is the real one's (no ``--version``: the usage, exit 2), so nothing can tell the two apart by
asking; the plugin cache's link says which runs (docs/development.md, "The Pulumi engine").
"""

VERSION = "1.2.1"
STAND_IN = True
