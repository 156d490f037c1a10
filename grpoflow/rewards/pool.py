"""Worker processes that call a reward function, one sample at a time each, with a per-call timeout.

Why not `multiprocessing.Pool` / `ProcessPoolExecutor`: neither can stop one hung call. Here each
worker is a plain child process with its own socket, so the controller always knows which
sample a worker holds and since when; a call past its deadline is ended by killing that
worker (SIGKILL to its process group, so subprocesses it started die too), and a fresh worker
is started in its place while the other workers go on.

The child is `python -c "<set sys.path>; worker_main(fd)"`, not a multiprocessing "spawn"
child, so it never re-imports the controller's `__main__` (with torch and the models); it
imports only grpoflow.rewards and the reward function's own module. The function travels
pickled: by reference for importable module-level functions and classes, by file path for
those loaded from `path/to/file.py` (grpoflow.plugins), which the child loads the same way.
Lambdas, closures and functions defined in `__main__` cannot be sent (RewardScorer then scores
in-process and says so).

Messages (pickled, over the socket): parent -> child: the function once, then
(prompt, completion, row_kwargs) per sample; child -> parent: ("ready" | "init_error", info)
once, then ("ok", value) or ("error", traceback text) per sample.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
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
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from grpoflow.plugins import load_from_file

log = logging.getLogger("grpoflow.reward")

Outcome = tuple  # ("ok", value) | ("error", message) | ("timeout", None)

_BOOT = ("import sys; sys.path[:] = {path!r}; from grpoflow.rewards.pool import worker_main; "
         "worker_main(int(sys.argv[1]), int(sys.argv[2]))")


class WorkerStartError(RuntimeError):
    """A worker process could not start or could not load the reward function."""


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
    """One child process; state is "starting", "idle" or "busy" (holding sample `index` until `deadline`)."""

    def __init__(self, proc: subprocess.Popen, conn: Connection, start_deadline: float):
        self.proc, self.conn = proc, conn
        self.state = "starting"
        self.index: int | None = None
        self.deadline: float | None = start_deadline


class WorkerPool:
    """`size` worker processes running one pickled reward function; see the module docstring.

    Not thread-safe: one `run` at a time. `close()` (or garbage collection, or interpreter exit)
    kills the workers.
    """

    def __init__(self, payload: bytes, size: int, *, start_timeout_s: float = 120.0):
        if size < 1:
            raise ValueError(f"WorkerPool size={size} must be at least 1.")
        self._payload, self._start_timeout_s = payload, start_timeout_s
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

    def run(self, tasks: list[tuple[str, str, dict]], timeout_s: float | None) -> list[Outcome]:
        """The outcome of fn(prompt, completion, **kwargs) for each task, in order.

        A call running longer than `timeout_s` gets ("timeout", None) and its worker is replaced;
        a worker that dies mid-call gets ("error", ...) and is replaced too.
        """
        if not self._workers:
            raise RuntimeError("this reward worker pool is closed (by close(), or by an earlier error in run()); "
                               "start a new RewardScorer.")
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

    def _dispatch(self, queue: deque, tasks: list, outcomes: list, timeout_s: float | None) -> None:
        for slot in range(len(self._workers)):
            while queue and self._workers[slot].state == "idle":
                w, i = self._workers[slot], queue.popleft()
                try:
                    w.conn.send(tasks[i])
                except (pickle.PicklingError, TypeError, AttributeError) as e:  # raised before anything is written
                    outcomes[i] = ("error", f"its row could not be sent to a reward worker process: {e!r}")
                    continue
                except OSError:  # the idle worker died; a replacement takes the sample once it has started
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
                raise WorkerStartError(f"a reward worker process did not start within {self._start_timeout_s} s.")

    def _receive(self, w: _Worker, outcomes: list) -> None:
        try:
            kind, info = w.conn.recv()
        except (EOFError, OSError):
            code = w.proc.poll()
            if w.state == "starting" or w.index is None:
                raise WorkerStartError(f"a reward worker process exited (code {code}) while starting.") from None
            outcomes[w.index] = ("error", f"the reward worker process died (exit code {code}) while scoring "
                                          f"this sample, e.g. a crash in native code or os._exit().")
            self._replace(self._workers.index(w))
            return
        except Exception:  # the child's reply could not be unpickled here
            kind, info = "error", traceback.format_exc(limit=3)
        if w.state == "starting":
            if kind != "ready":
                raise WorkerStartError(f"a reward worker process could not load the reward function:\n{info}")
            w.state, w.deadline = "idle", None
            return
        assert w.index is not None  # a busy worker holds a sample
        outcomes[w.index] = (kind, info)
        w.state, w.index, w.deadline = "idle", None, None

    def _spawn(self) -> _Worker:
        parent_end, child_end = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT.format(path=list(sys.path)), str(child_end.fileno()), str(os.getpid())],
                pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            parent_end.close()
            raise WorkerStartError(f"cannot start a reward worker process: {e}") from e
        finally:
            child_end.close()
        conn = Connection(parent_end.detach())
        conn.send_bytes(self._payload)
        return _Worker(proc, conn, time.monotonic() + self._start_timeout_s)

    def _replace(self, slot: int) -> None:
        _kill(self._workers[slot])
        self._workers[slot] = self._spawn()


def _kill(w: _Worker) -> None:
    """SIGKILL the worker and every process it started (its own session), then reap it."""
    try:
        os.killpg(w.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        w.proc.kill()
    try:
        w.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("reward worker process %d did not exit 5 s after SIGKILL; left behind.", w.proc.pid)
    w.conn.close()


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        _kill(w)
    workers.clear()


# ---------------------------------------------------------------- the child side


def worker_main(fd: int, parent_pid: int) -> None:
    """Serve reward calls on socket `fd` until it closes (the child process's whole life)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's; it kills this process
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    conn = Connection(fd)
    try:
        fn = pickle.loads(conn.recv_bytes())
    except BaseException:
        conn.send(("init_error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            prompt, completion, kwargs = conn.recv()
        except EOFError:
            return
        except Exception:
            conn.send(("error", "the sample could not be unpickled in the worker:\n" + traceback.format_exc(limit=3)))
            continue
        try:
            value = fn(prompt, completion, **kwargs)
        except BaseException:  # SystemExit included: the worker keeps serving
            conn.send(("error", traceback.format_exc(limit=3)))
            continue
        try:
            conn.send(("ok", value))
        except Exception as e:  # pickling fails before anything is written
            conn.send(("error", f"it returned a {type(value).__name__} that cannot be sent back: {e!r}"))


def _exit_when_orphaned(parent_pid: int) -> None:
    """End this worker if the controller dies, even while the reward function is stuck."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)
