"""The ways to get one vLLM server on the lab: spark-vllm (Ray or native), Ray's cluster launcher,
the bare critical path, sparkrun.

Each contender turns the same operator intents into its own commands; the scenarios time them
and wait for /health themselves, so a method returns as soon as its tool returns:

  up()             cold, from nothing (the harness made sure nothing runs)
  reapply()        the same desired state again (the "no-op")
  set_env(v)       NCCL_DEBUG=v for every container, applied
  set_vllm_len(n)  `vllm serve --max-model-len n`, applied
  down()           everything removed
  join_failure(cap)  up while node-1 and node-2 cannot reach each other over the fabric:
                   seconds until the tool *reports* a failure, None if it did not within cap
  clean()          best-effort removal of anything left, untimed
  repair()         after a node rebooted, a rank killed or frozen: what its user runs
  enter(), leave() around each of its lifecycles, untimed: what the lab needs for this
                   contender only (sparkrun's nvidia-smi shim), put in place and taken away
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from bench.common import Lab


@dataclass
class Baseline:
    """The desired state every lifecycle starts from."""

    nccl_debug: str = "WARN"
    max_model_len: int | None = None


@dataclass
class Outcome:
    """What a contender step reports besides wall time (kept raw in the JSON)."""

    ok: bool = True
    note: str = ""
    profile: dict[str, Any] = field(default_factory=dict)


class Contender(ABC):
    name: str = "?"
    label: str = "?"

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.state = Baseline()

    @abstractmethod
    def prepare(self) -> None:
        """Once per lab size: config files, stacks."""

    @abstractmethod
    def up(self) -> Outcome: ...

    @abstractmethod
    def reapply(self) -> Outcome: ...

    @abstractmethod
    def set_env(self, value: str) -> Outcome: ...

    @abstractmethod
    def set_vllm_len(self, value: int) -> Outcome: ...

    @abstractmethod
    def down(self) -> Outcome: ...

    @abstractmethod
    def join_failure(self, cap_s: float) -> tuple[float | None, Outcome]: ...

    @abstractmethod
    def clean(self) -> None: ...

    def repair(self) -> Outcome:
        """After a node rebooted: what this contender's user runs to serve again (by default
        the contender's re-apply)."""
        return self.reapply()

    def incident(self, cap_s: float) -> tuple[float | None, Outcome] | None:
        """The contender configured into the seeds' incident (bench/incident.py): seconds until
        it served, reported or refused (None: not within cap_s) and what happened; None for a
        contender that is not configured into it there."""
        return None

    def enter(self) -> None:  # noqa: B027 (a hook: most contenders need nothing)
        """Before each of its lifecycles (untimed)."""

    def leave(self) -> None:  # noqa: B027
        """After each of its lifecycles (untimed), whatever happened."""

    def reset(self) -> None:
        """Back to the baseline desired state (config only; nothing runs)."""
        self.state = Baseline()
