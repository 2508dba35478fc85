"""STAND-IN for Pulumi's Python language host, `pulumi-language-python` — NOT the real one.

The real host (Go module github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3)
cannot be fetched here: the Go module proxy refuses every version of it. Without a language
host the Pulumi CLI cannot run a `runtime: python` project ("no language plugin
'pulumi-language-python' found"). This package is a faithful stand-in, written in Python
against the same gRPC contract (pulumirpc.LanguageRuntime) and mirroring what the real host of
CLI v3.274.1 does for running a program:

* launched by the CLI as `pulumi-language-python [--logtostderr] [-v=N] [--tracing X]
  ENGINE_ADDRESS`; listens on 127.0.0.1 and prints ONLY the port and a newline on stdout;
* Run starts `<venv>/bin/python <dir>/pulumi-language-python-exec --monitor .. --engine ..
  --project .. --root_directory .. --stack .. --pwd .. --dry_run .. --parallel ..
  [--tracing ..] [--organization ..] ENTRY_POINT ARGS...` — the exec script from the pulumi
  sdk/v3 module, the same one the real host runs — with the virtualenv activated (PATH,
  VIRTUAL_ENV, no PYTHONHOME), config in PULUMI_CONFIG / PULUMI_CONFIG_SECRET_KEYS, stdout and
  stderr inherited; exit code 32 = `bail` (the program already showed its error), any other
  non-zero exit = "program exited with non-zero exit code: N";
* GetRequiredPackages finds `pulumi-plugin.json` in the venv's installed packages (so the
  engine learns it needs e.g. the `command` plugin v1.2.1), creating the venv first if it is
  missing; InstallDependencies, About, GetProgramDependencies, RuntimeOptionsPrompts,
  Handshake, RunPlugin as the real host.

Differences from the real host are listed in README.md next to this file. GetPluginInfo
reports STAND_IN_VERSION: the CLI version whose host this mirrors, with semver build metadata
naming the stand-in (ignored in version comparisons, visible in `pulumi about` / logs).

Run it through lab/engine/bin/pulumi-language-python (put that directory on PATH).
"""

MIRRORS_VERSION = "3.274.1"
STAND_IN_VERSION = f"{MIRRORS_VERSION}+spark-vllm.stand-in"
