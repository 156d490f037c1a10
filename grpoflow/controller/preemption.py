"""Preemption: SIGTERM, or a first Ctrl-C, stops the run after the current step with a checkpoint.

Clusters preempt a job with SIGTERM and kill it a grace period later; a person stops a run with
Ctrl-C. Both mean "stop, but keep the work". The handler only records the request; the training
loop finishes the step it is in (its validation included, so the metrics match an uninterrupted
run), writes a checkpoint and returns, and `grpoflow train` exits 0 with the command that resumes.
A second Ctrl-C raises KeyboardInterrupt at once, as without the handler; the checkpoint being
written, if any, stays a `.tmp-` folder and the previous one is used (checkpoints are atomic).

Handlers are installed only in the main thread (Python runs signal handlers there only, and
`signal.signal` refuses other threads) and the previous ones are restored afterwards: `ray.init`
installs its own SIGTERM handler in the driver, and an embedding program keeps its own.

Ray: its processes (raylet, GCS, the actors that hold the ranks) are started with SIGINT blocked,
so a Ctrl-C that reaches the whole process group stops only the controller, which then saves
through the actors. A SIGTERM sent to every process of the job kills Ray itself; send it to the
controller (driver) only (docs/runs.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Iterator


class StopRequest:
    """Set by the first SIGTERM or SIGINT; read by the training loop after each step."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return  # a repeated SIGTERM (some schedulers send several): the stop is already under way
        self.signal_name = name
        # os.write, not print: the main thread may be inside a print, and buffered streams are not reentrant.
        _say(f"\n{name}: finishing this step, then writing a checkpoint and stopping (Ctrl-C again: stop at once, "
             "without that checkpoint)\n")


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Route SIGTERM and SIGINT to a StopRequest while the block runs (main thread only)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, request.handle)
    try:
        yield request
    finally:
        for s, handler in previous.items():  # None: a handler set outside Python; the default is the closest
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _say(text: str) -> None:
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except (OSError, ValueError):  # no usable stderr (closed, or replaced by an object without a descriptor)
        pass
