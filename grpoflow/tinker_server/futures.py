"""Futures and the one thread that runs model work.

The Tinker API is asynchronous: every heavy request (`forward_backward`, `optim_step`, `asample`, saves) answers
at once with a request id, and the client polls `retrieve_future` until the result is there. Here:

- `Futures` holds each request's outcome (pending, a result body, or an error) and lets a poll wait for it
  on the server's event loop (a long poll, so a client makes few requests per result);
- `Runner` is a single worker thread, so torch never runs two jobs at once; queued sampling jobs with the same
  batch key (same weights and sampling parameters) run as one batched `generate`;
- `SeqGate` releases a training model's requests in `seq_id` order: the SDK numbers them and may send the chunks
  of one `forward_backward` concurrently, first chunk last, so arrival order is not execution order.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoflow.errors import UserError

log = logging.getLogger("grpoflow.tinker")


@dataclass
class Outcome:
    """A finished request: a body and its media type, or an error (`category` user or server)."""
    body: bytes = b""
    media_type: str = "application/json"
    error: str | None = None
    category: str = "user"


class Futures:
    """request id -> outcome, awaited on the server's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: dict[str, asyncio.Event] = {}
        self._outcomes: dict[str, Outcome] = {}
        self._lock = threading.Lock()

    def new(self) -> str:
        request_id = uuid.uuid4().hex
        with self._lock:
            self._events[request_id] = asyncio.Event()
        return request_id

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._events

    def resolve(self, request_id: str, outcome: Outcome) -> None:
        """Thread-safe: store the outcome and wake the polls waiting for it."""
        with self._lock:
            self._outcomes[request_id] = outcome
            event = self._events[request_id]
        self._loop.call_soon_threadsafe(event.set)

    async def wait(self, request_id: str, timeout: float) -> Outcome | None:
        """The outcome, waiting up to `timeout` seconds; None if still pending."""
        with self._lock:
            event = self._events[request_id]
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        with self._lock:
            return self._outcomes[request_id]


@dataclass
class Job:
    """Work for the runner. `run(payloads)` gets the payloads of every job batched with this one (same
    `batch_key`; a None key never batches) and returns one Outcome per payload."""
    request_id: str
    run: Callable[[list[Any]], list[Outcome]]
    payload: Any = None
    batch_key: Any = None
    max_batch: int = 1


class Runner:
    """One daemon thread running jobs in submission order (batching same-key neighbours)."""

    def __init__(self, futures: Futures) -> None:
        self._futures = futures
        self._jobs: deque[Job] = deque()
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="tinker-runner", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cv:
            self._jobs.append(job)
            self._cv.notify()

    def _take(self) -> list[Job]:
        with self._cv:
            while not self._jobs:
                self._cv.wait()
            first = self._jobs.popleft()
            batch = [first]
            if first.batch_key is not None:
                for job in list(self._jobs):
                    if len(batch) >= first.max_batch:
                        break
                    if job.batch_key == first.batch_key:
                        self._jobs.remove(job)
                        batch.append(job)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            try:
                outcomes = batch[0].run([job.payload for job in batch])
            except UserError as e:
                outcomes = [Outcome(error=str(e), category="user")] * len(batch)
            except Exception as e:  # a bug or a resource problem: the client gets the cause, the log the traceback
                log.error("request %s failed:\n%s", batch[0].request_id, traceback.format_exc())
                outcomes = [Outcome(error=f"{type(e).__name__}: {e}", category="server")] * len(batch)
            for job, outcome in zip(batch, outcomes):
                self._futures.resolve(job.request_id, outcome)


@dataclass
class SeqGate:
    """Releases a model's jobs in seq_id order (1, 2, 3, ...); a job without a seq_id goes at once."""
    submit: Callable[[Job], None]
    next_seq: int = 1
    waiting: dict[int, Job] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def offer(self, seq_id: int | None, job: Job) -> None:
        with self.lock:
            if seq_id is None:
                self.submit(job)
                return
            if seq_id < self.next_seq or seq_id in self.waiting:
                raise UserError(f"seq_id {seq_id} was already used on this model (next expected: {self.next_seq}); "
                                "each request of a training client needs a new one.")
            self.waiting[seq_id] = job
            while self.next_seq in self.waiting:
                self.submit(self.waiting.pop(self.next_seq))
                self.next_seq += 1
