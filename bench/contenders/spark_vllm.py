"""(a) spark-vllm through the `pulumi` CLI, as an operator runs it:
`pulumi up --yes --skip-preview` and `pulumi destroy --yes --skip-preview` on its own stack.

Changes are edits of the stack file (stacks/Pulumi.bench.yaml, written by `python -m lab up`),
as an operator edits stacks/Pulumi.<stack>.yaml: the lab's stack as `make demo` deploys it
(smoke test on, no API key, `rayTimeout` at its default), with `vllmTimeout` bounded at 300 s.

Commands run with `--json` (engine events, one per line, as they happen) so `profile.py` can
say where the time went; the work the engine does is the same as with the text display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from bench import incident, profile
from bench.common import LOG_DIR, STACK, Lab, Result, run, ssh
from bench.contenders import Contender, Outcome
from lab import envsh, keys
from spark_vllm.components.spec import NAMESPACE

VLLM_TIMEOUT_S = 300  # vllm-sim loads in ~3 s; a bound, not a wait
PULUMI_TIMEOUT_S = 600


def _reason(out: str) -> str:
    """The program's own failure message (the gate's expected-vs-seen table), not the script
    text the command provider repeats in its error."""
    lines = out.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith("[spark-vllm]") and "FAILED" in ln]
    if not at:
        return "\n".join(lines[-3:])
    picked = [lines[at[-1]]]
    for ln in lines[at[-1] + 1:at[-1] + 40]:  # the expected-vs-seen table that follows
        if not ln.strip() or ln.startswith(("error:", "[spark-vllm]", "summary:")):
            break
        picked.append(ln)
    return "\n".join(picked)


class SparkVllm(Contender):
    name = "spark-vllm"
    label = "pulumi up"
    backend = "ray"

    def __init__(self, lab: Lab, stack_file: Path) -> None:
        super().__init__(lab)
        self.stack_file = stack_file
        self.log = LOG_DIR / "spark-vllm.log"
        self.env = envsh.sourced()

    def _pulumi(self, *args: str, stdin: str | None = None,
                timeout: float = PULUMI_TIMEOUT_S) -> Result:
        return run(["pulumi", *args], env=self.env, stdin=stdin, timeout=timeout, log=self.log)

    def set_config(self, key: str, value: str, path: bool = False) -> None:
        """`pulumi config set spark-vllm:KEY VALUE` (`path`: KEY is a path, e.g.
        fabricCheck.timeout) on the bench stack; a failure raises, naming the key."""
        res = self._pulumi("config", "set", *(["--path"] if path else []), "--stack", STACK,
                           f"{NAMESPACE}:{key}", value)
        if not res.ok:
            raise RuntimeError(f"pulumi config set {key}: {res.tail()}")

    def prepare(self) -> None:
        sel = self._pulumi("stack", "select", "--create", STACK)
        if not sel.ok:
            raise RuntimeError(f"pulumi stack select: {sel.tail()}")
        key = keys.client_key().read_text()
        res = self._pulumi("config", "set", "--secret", "--stack", STACK,
                           f"{NAMESPACE}:sshPrivateKey", stdin=key)
        if not res.ok:
            raise RuntimeError(f"pulumi config set: {res.tail()}")
        self._write_config()

    def _write_config(self) -> None:
        """The desired state into the stack file (secrets and salt untouched)."""
        doc = yaml.safe_load(self.stack_file.read_text()) or {}
        cfg: dict[str, Any] = doc.setdefault("config", {})
        ns = NAMESPACE + ":"
        env = dict(cfg.get(ns + "env") or {})
        env["NCCL_DEBUG"] = self.state.nccl_debug
        cfg[ns + "env"] = env
        if self.state.max_model_len is None:
            cfg.pop(ns + "vllmArgs", None)
        else:
            cfg[ns + "vllmArgs"] = ["--max-model-len", str(self.state.max_model_len)]
        cfg.pop(ns + "rayTimeout", None)  # the default, as a user runs it
        if self.backend == "ray":
            cfg.pop(ns + "backend", None)
        else:
            cfg[ns + "backend"] = self.backend
        cfg[ns + "vllmTimeout"] = VLLM_TIMEOUT_S
        self.stack_file.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))

    def _up(self, timeout: float = PULUMI_TIMEOUT_S) -> tuple[Result, dict[str, Any]]:
        self._write_config()
        return self._engine("up", timeout)

    def _engine_with(self, change: Any, timeout: float) -> tuple[Result, dict[str, Any]]:
        """`pulumi up` of the desired state with `change(config)` applied to the stack file's
        config on top, the file put back after."""
        self._write_config()
        kept = self.stack_file.read_text()
        doc = yaml.safe_load(kept) or {}
        change(doc.setdefault("config", {}))
        self.stack_file.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
        try:
            return self._engine("up", timeout)
        finally:
            self.stack_file.write_text(kept)

    def incident(self, cap_s: float) -> tuple[float | None, Outcome] | None:
        """As near as the program lets a user get: VLLM_HOST_IP pinned in `env` to the head's
        management address, on the V1-executor image."""
        ns = NAMESPACE + ":"

        def pin(cfg: dict[str, Any]) -> None:
            cfg[ns + "env"] = {**(cfg.get(ns + "env") or {}),
                               "VLLM_HOST_IP": self.lab.head.mgmt_ip}
            cfg[ns + "image"] = incident.V1_IMAGE

        res, prof = self._engine_with(pin, cap_s)
        return incident.refusal(self.lab, res, prof)

    def _engine(self, verb: str, timeout: float = PULUMI_TIMEOUT_S,
                *extra: str) -> tuple[Result, dict[str, Any]]:
        res, lines = profile.run_stamped(
            ["pulumi", verb, "--yes", "--skip-preview", "--json", "--stack", STACK, *extra],
            timeout=timeout, env=self.env, log=self.log)
        return res, profile.summarize(lines, res.seconds)

    def _outcome(self, verb: str) -> Outcome:
        res, prof = self._up() if verb == "up" else self._engine(verb)
        return Outcome(res.ok, "" if res.ok else res.tail(), prof)

    def up(self) -> Outcome:
        return self._outcome("up")

    def reapply(self) -> Outcome:
        return self._outcome("up")

    def set_env(self, value: str) -> Outcome:
        self.state.nccl_debug = value
        return self._outcome("up")

    def set_vllm_len(self, value: int) -> Outcome:
        self.state.max_model_len = value
        return self._outcome("up")

    def down(self) -> Outcome:
        return self._outcome("destroy")

    def repair(self) -> Outcome:
        # README "Day 2": the refresh sees the stopped containers, the update replaces them
        res, prof = self._engine("up", PULUMI_TIMEOUT_S, "--refresh")
        return Outcome(res.ok, "" if res.ok else res.tail(), prof)

    def join_failure(self, cap_s: float) -> tuple[float | None, Outcome]:
        res, prof = self._up(timeout=cap_s)
        if res.rc == 124:
            return None, Outcome(True, f"nothing reported within {cap_s:.0f} s", prof)
        if res.ok:
            return None, Outcome(False, "pulumi up succeeded despite the blocked fabric?", prof)
        return res.seconds, Outcome(True, _reason(res.out), prof)

    def forget(self) -> None:
        """Remove the (empty) stack and its config file: nothing of the bench stays in stacks/."""
        self._pulumi("stack", "rm", "--yes", STACK)
        self.stack_file.unlink(missing_ok=True)

    def clean(self) -> None:
        res, _ = self._engine("destroy", timeout=300)
        if res.ok:
            return
        # A node the engine cannot reach or a broken state: remove what runs, forget the state.
        for node in self.lab.nodes:
            ssh(node, f"ids=$(docker ps -aq --filter label=spark-vllm.stack={STACK}); "
                '[ -z "$ids" ] || docker rm -f -v $ids >/dev/null', log=self.log)
        self._pulumi("stack", "rm", "--yes", "--force", "--preserve-config", STACK)
        self.prepare()


class SparkVllmNative(SparkVllm):
    """The same program and stack with `backend: native` (vLLM's own multi-node, no Ray)."""

    name = "spark-vllm-native"
    label = "pulumi up (backend native)"
    backend = "native"

    def incident(self, cap_s: float) -> None:
        """Not run: the refusal is the program's, whichever backend (spark-vllm's, measured)."""
        return None
