"""The request batcher: every trajectory of a rollout awaits `generate(request)`; one engine serves them all.

A trajectory (single-turn sample, environment or tool loop, agent episode) is a coroutine with a
`Client` of the batcher: it awaits `client.generate(request)` for each model turn and calls
`client.done()` when it is over. `RequestBatcher.serve()` runs the engine in ticks on the same event
loop: admit the requests waiting (they join the running decode batch, `continuous.ContinuousSampler`),
run one decode step, hand back the requests that finished. No request waits for an unrelated long one.

Determinism (`deterministic=True`, the default). Which requests share a decode batch changes a row's
logits in the last bits, so a schedule that followed the clock (tool and environment replies take
varying wall time) would make runs differ. Here a tick admits requests only once every live
trajectory is either waiting for the engine or done: admission happens at points defined by token
counts, in the fixed order of the clients, never by the clock. The cost: while a trajectory runs its
environment or tools between two turns, decoding pauses (the other trajectories' replies still run
concurrently). `deterministic=False` admits whatever has arrived at each tick and never pauses.

Pausing (rollout.partial). `pause()` asks the batcher to stop: at the next point where it would tick (in
deterministic mode: once every live trajectory waits for the engine or is done, a point set by token
counts), every request running or waiting is handed back with what it sampled so far and finish "paused",
and so is every request made after that. The engine must declare `abilities.pausing` (the HF engine's continuous
sampler, vLLM's per-request engine); a trajectory keeps the paused tokens and continues them in a later rollout.

The engines, as `whole_batch.stepper` makes them step: the HF engine's `continuous.ContinuousSampler` (slots of a
KV cache); vLLM's per-request `LLMEngine` (`vllm_steps.VLLMSteps`: each tick adds the admitted requests and runs one
engine step, so requests join and leave vLLM's running batch). SGLang, whose engine offers no step of its own (its
scheduler runs in subprocesses on its own clock, its per-request `async_generate` on the event loop the engine was
built on), declares no stepping and is served by `whole_batch.BatchCalls`: the requests admitted at a tick form one
whole-batch `generate` call, so a call never waits for a trajectory that is still in its environment, but each call
waits for its own longest sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Callable

from grpoflow.engines.protocol import Completion, Request, RolloutEngine
from grpoflow.engines.whole_batch import stepper


class EngineFailure(RuntimeError):
    """The rollout engine raised while serving requests (raised to every trajectory waiting on it)."""


@dataclass
class _Waiting:
    order: int
    seq: int
    request: Request
    future: asyncio.Future


class RequestBatcher:
    """Serves the `Client`s of one rollout from one engine, stepped as its declaration says (module docstring)."""

    def __init__(self, engine: RolloutEngine, *, version: Callable[[], int], deterministic: bool = True,
                 max_wait_s: float | None = None) -> None:
        """`max_wait_s` (deterministic mode): the longest a tick with work waits for trajectories still between turns
        (None: as long as they take; agent programs, whose time between calls is their own, get a short one)."""
        self.engine, self.abilities, self.engine_name = stepper(engine), engine.abilities, type(engine).__name__
        self.version, self.deterministic, self.max_wait_s = version, deterministic, max_wait_s
        self.thinking: set[int] = set()          # open clients with no request waiting or running
        self.open: set[int] = set()
        self.waiting: list[_Waiting] = []
        self.running: dict[int, tuple[int, asyncio.Future]] = {}  # request id -> (client, future)
        self._seq = 0
        self._closed = False
        self._event = asyncio.Event()
        self.busy_s = 0.0                        # seconds in the engine's admit and tick
        self.ticks = 0
        self.failure: EngineFailure | None = None
        self.pausing = False                     # pause() was called: requests are handed back unfinished

    def client(self, order: int) -> "Client":
        """A client for the trajectory with position `order` (its requests are admitted in this order)."""
        if order in self.open:
            raise ValueError(f"client {order} is already open")
        self.open.add(order)
        self.thinking.add(order)
        return Client(self, order)

    def close(self) -> None:
        """No more clients: `serve` returns once the requests still running have finished."""
        self._closed = True
        self._event.set()

    def pause(self) -> None:
        """Hand back every request, running or still to come, unfinished (see the module docstring)."""
        self.pausing = True
        self._event.set()

    def _submit(self, order: int, request: Request) -> asyncio.Future:
        if self.failure is not None:
            raise self.failure
        if order not in self.open:
            raise RuntimeError(f"client {order} called generate after done()")
        future = asyncio.get_running_loop().create_future()
        self._seq += 1
        self.waiting.append(_Waiting(order, self._seq, request, future))
        self.thinking.discard(order)
        self._event.set()
        return future

    def _done(self, order: int) -> None:
        self.open.discard(order)
        self.thinking.discard(order)
        self._event.set()

    def _work(self) -> bool:
        return bool(self.waiting) or self.engine.busy

    async def serve(self) -> None:
        """Run ticks until closed with nothing left; an engine error fails every request waiting or running."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                deadline = None
                while not self._work() or (self.deterministic and self.thinking):
                    if self._closed and not self.open and not self._work():
                        return
                    if self._work() and self.max_wait_s is not None:
                        deadline = deadline or loop.time() + self.max_wait_s
                        if loop.time() >= deadline:
                            break  # the trajectories still between turns join a later tick
                    self._event.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._event.wait(), None if deadline is None else
                                               max(deadline - loop.time(), 0.0))
                if self.pausing:
                    self._pause()
                else:
                    self._tick()
                await asyncio.sleep(0)  # let the trajectories whose requests finished take their next step
        except Exception as e:
            failure = self.failure = EngineFailure(f"the rollout engine failed: {type(e).__name__}: {e}")
            failure.__cause__ = e
            for w in self.waiting:
                if not w.future.done():
                    w.future.set_exception(failure)
            for _, future in self.running.values():
                if not future.done():
                    future.set_exception(failure)
            self.waiting.clear()
            self.running.clear()
            raise failure from e

    def _tick(self) -> None:
        started = time.perf_counter()
        admitted, self.waiting = sorted(self.waiting, key=lambda w: (w.order, w.seq)), []
        for w in admitted:
            self.running[w.seq] = (w.order, w.future)
        self.engine.admit([(w.seq, w.request) for w in admitted])
        finished = self.engine.tick(self.version())
        self.busy_s += time.perf_counter() - started
        self.ticks += 1
        self._hand_back(finished)

    def _pause(self) -> None:
        """Every request waiting (nothing sampled) or running (what it sampled so far) back, finish "paused"."""
        waiting, self.waiting = sorted(self.waiting, key=lambda w: (w.order, w.seq)), []
        stopped = [(w.seq, Completion([], [], [], "paused")) for w in waiting]
        for w in waiting:
            self.running[w.seq] = (w.order, w.future)
        if self.engine.busy:
            if not self.abilities.pausing:
                raise RuntimeError(f"{self.engine_name} cannot stop its requests at a token boundary (it declares no "
                                   "pausing); rollout.partial needs rollout.engine=hf or vllm.")
            stopped += self.engine.pause()
        self._hand_back(stopped)

    def _hand_back(self, finished: list[tuple[int, Completion]]) -> None:
        for rid, completion in finished:
            order, future = self.running.pop(rid)
            if order in self.open:
                self.thinking.add(order)
            if not future.done():
                future.set_result(completion)


class Client:
    """One trajectory's handle on the batcher."""

    def __init__(self, batcher: RequestBatcher, order: int) -> None:
        self.batcher, self.order = batcher, order

    async def generate(self, request: Request) -> Completion:
        return await self.batcher._submit(self.order, request)

    def done(self) -> None:
        """The trajectory is over (no more requests): call it always, also when the trajectory failed."""
        self.batcher._done(self.order)
