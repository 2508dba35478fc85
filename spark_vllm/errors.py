"""What the `spark-vllm` commands say when something fails: what went wrong, what to do.

The Pulumi CLI's own stderr is kept (its last lines), and the usual causes are named: the
stack's passphrase (PULUMI_CONFIG_PASSPHRASE / PULUMI_CONFIG_PASSPHRASE_FILE, pulumi
pkg/secrets/passphrase), a stack or backend that is not there.
"""

from __future__ import annotations

from typing import Any

PASSPHRASE_HINT = ("set PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE) to the "
                   "passphrase this stack was created with, then retry")


class CliError(Exception):
    def __init__(self, what: str, todo: str | None = None, detail: str = "") -> None:
        super().__init__(what)
        self.what, self.todo, self.detail = what, todo, detail

    def text(self, prog: str) -> str:
        lines = [f"{prog}: {self.what}"]
        if self.detail:
            lines += [f"  | {line}" for line in self.detail.splitlines()]
        if self.todo:
            lines.append(f"  what to do: {self.todo}")
        return "\n".join(lines)


def _stderr_tail(err: Any, n: int = 6) -> str:
    # a CompletedProcess has .stderr; an automation CommandError's text is
    # "code: N\n stdout: …\n stderr: …" (pulumi automation/_cmd.py CommandResult.__str__)
    text = (getattr(err, "stderr", "") or str(err)).strip()
    if " stderr: " in text:
        text = text.split(" stderr: ", 1)[1].strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def from_pulumi(err: Any, doing: str) -> CliError:
    """A CliError for a failed `pulumi` call (an automation CommandError or a CompletedProcess
    with stderr)."""
    tail = _stderr_tail(err)
    low = tail.lower()
    if "passphrase" in low:
        return CliError(f"{doing}: the stack's secrets cannot be decrypted", PASSPHRASE_HINT,
                        tail)
    if "no stack named" in low or "stack not found" in low:
        return CliError(f"{doing}: no such stack", "`pulumi stack ls` lists the stacks; pass "
                        "--stack NAME or `pulumi stack select NAME`", tail)
    if "login" in low and ("not logged in" in low or "pulumi login" in low):
        return CliError(f"{doing}: not logged in to a Pulumi backend",
                        "`pulumi login` to the backend that holds this stack's state", tail)
    return CliError(f"{doing}: pulumi failed", "read pulumi's message above", tail)
