"""The child side of grpoflow/user_code.py: a worker process that serves one function's calls.

Started as `python -c "<set sys.path>; child_main(request_fd, reply_fd, parent_pid)"` by the pool; the
frames and their contents are described in user_code.py's docstring. It reads the settings and the
function, sets the limits, says "ready", then answers each request with exactly one JSON reply carrying the
request's id.

A sandboxed pool's worker (settings["workdir"] set) is a fork server instead: it imports grpoflow/sandbox.py's
PRELOAD, checks once, when root, that a call can run as the uid the pool gave it (`probe_call_uid`; if not, it
replies "refused" with why and exits: a call never runs as root), and runs each call in a child it forks for
that call alone: the child closes the worker's pipes, enters the sandbox (`enter_sandbox`, in a folder of its
own), seeds `random` from the call's bytes (the same call draws the same numbers, in this run and a resumed one),
runs the call, writes its one reply to the worker and exits.
The worker hands that reply on verbatim (the pool checks it) or, when the child died without one, says why. So
no call sees what another changed, and code in a call never holds the worker's reply pipe. Cost: one fork per
call (docs/multi-turn.md gives the figure).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import math
import os
import pickle
import random
import resource
import shutil
import signal
import struct
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from grpoflow.sandbox import HEADER, MAX_REPLY_BYTES, PRELOAD, encode_reply, enter_sandbox, probe_call_uid, python_paths

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

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
        if settings["workdir"] is not None:
            for name in PRELOAD:
                importlib.import_module(name)
            uid = settings["uid"]
            refused = None
            if os.geteuid() == 0:
                refused = "no uid was given for its calls" if uid is None else probe_call_uid(uid, python_paths())
        else:
            _apply_limits(limits)
    except BaseException:
        _reply(reply_fd, None, "init_error", traceback.format_exc())
        return
    if settings["workdir"] is not None:
        if refused is not None:
            _reply(reply_fd, None, "refused", refused)
            return
        _reply(reply_fd, None, "ready", None)
        _fork_server(fn, settings["workdir"], limits, uid, request_fd, reply_fd)
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
            return "error", traceback.format_exc(limit=-3)
        return "killed", f"it exceeded its memory limit of {limits.memory_mb} MB"
    except BaseException:  # SystemExit included: the worker keeps serving
        return "error", traceback.format_exc(limit=-3)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)  # disarm the CPU-time timer (a no-op without one)


def _reply(fd: int, request_id: int | None, kind: str, info: Any) -> None:
    _write_all(fd, encode_reply(request_id, kind, info))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fork_server(fn: Callable, workdir: str, limits: ResourceLimits, uid: int | None, request_fd: int,
                 reply_fd: int) -> None:
    """Serve each call in a child forked for it (the module docstring) until the parent closes the pipe."""
    os.chmod(workdir, 0o711)  # a call's child (its own uid) may pass through to its own folder, not list or write here
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans it leaves come here
    while True:
        frame = _read_frame(request_fd)
        if frame is None:
            return
        (request_id,) = REQUEST_ID.unpack_from(frame)
        folder = tempfile.mkdtemp(prefix=f"call-{request_id}-", dir=workdir)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            _call_child(fn, frame, request_id, folder, limits, uid, (request_fd, reply_fd, read_end), write_end)
        os.close(write_end)
        reply = _read_up_to(read_end, HEADER.size + MAX_REPLY_BYTES + 1)
        if len(reply) > HEADER.size + MAX_REPLY_BYTES:
            os.kill(pid, signal.SIGKILL)  # a flood: handed on as it is, the pool refuses it
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        _end_leftovers()
        shutil.rmtree(folder, ignore_errors=True)
        if reply:
            _write_all(reply_fd, reply)
        else:
            _reply(reply_fd, request_id, *_died(os.waitstatus_to_exitcode(status), limits))


def _call_child(fn: Callable, frame: bytes, request_id: int, folder: str, limits: ResourceLimits, uid: int | None,
                close: tuple[int, ...], reply_fd: int) -> None:
    """The forked child of one call: sandbox, seed, run, reply, exit (never returns)."""
    try:
        for fd in close:
            os.close(fd)
        os.environ.update(HOME=folder, TMPDIR=folder)
        tempfile.tempdir = None
        _apply_limits(limits)
        enter_sandbox(folder, limits.memory_mb, uid=uid)
        _die_with_parent()
        body = frame[REQUEST_ID.size:]
        random.seed(hashlib.sha256(body).digest())
        kind, info = _serve(fn, body, limits)
        try:
            _reply(reply_fd, request_id, kind, info)
        except (TypeError, ValueError) as e:  # not JSON data; raised before anything is written
            _reply(reply_fd, request_id, "error", f"it returned a {type(info).__name__} that cannot be sent back "
                                                  f"as JSON data: {e}")
    except BaseException:
        with contextlib.suppress(BaseException):
            _reply(reply_fd, request_id, "error", traceback.format_exc(limit=3))
    finally:
        os._exit(0)


def _end_leftovers() -> None:
    """SIGKILL and reap every process a call left behind (RLIMIT_NPROC stops its forks; should one get through, this
    worker, a subreaper, inherits what it orphaned, setsid or not)."""
    while True:
        children = [pid for pid in _pids() if _parent_of(pid) == os.getpid()]
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _die_with_parent() -> None:
    """SIGKILL this child when the worker dies (set after the uid change, which clears it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _read_up_to(fd: int, limit: int) -> bytes:
    """What the child writes to `fd` until it closes it (at most `limit` bytes)."""
    chunks, got = [], 0
    while got < limit:
        chunk = os.read(fd, min(limit - got, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _died(code: int, limits: ResourceLimits) -> Outcome:
    """The reply for a call whose child exited with `code` (-N: signal N) without replying."""
    if code in (-signal.SIGPROF, -signal.SIGXCPU) and limits.cpu_time_s is not None:
        return "killed", f"it exceeded its CPU-time limit of {limits.cpu_time_s:g} s"
    if code == -signal.SIGKILL:
        return "killed", "it was killed (SIGKILL: a hard CPU-time limit or the kernel's out-of-memory killer)"
    how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else \
        f"exit code {code}"
    return "error", f"its process died ({how}) during this call, e.g. a crash in native code or os._exit()."


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
