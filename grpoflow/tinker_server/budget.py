"""What the Tinker server holds for requests at once, over every client: a budget of bytes and of tokens.

Each request's own size is bounded elsewhere (`tinker.max_request_mb`, `tinker.max_sample_tokens`); many requests
within those bounds still add up. Here every request gets a `Ticket` when it arrives (guard.py): the bytes of its
body (one over 64 KiB: small ones, such as the long polls of `retrieve_future`, are not counted) count from the
moment they are received until its work has run (a queued job keeps its request's ticket,
futures.Runner releases it), and a sample request adds its tokens, `num_samples x (prompt + max_tokens)` (the KV
cache it will need), when it is queued. A request that would take the budget past `tinker.max_queued_mb` or
`tinker.max_queued_tokens` raises `Busy`: the server answers 429 with Retry-After, and the SDK waits and sends it
again (a 429 does not use up the request's `seq_id`).

Two exceptions keep every client moving: a budget that holds nothing else admits any one request (each fits a
request's own limits), and a training model's request that its later, already queued requests wait for (the SDK
sends a batch's chunks at once, first chunk last: see futures.SeqGate) is admitted past the budget, since refusing
it would leave them waiting and the budget full. Each model has at most one such request at a time.
"""

from __future__ import annotations

import threading

RETRY_AFTER_S = 2  # what a 429 tells the client to wait (the SDK's sampler waits 1-5 s, its training calls back off)


class Busy(Exception):
    """The shared budget is full now: answer 429 with Retry-After (the request itself is fine)."""


class Budget:
    """Bytes and tokens held by requests at once; `ticket()` for each request."""

    def __init__(self, max_bytes: int, max_tokens: int) -> None:
        self.max_bytes, self.max_tokens = max_bytes, max_tokens
        self.bytes = self.tokens = 0
        self.refused = 0   # requests answered 429 so far
        self._tickets = 0  # tickets holding anything
        self._lock = threading.Lock()

    def ticket(self) -> Ticket:
        return Ticket(self)

    def _take(self, ticket: Ticket, n_bytes: int, n_tokens: int, force: bool) -> None:
        with self._lock:
            alone = self._tickets == (1 if ticket.held else 0)
            over = self.bytes + n_bytes > self.max_bytes or self.tokens + n_tokens > self.max_tokens
            if over and not (alone or force):
                self.refused += 1
                what = (f"{self.bytes + n_bytes} bytes (tinker.max_queued_mb: {self.max_bytes})"
                        if self.bytes + n_bytes > self.max_bytes else
                        f"{self.tokens + n_tokens} tokens (tinker.max_queued_tokens: {self.max_tokens})")
                raise Busy(f"the server is busy: with this request its queue would hold {what}; send it again "
                           f"in {RETRY_AFTER_S} s (the SDK does).")
            if not ticket.held and (n_bytes or n_tokens):
                self._tickets += 1
            self.bytes += n_bytes
            self.tokens += n_tokens
            ticket.bytes += n_bytes
            ticket.tokens += n_tokens

    def _give_back(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.held:
                self._tickets -= 1
            self.bytes -= ticket.bytes
            self.tokens -= ticket.tokens
            ticket.bytes = ticket.tokens = 0


class Ticket:
    """One request's share of the budget. `add` raises Busy where it does not fit; `release` (idempotent) gives it
    all back. `kept`: a queued job holds the ticket now, and releases it when it has run."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.bytes = self.tokens = 0
        self.kept = False

    @property
    def held(self) -> bool:
        return bool(self.bytes or self.tokens)

    def add(self, *, n_bytes: int = 0, n_tokens: int = 0, force: bool = False) -> None:
        if n_bytes or n_tokens:
            self.budget._take(self, n_bytes, n_tokens, force)

    def release(self) -> None:
        self.budget._give_back(self)
