"""Futures and the one thread that runs model work.

The Tinker API is asynchronous: every heavy request (`forward_backward`, `optim_step`, `asample`, saves) answers
at once with a request id, and the client polls `retrieve_future` until the result is there. Here:

- `Futures` holds each request's outcome (pending, a result body, or an error) and lets a poll wait for it
  on the server's event loop (a long poll, so a client makes few requests per result); an outcome is dropped
  `ttl_s` after it was resolved, and every future of a session when the session ends;
- `Runner` is a single worker thread, so torch never runs two jobs at once. Each client (a session) has its own
  queue and the thread takes one job from each client in turn, so one client's long queue cannot starve the
  others; queued sampling jobs with the same batch key (same weights and sampling parameters) run as one batched
  `generate` of at most `max_batch` requests and `max_batch_tokens` tokens (the rest wait for the next batch); a
  client's queued jobs are dropped when its session ends; a job that has run or was dropped gives back its
  request's share of the shared budget (budget.py);
- `SeqGate` releases a training model's requests in `seq_id` order: the SDK numbers them and may send the chunks
  of one `forward_backward` concurrently, first chunk last, so arrival order is not execution order. A request
  refused before it was queued (an unknown route, a bad body, a bad parameter) still passes its number through
  the gate (`skip`), or every later request of that client would wait for it forever.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoflow.errors import UserError
from grpoflow.tinker_server.budget import Ticket

log = logging.getLogger("grpoflow.tinker")


@dataclass
class Outcome:
    """A finished request: a body and its media type, or an error (`category` user or server)."""
    body: bytes = b""
    media_type: str = "application/json"
    error: str | None = None
    category: str = "user"


@dataclass
class _Future:
    owner: str
    event: asyncio.Event
    outcome: Outcome | None = None
    resolved_at: float = 0.0


class Futures:
    """request id -> outcome, awaited on the server's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ttl_s: float = 600.0) -> None:
        self._loop = loop
        self.ttl_s = ttl_s
        self._futures: dict[str, _Future] = {}
        self._lock = threading.Lock()

    def new(self, owner: str = "") -> str:
        """A pending future of client `owner` (a session id: its futures go when it ends)."""
        request_id = uuid.uuid4().hex
        with self._lock:
            self._futures[request_id] = _Future(owner, asyncio.Event())
        return request_id

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._futures

    def owner(self, request_id: str) -> str | None:
        with self._lock:
            future = self._futures.get(request_id)
            return None if future is None else future.owner

    def __len__(self) -> int:
        with self._lock:
            return len(self._futures)

    def resolve(self, request_id: str, outcome: Outcome) -> None:
        """Thread-safe: store the outcome and wake the polls waiting for it (a dropped future is ignored)."""
        with self._lock:
            future = self._futures.get(request_id)
            if future is None:
                return
            future.outcome, future.resolved_at = outcome, time.monotonic()
        self._loop.call_soon_threadsafe(future.event.set)

    async def wait(self, request_id: str, timeout: float) -> Outcome | None:
        """The outcome, waiting up to `timeout` seconds; None if still pending (or dropped meanwhile)."""
        with self._lock:
            future = self._futures.get(request_id)
        if future is None:
            return None
        try:
            await asyncio.wait_for(future.event.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return future.outcome

    def expire(self, now: float | None = None) -> int:
        """Drop outcomes resolved more than `ttl_s` ago; how many were dropped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [rid for rid, f in self._futures.items()
                   if f.outcome is not None and now - f.resolved_at > self.ttl_s]
            for rid in old:
                del self._futures[rid]
        return len(old)

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._futures.pop(request_id, None)

    def drop_owner(self, owner: str) -> int:
        """Drop every future of client `owner`, pending or not; how many were dropped."""
        with self._lock:
            gone = [rid for rid, f in self._futures.items() if f.owner == owner]
            for rid in gone:
                del self._futures[rid]
        return len(gone)


@dataclass
class Job:
    """Work for the runner. `run(payloads)` gets the payloads of every job batched with this one (same
    `batch_key`; a None key never batches) and returns one Outcome per payload. `client` names the queue the
    job waits in (a session id); `tokens` what it counts against a batch's `max_batch_tokens`; `ticket` its
    request's share of the shared budget, given back when the job has run or is dropped."""
    request_id: str
    run: Callable[[list[Any]], list[Outcome]]
    payload: Any = None
    batch_key: Any = None
    max_batch: int = 1
    client: str = ""
    tokens: int = 0
    ticket: Ticket | None = None

    def release(self) -> None:
        if self.ticket is not None:
            self.ticket.release()


def release_all(jobs) -> int:
    """Give back the budget shares of jobs that will never run; how many there were."""
    count = 0
    for job in jobs:
        if job is not None:
            job.release()
            count += 1
    return count


class Runner:
    """One daemon thread running jobs: round-robin over clients, each client's jobs in submission order
    (batching same-key neighbours from every client, up to `max_batch_tokens` tokens in all)."""

    def __init__(self, futures: Futures, max_batch_tokens: int | None = None) -> None:
        self._futures = futures
        self.max_batch_tokens = max_batch_tokens
        self._queues: OrderedDict[str, deque[Job]] = OrderedDict()
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="tinker-runner", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cv:
            self._queues.setdefault(job.client, deque()).append(job)
            self._cv.notify()

    def queued(self, client: str | None = None) -> int:
        with self._cv:
            return sum(len(q) for c, q in self._queues.items() if client is None or c == client)

    def drop(self, client: str) -> int:
        """Forget client's queued jobs (the one running, if any, runs to its end); how many were dropped."""
        with self._cv:
            return release_all(self._queues.pop(client, ()))

    def _take(self) -> list[Job]:
        with self._cv:
            while not self._queues:
                self._cv.wait()
            client, queue = next(iter(self._queues.items()))
            first = queue.popleft()
            del self._queues[client]
            if queue:
                self._queues[client] = queue  # to the back of the round
            batch, tokens = [first], first.tokens
            if first.batch_key is not None:
                for other in list(self._queues):
                    jobs = self._queues[other]
                    for job in [j for j in jobs if j.batch_key == first.batch_key]:
                        if len(batch) == first.max_batch:
                            break
                        if self.max_batch_tokens is not None and tokens + job.tokens > self.max_batch_tokens:
                            continue  # waits for a later batch; a smaller one may still fit this one
                        jobs.remove(job)
                        batch.append(job)
                        tokens += job.tokens
                    if not jobs:
                        del self._queues[other]
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
                job.release()
            del batch, outcomes  # nothing of a finished job (its model, its tensors) outlives it here


@dataclass
class SeqGate:
    """Releases a model's jobs in seq_id order (1, 2, 3, ...); a job without a seq_id goes at once."""
    submit: Callable[[Job], None]
    next_seq: int = 1
    waiting: dict[int, Job | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def offer(self, seq_id: int | None, job: Job) -> None:
        with self.lock:
            if seq_id is None:
                self.submit(job)
                return
            if seq_id < self.next_seq or seq_id in self.waiting:
                raise UserError(f"seq_id {seq_id} was already used on this model (next expected: {self.next_seq}); "
                                "each request of a training client needs a new one.")
            self._place(seq_id, job)

    def blocking(self, seq_id: int) -> bool:
        """`seq_id` is the one this model's queued later requests wait for (budget.py admits it past the budget)."""
        with self.lock:
            return seq_id == self.next_seq and any(job is not None for job in self.waiting.values())

    def drop(self) -> int:
        """Forget the jobs waiting for an earlier seq_id (their model is freed); how many there were."""
        with self.lock:
            jobs, self.waiting = list(self.waiting.values()), {}
        return release_all(jobs)

    def skip(self, seq_id: int) -> None:
        """Pass `seq_id` through without work: its request was refused. A number already placed (a refusal of
        a duplicate, a retry) changes nothing."""
        with self.lock:
            if seq_id >= self.next_seq and seq_id not in self.waiting:
                self._place(seq_id, None)

    def _place(self, seq_id: int, job: Job | None) -> None:
        self.waiting[seq_id] = job
        while self.next_seq in self.waiting:
            ready = self.waiting.pop(self.next_seq)
            if ready is not None:
                self.submit(ready)
            self.next_seq += 1
