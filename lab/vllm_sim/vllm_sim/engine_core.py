"""The simulated engine core: vLLM V1's scheduler loop in miniature, paced like real vLLM
0.26.0 on an H200, with the gauges and counters /metrics publishes (the ServerState's)."""

from __future__ import annotations

import asyncio
import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_sim.api_server import ServerState


# The engine loop: one step generates this many tokens for every running request and takes
# at least STEP_S: at most 400 tokens/s a request, real vLLM 0.26.0's pace with the tiny
# model on an H200 (tests/fixtures/real-vllm: 380-510 tokens/s a request, 16 or 64 running;
# 16 requests of 1500 tokens still in flight 3 s after they were sent, and a long queue
# holding a canary for more than 10 s behind 4 batches of them, seen by the liveness read as
# busy). Was 800 tokens/s: those requests were done before the rank was frozen, and the
# canary came in 7 s (serving).
TOKENS_PER_STEP = 8
STEP_S = 0.02


def step_s() -> float:
    """A step's least duration: STEP_S, or VLLM_SIM_STEP_S (simulator-only): a slower build to
    play, e.g. an image whose serving regressed, for the serving benchmark to name."""
    try:
        return max(0.0, float(os.environ.get("VLLM_SIM_STEP_S") or STEP_S))
    except ValueError:
        return STEP_S


@dataclass(eq=False)
class EngineRequest:
    tokens_left: int
    done: asyncio.Future[None]
    # set when a step produced the request's first token (or the engine failed it)
    first: asyncio.Event = field(default_factory=asyncio.Event)
    # how many tokens each step gave it, in order (a stream sends one chunk per step)
    produced: asyncio.Queue[int] = field(default_factory=asyncio.Queue)


class EngineCore:
    """The simulated engine core, vLLM V1's loop in miniature: new requests reach the
    scheduler between steps (the engine core's input queue), which runs at most max_num_seqs
    of them per step and keeps the rest waiting, first come first served (vllm/v1/core/sched/
    scheduler.py: `running`, `waiting`). A step runs on every rank, so one frozen rank stops
    it. The gauges are published when a step ends (SchedulerStats, made after the step's
    outputs), so a step that never ends leaves them at their last value."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.incoming: list[EngineRequest] = []  # arrived since the scheduler last looked
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.task: asyncio.Task[None] | None = None
        self.step_s = step_s()

    def submit(self, tokens: int) -> EngineRequest:
        loop = asyncio.get_running_loop()
        req = EngineRequest(max(tokens, 1), loop.create_future())
        self.incoming.append(req)
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._loop())
        return req

    def abort(self, req: EngineRequest) -> None:
        """The client went away: the request leaves the engine (vLLM aborts it too)."""
        for queue in (self.incoming, self.waiting, self.running):
            if req in queue:
                queue.remove(req)
        if not req.done.done():
            req.done.cancel()
        req.first.set()

    async def first_token(self, req: EngineRequest) -> None:
        """Returns once a step produced the request's first token; raises if the engine
        failed it first."""
        await req.first.wait()
        if req.done.done() and not req.done.cancelled() and req.done.exception() is not None:
            await req.done  # raises the engine's error

    async def finished(self, req: EngineRequest) -> None:
        await req.done

    async def next_tokens(self, req: EngineRequest) -> int | None:
        """The tokens the request's next step gave it; None once it is done. Raises the
        engine's error when the engine failed it."""
        while True:
            if not req.produced.empty():
                return req.produced.get_nowait()
            if req.done.done():
                await req.done
                return None
            got = asyncio.ensure_future(req.produced.get())
            await asyncio.wait({got, req.done}, return_when=asyncio.FIRST_COMPLETED)
            if got.done():
                return got.result()
            got.cancel()

    def _fail_all(self, err: Exception) -> None:
        for req in [*self.running, *self.waiting, *self.incoming]:
            if not req.done.done():
                req.done.set_exception(RuntimeError(f"engine step failed: {err}"))
            req.first.set()
        self.running.clear()
        self.waiting.clear()
        self.incoming.clear()

    async def _loop(self) -> None:
        clock = asyncio.get_running_loop()
        while self.incoming or self.waiting or self.running:
            started = clock.time()
            self.waiting.extend(self.incoming)
            self.incoming.clear()
            while self.waiting and len(self.running) < self.state.max_num_seqs:
                self.running.append(self.waiting.popleft())
            try:
                await asyncio.to_thread(self.state.step)
            except Exception as err:  # noqa: BLE001 - a dead rank: every request fails
                self._fail_all(err)
                break
            for req in list(self.running):
                n = min(req.tokens_left, TOKENS_PER_STEP)
                req.tokens_left -= n
                self.state.generation_tokens_total += n
                req.produced.put_nowait(n)
                req.first.set()
                if req.tokens_left <= 0:
                    self.running.remove(req)
                    if not req.done.done():
                        req.done.set_result(None)
            self.state.published_running = len(self.running)
            self.state.published_waiting = len(self.waiting)
            # The pace (a step takes at least STEP_S) is kept after the step's outputs are
            # out, not before: what every rank answered is published at once, so a rank
            # stopped (SIGSTOP) after its step stops the counters at once, as on vLLM 0.26.0
            # (tests/fixtures/real-vllm: no token after the stop). Was: the step and STEP_S's
            # sleep together, so a step answered just before the stop came out after it.
            await asyncio.sleep(max(0.0, self.step_s - (clock.time() - started)))
