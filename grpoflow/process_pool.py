"""Worker processes that each run one pickled function, one call at a time, with a per-call timeout.

Shared by reward scoring (grpoflow.rewards.scoring) and the tool runner (grpoflow.multiturn.tool_runner).

Why not `multiprocessing.Pool` / `ProcessPoolExecutor`: neither can stop one hung call. Here each
worker is a plain child process with its own socket, so the parent always knows which call a
worker holds and since when; a call past its deadline is ended by killing that worker (SIGKILL
to its process group, so subprocesses it started die too), and a fresh worker is started in its
place while the other workers go on.

The child is `python -c "<set sys.path>; worker_main(fd)"`, not a multiprocessing "spawn"
child, so it never re-imports the controller's `__main__` (with torch and the models); it
imports only this module and the function's own module. The function travels pickled: by
reference for importable module-level functions and classes, by file path for those loaded
from `path/to/file.py` (grpoflow.plugins), which the child loads the same way. Lambdas,
closures and functions defined in `__main__` cannot be sent.

Optional `ResourceLimits` are set in the child with `resource.setrlimit`: RLIMIT_AS (address
space, so the interpreter and the function's imports count too) once the function is loaded,
and a CPU-time limit per call, re-armed before every call (a CPU-time timer, ITIMER_PROF, backed
by RLIMIT_CPU; either signal ends the worker). A call that exceeds one gets ("killed", why) and
its worker is replaced. The limits stop runaway code, they are not a security boundary:
code in the worker can raise its own soft limits or reach the network and the file system.

Messages (pickled, over the socket): parent -> child: the limits and the function once, then
(args, kwargs) per call; child -> parent: ("ready" | "init_error", info) once, then
("ok", value), ("error", traceback text) or ("killed", why) per call.
"""

from __future__ import annotations

import io
import logging
import math
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import types
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from grpoflow.plugins import load_from_file

log = logging.getLogger("grpoflow.process_pool")

Outcome = tuple  # ("ok", value) | ("error", message) | ("timeout", None) | ("killed", why)
Task = tuple[tuple, dict]  # (args, kwargs) of one call

_BOOT = ("import sys; sys.path[:] = {path!r}; from grpoflow.process_pool import worker_main; "
         "worker_main(int(sys.argv[1]), int(sys.argv[2]))")


class WorkerStartError(RuntimeError):
    """A worker process could not start or could not load the function."""


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


# ---------------------------------------------------------------- sending the function


def dumps_function(fn: Callable) -> bytes:
    """Pickle `fn` for a worker process; raises (pickle.PicklingError, AttributeError, TypeError) if it cannot."""
    buffer = io.BytesIO()
    _FunctionPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(fn)
    return buffer.getvalue()


class _FunctionPickler(pickle.Pickler):
    """Sends functions and classes of file-loaded modules as `load_from_file("file.py:name")`.

    Such modules (grpoflow.plugins names them `grpoflow_user_...`) exist only in this process's
    sys.modules, so pickling them by module name would fail in the child.
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)) and obj is not load_from_file:
            spec = _file_spec_of(obj)
            if spec is not None:
                return load_from_file, (spec,)
        return NotImplemented


def _file_spec_of(obj: Any) -> str | None:
    """`path.py:name` for a top-level function/class of a module that is not importable by name."""
    module_name = getattr(obj, "__module__", None)
    if not isinstance(module_name, str):
        return None
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module_name == "__main__" or not isinstance(path, str) or not path.endswith(".py"):
        return None
    name = getattr(obj, "__name__", "")
    if getattr(module, name, None) is not obj:
        return None
    if _importable(module_name.partition(".")[0]):
        return None  # ordinary pickling by module name works
    return f"{path}:{name}"


def _importable(top_level: str) -> bool:
    """Whether `import top_level` would find it in a fresh process (the finders; not sys.modules)."""
    for finder in sys.meta_path:  # PathFinder, editable-install finders, built-ins, ...
        try:
            if finder.find_spec(top_level, None) is not None:
                return True
        except Exception:  # a third-party finder that cannot answer is not a yes
            continue
    return False


# ---------------------------------------------------------------- the parent side


class _Worker:
    """One child process; state is "starting", "idle" or "busy" (holding call `index` until `deadline`)."""

    def __init__(self, proc: subprocess.Popen, conn: Connection, start_deadline: float):
        self.proc, self.conn = proc, conn
        self.state = "starting"
        self.index: int | None = None
        self.deadline: float | None = start_deadline


class WorkerPool:
    """`size` worker processes running one pickled function; see the module docstring.

    `label` names the pool in messages ("reward", "tool"). Not thread-safe: one `run` at a time.
    `close()` (or garbage collection, or interpreter exit) kills the workers.
    """

    def __init__(self, payload: bytes, size: int, *, start_timeout_s: float = 120.0,
                 limits: ResourceLimits | None = None, label: str = "reward"):
        if size < 1:
            raise ValueError(f"WorkerPool size={size} must be at least 1.")
        self._payload, self._start_timeout_s = payload, start_timeout_s
        self._limits, self._label = limits or ResourceLimits(), label
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        try:
            for _ in range(size):
                self._workers.append(self._spawn())
            while any(w.state == "starting" for w in self._workers):
                self._poll([])
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def run(self, tasks: list[Task], timeout_s: float | None) -> list[Outcome]:
        """The outcome of fn(*args, **kwargs) for each (args, kwargs) task, in order.

        A call running longer than `timeout_s` (counted from when a worker takes it) gets
        ("timeout", None) and its worker is replaced; a worker that dies mid-call gets ("error", why),
        or ("killed", why) when it exceeded a resource limit, and is replaced too.
        """
        if not self._workers:
            raise RuntimeError(f"this {self._label} worker pool is closed (by close(), or by an earlier error in "
                               f"run()); start a new one.")
        outcomes: list[Outcome | None] = [None] * len(tasks)
        queue = deque(range(len(tasks)))
        try:
            while queue or any(w.state == "busy" for w in self._workers):
                self._dispatch(queue, tasks, outcomes, timeout_s)
                if queue or any(w.state == "busy" for w in self._workers):
                    self._poll(outcomes)
        except BaseException:  # Ctrl-C, or a replacement that cannot start: busy workers hold stale calls
            self.close()
            raise
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        self._finalizer()

    def _dispatch(self, queue: deque, tasks: list[Task], outcomes: list, timeout_s: float | None) -> None:
        for slot in range(len(self._workers)):
            while queue and self._workers[slot].state == "idle":
                w, i = self._workers[slot], queue.popleft()
                try:
                    w.conn.send(tasks[i])
                except (pickle.PicklingError, TypeError, AttributeError) as e:  # raised before anything is written
                    outcomes[i] = ("error", f"its arguments could not be sent to a {self._label} worker process: "
                                            f"{e!r}")
                    continue
                except OSError:  # the idle worker died; a replacement takes the call once it has started
                    queue.appendleft(i)
                    self._replace(slot)
                    continue
                w.state, w.index = "busy", i
                w.deadline = time.monotonic() + timeout_s if timeout_s is not None else None

    def _poll(self, outcomes: list) -> None:
        """Wait for the next message or deadline; record results, replace hung or dead workers."""
        waiting = [w for w in self._workers if w.state in ("busy", "starting")]
        if not waiting:
            return
        deadlines = [w.deadline for w in waiting if w.deadline is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        ready = set(wait([w.conn for w in waiting], timeout))
        for w in waiting:
            if w.conn in ready:
                self._receive(w, outcomes)
        now = time.monotonic()
        for slot, w in enumerate(self._workers):
            if w.state == "busy" and w.index is not None and w.deadline is not None and now >= w.deadline:
                outcomes[w.index] = ("timeout", None)
                self._replace(slot)
            elif w.state == "starting" and w.deadline is not None and now >= w.deadline:
                raise WorkerStartError(f"a {self._label} worker process did not start within "
                                       f"{self._start_timeout_s} s.")

    def _receive(self, w: _Worker, outcomes: list) -> None:
        try:
            kind, info = w.conn.recv()
        except (EOFError, OSError):
            code = _exit_code(w.proc)
            if w.state == "starting" or w.index is None:
                raise WorkerStartError(f"a {self._label} worker process exited (code {code}) while starting.") from None
            outcomes[w.index] = self._death(code)
            self._replace(self._workers.index(w))
            return
        except Exception:  # the child's reply could not be unpickled here
            kind, info = "error", traceback.format_exc(limit=3)
        if w.state == "starting":
            if kind != "ready":
                raise WorkerStartError(f"a {self._label} worker process could not load its function:\n{info}")
            w.state, w.deadline = "idle", None
            return
        assert w.index is not None  # a busy worker holds a call
        outcomes[w.index] = (kind, info)
        w.state, w.index, w.deadline = "idle", None, None
        if kind == "killed":  # it hit its memory limit: its heap may be left in any state
            self._replace(self._workers.index(w))

    def _death(self, code: int | None) -> Outcome:
        """The outcome of a call whose worker died with exit status `code` (-N: signal N)."""
        limits = self._limits
        if code in (-signal.SIGPROF, -signal.SIGXCPU) and limits.cpu_time_s is not None:
            return "killed", f"it exceeded its CPU-time limit of {limits.cpu_time_s:g} s"
        if code == -signal.SIGKILL and (limits.cpu_time_s is not None or limits.memory_mb is not None):
            return "killed", "it was killed (SIGKILL: a hard CPU-time limit or the kernel's out-of-memory killer)"
        how = f"signal {_signal_name(-code)}" if code is not None and code < 0 else f"exit code {code}"
        return "error", (f"the {self._label} worker process died ({how}) during this call, e.g. a crash in "
                         f"native code or os._exit().")

    def _spawn(self) -> _Worker:
        parent_end, child_end = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT.format(path=list(sys.path)), str(child_end.fileno()), str(os.getpid())],
                pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            parent_end.close()
            raise WorkerStartError(f"cannot start a {self._label} worker process: {e}") from e
        finally:
            child_end.close()
        conn = Connection(parent_end.detach())
        conn.send(self._limits)
        conn.send_bytes(self._payload)
        return _Worker(proc, conn, time.monotonic() + self._start_timeout_s)

    def _replace(self, slot: int) -> None:
        _kill(self._workers[slot])
        self._workers[slot] = self._spawn()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # e.g. a real-time signal
        return str(number)


def _exit_code(proc: subprocess.Popen) -> int | None:
    """The exit status of a worker whose socket closed (it is exiting; None if it has not within 2 s)."""
    try:
        return proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return None


def _kill(w: _Worker) -> None:
    """SIGKILL the worker and every process it started (its own session), then reap it."""
    try:
        os.killpg(w.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        w.proc.kill()
    try:
        w.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("worker process %d did not exit 5 s after SIGKILL; left behind.", w.proc.pid)
    w.conn.close()


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        _kill(w)
    workers.clear()


# ---------------------------------------------------------------- the child side


def worker_main(fd: int, parent_pid: int) -> None:
    """Serve calls on socket `fd` until it closes (the child process's whole life)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it kills this process
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    conn = Connection(fd)
    try:
        limits: ResourceLimits = conn.recv()
        fn = pickle.loads(conn.recv_bytes())
        _apply_limits(limits)
    except BaseException:
        conn.send(("init_error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            args, kwargs = conn.recv()
        except EOFError:
            return
        except Exception:
            conn.send(("error", "the call could not be unpickled in the worker:\n" + traceback.format_exc(limit=3)))
            continue
        _arm_cpu_limit(limits.cpu_time_s)
        try:
            value = fn(*args, **kwargs)
        except MemoryError:
            if limits.memory_mb is None:
                conn.send(("error", traceback.format_exc(limit=3)))
                continue
            conn.send(("killed", f"it exceeded its memory limit of {limits.memory_mb} MB"))
            return  # the parent replaces this worker
        except BaseException:  # SystemExit included: the worker keeps serving
            conn.send(("error", traceback.format_exc(limit=3)))
            continue
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)  # disarm the CPU-time timer (a no-op without one)
        try:
            conn.send(("ok", value))
        except Exception as e:  # pickling fails before anything is written
            conn.send(("error", f"it returned a {type(value).__name__} that cannot be sent back: {e!r}"))


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
