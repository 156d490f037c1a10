"""The child side of grpoflow/user_code.py: a worker process that serves one function's calls.

Started as `python -c "<set sys.path>; child_main(request_fd, reply_fd, parent_pid)"` by the pool; the
frames and their contents are described in user_code.py's docstring. It reads the settings and the
function, sets the limits (and, for a sandboxed pool, calls grpoflow/sandbox.py's `enter_sandbox`), says
"ready", then answers each request with exactly one JSON reply carrying the request's id.
"""

from __future__ import annotations

import math
import os
import pickle
import resource
import signal
import struct
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from grpoflow.sandbox import HEADER, encode_reply, enter_sandbox

REQUEST_ID = struct.Struct("!Q")  # the 8 bytes in front of each pickled call
Outcome = tuple  # (kind, info)


@dataclass(frozen=True)
class ResourceLimits:
    """Per-worker limits set in the child (see the module docstring); None: no limit."""

    cpu_time_s: float | None = None  # CPU seconds per call (user + system, all threads of the worker)
    memory_mb: int | None = None     # address space of the whole worker process (RLIMIT_AS)

    def __post_init__(self) -> None:
        if self.cpu_time_s is not None and not self.cpu_time_s > 0:
            raise ValueError(f"cpu_time_s={self.cpu_time_s!r} must be a positive number of seconds, or None.")
        if self.memory_mb is not None and not (isinstance(self.memory_mb, int) and self.memory_mb > 0):
            raise ValueError(f"memory_mb={self.memory_mb!r} must be a positive int (megabytes), or None.")


def child_main(request_fd: int, reply_fd: int, parent_pid: int) -> None:
    """Serve calls from pipe `request_fd`, replying on `reply_fd`, until the parent closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it kills this process
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    try:
        settings = pickle.loads(_read_frame(request_fd) or b"")
        limits: ResourceLimits = settings["limits"]
        fn = pickle.loads(_read_frame(request_fd) or b"")
        _apply_limits(limits)
        if settings["workdir"] is not None:
            enter_sandbox(settings["workdir"], limits.memory_mb)
    except BaseException:
        _reply(reply_fd, None, "init_error", traceback.format_exc())
        return
    _reply(reply_fd, None, "ready", None)
    while True:
        frame = _read_frame(request_fd)
        if frame is None:
            return
        (request_id,) = REQUEST_ID.unpack_from(frame)
        kind, info = _serve(fn, frame[REQUEST_ID.size:], limits)
        try:
            _reply(reply_fd, request_id, kind, info)
        except (TypeError, ValueError) as e:  # not JSON data; raised before anything is written
            _reply(reply_fd, request_id, "error", f"it returned a {type(info).__name__} that cannot be sent back "
                                                  f"as JSON data: {e}")
        if kind == "killed":
            return  # the parent replaces this worker


def _serve(fn: Callable, request: bytes, limits: ResourceLimits) -> Outcome:
    """(kind, info) of one call."""
    try:
        args, kwargs = pickle.loads(request)
    except Exception:
        return "error", "the call could not be unpickled in the worker:\n" + traceback.format_exc(limit=3)
    _arm_cpu_limit(limits.cpu_time_s)
    try:
        return "ok", fn(*args, **kwargs)
    except MemoryError:
        if limits.memory_mb is None:
            return "error", traceback.format_exc(limit=3)
        return "killed", f"it exceeded its memory limit of {limits.memory_mb} MB"
    except BaseException:  # SystemExit included: the worker keeps serving
        return "error", traceback.format_exc(limit=3)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)  # disarm the CPU-time timer (a no-op without one)


def _reply(fd: int, request_id: int | None, kind: str, info: Any) -> None:
    data = memoryview(encode_reply(request_id, kind, info))
    while data:
        data = data[os.write(fd, data):]


def _read_frame(fd: int) -> bytes | None:
    """The next frame from the parent (blocking); None when the parent closed the pipe."""
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    return _read_exact(fd, length)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _apply_limits(limits: ResourceLimits) -> None:
    """Cap this process's address space; with a CPU-time limit, no core files (SIGXCPU would write one)."""
    if limits.cpu_time_s is not None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.memory_mb is not None:
        _set_soft_limit(resource.RLIMIT_AS, limits.memory_mb * 2**20)


def _arm_cpu_limit(cpu_time_s: float | None) -> None:
    """Let the next call use `cpu_time_s` more CPU seconds than this process has used so far.

    The precise limit is a CPU-time timer (ITIMER_PROF; its SIGPROF, left at its default action,
    ends the process even inside native code); RLIMIT_CPU, which the kernel counts in whole
    seconds, backs it up one second later (SIGXCPU), e.g. if the call resets the timer.
    """
    if cpu_time_s is None:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _set_soft_limit(resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime + cpu_time_s) + 1)
    signal.setitimer(signal.ITIMER_PROF, cpu_time_s)


def _set_soft_limit(which: int, value: int) -> None:
    """Set the soft limit `which` to `value`, or to the hard limit if that is lower (it cannot be raised)."""
    _, hard = resource.getrlimit(which)
    resource.setrlimit(which, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))


def _exit_when_orphaned(parent_pid: int) -> None:
    """End this worker if the parent dies, even while the function is stuck."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)
