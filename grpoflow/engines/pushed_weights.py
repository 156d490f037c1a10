"""Feeding an engine's weight update from buckets that arrive one call at a time.

An engine's `update_weights(named_tensors, version)` pulls `(name, tensor)` pairs from an iterator
(vLLM's `reload_weights` must see the whole stream in one call). With split placement the actor's
weights reach a rollout worker as a sequence of calls, one bucket each, through the controller.
`PushedWeights` bridges the two: the engine's update runs in a helper thread over a stream that
waits for the next pushed bucket, so the worker holds at most a couple of buckets, never a whole
second copy of the model.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

import torch
from torch import Tensor

from grpoflow.engines.external import WeightSyncTimeout
from grpoflow.engines.protocol import RolloutEngine

_END = object()


class PushedWeights:
    """One weight update of `engine` to `version`, fed by `push(bucket)` and completed by `finish()`."""

    def __init__(self, engine: RolloutEngine, version: int, *, timeout_s: float) -> None:
        self.engine, self.version, self.timeout_s = engine, version, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.items: queue.Queue = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self.thread = threading.Thread(target=self._run, args=(device,), name="weight-update", daemon=True)
        self.thread.start()

    def _stream(self) -> Iterator[tuple[str, Tensor]]:
        while (bucket := self.items.get()) is not _END:
            yield from bucket

    def _run(self, device: int | None) -> None:
        if device is not None:  # a new thread starts on cuda:0; keep the caller's device
            torch.cuda.set_device(device)
        try:
            self.engine.update_weights(self._stream(), self.version)
        except BaseException as e:  # raised to the caller by push / finish
            self.error = e

    def push(self, bucket: list[tuple[str, Tensor]]) -> None:
        """Hand one bucket to the engine (waits while it is still loading the previous ones)."""
        self._put(bucket)

    def finish(self) -> None:
        """End the stream and wait for the engine to finish loading; raises what the engine raised, or
        `WeightSyncTimeout` past `timeout_s` from the start of the update."""
        self._put(_END)
        self.thread.join(max(0.0, self.deadline - time.monotonic()))
        self._check()
        if self.thread.is_alive():
            raise self._timeout()

    def _put(self, item: object) -> None:
        while True:
            self._check()
            if not self.thread.is_alive():  # the engine stopped reading without an error: a stream it refused
                raise RuntimeError(f"weight sync to version {self.version}: the engine stopped reading the stream.")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout()
            try:
                self.items.put(item, timeout=min(remaining, 0.1))
                return
            except queue.Full:
                continue

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _timeout(self) -> WeightSyncTimeout:
        return WeightSyncTimeout(f"the weight sync to version {self.version} did not complete within "
                                 f"rollout.sync_timeout_s={self.timeout_s:g} s; raise it for a larger model, or "
                                 "check the rollout engine.")
