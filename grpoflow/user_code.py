"""Processes that run untrusted user code (reward functions, tools) under limits: each child runs one pickled
function, one call at a time, with a per-call timeout and optional CPU-time and memory limits.

Shared by reward scoring (grpoflow.rewards.scoring) and the tool runner (grpoflow.trajectories.tool_runner).

Why not `multiprocessing.Pool` / `ProcessPoolExecutor`: neither can stop one hung call. Here each
worker is a plain child process with its own pipes, so the parent always knows which call a
worker holds and since when; a call past its deadline is ended by killing that worker (SIGKILL
to its process group, so subprocesses it started die too), and a fresh worker is started in its
place while the other workers go on.

The child is `python -c "<set sys.path>; child_main(...)"` (grpoflow/user_code_child.py), not a
multiprocessing "spawn" child, so it never re-imports the controller's `__main__` (with torch and the
models); it imports only grpoflow's bottom layer and the function's own module. The function travels pickled: by
reference for importable module-level functions and classes, by file path for those loaded
from `path/to/file.py` (grpoflow.plugins), which the child loads the same way. Lambdas,
closures and functions defined in `__main__` cannot be sent.

Optional `ResourceLimits` are set in the child with `resource.setrlimit`: RLIMIT_AS (address
space, so the interpreter and the function's imports count too) once the function is loaded,
and a CPU-time limit per call, re-armed before every call (a CPU-time timer, ITIMER_PROF, backed
by RLIMIT_CPU; either signal ends the worker). A call that exceeds one gets ("killed", why) and
its worker is replaced. Without `sandbox=True` the limits only stop runaway code (soft limits can be raised).

Messages go over two pipes, in frames of a 4-byte length and a body. Parent -> child (pickled: the child
trusts its parent): the settings and the function once, then per call an 8-byte request id and the pickled
(args, kwargs). Child -> parent: **JSON, never pickle** (grpoflow/sandbox.py): `{"id", "kind", "info"}`
with kind "ready" or "init_error" once, then "ok" (info: the return value as JSON data), "error"
(traceback text) or "killed" (why) per call. The parent takes exactly one reply per request id, from the
worker that holds that request; anything else (a second reply, a reply for another id, a frame that is not
such JSON, a reply from an idle worker, an "ok" value that the pool's `validate` refuses) is a protocol
violation: the worker is killed and replaced, and the call it held is an error. So code running in a
worker can decide its own call's result, as it could by returning it, but cannot run code in the parent
or hand a reply to another call.

`sandbox=True` (the tool runner's pools) also gives each worker a minimal environment, stdout/stderr on
/dev/null, a temporary folder of its own as cwd (deleted after the worker is killed) and what
grpoflow/sandbox.py's `enter_sandbox` takes away (a uid of its own, no capabilities, no_new_privs, hard limits,
no fork). A root trainer starts such workers in bubblewrap's read-only view where it works, else as root with
calls that change their uid; where neither keeps the calls from root, the pool refuses to start with a
`UserError` that names the cause and the fix (`sandbox.isolation`).
Reward pools keep the trainer's environment: a reward function is the user's own code and may need an
API key.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import weakref
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable

from grpoflow.errors import UserError
from grpoflow.plugins import load_from_file
from grpoflow.user_code_child import REQUEST_ID, ResourceLimits
from grpoflow.sandbox import (HEADER, FrameReader, Isolation, ProtocolError, call_uid, isolation, minimal_environment,
                              view_command)

__all__ = ["Outcome", "ResourceLimits", "Task", "UserCodeProcesses", "UserCodeStartError", "dumps_function"]

log = logging.getLogger("grpoflow.user_code")

Outcome = tuple  # ("ok", value) | ("error", message) | ("timeout", None) | ("killed", why)
Task = tuple[tuple, dict]  # (args, kwargs) of one call

_BOOT = ("import sys; sys.path[:] = {path!r}; from grpoflow.user_code_child import child_main; "
         "child_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")
_SEND_TIMEOUT_S = 30.0  # a worker that does not read its request within this is killed
_CALL_KINDS = ("ok", "error", "killed")
Validate = Callable[[Any], Any]  # an "ok" value -> the value to give back; ValueError: a protocol violation


class UserCodeStartError(RuntimeError):
    """A worker process could not start or could not load the function."""


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


class _Child:
    """One child process; state is "starting", "idle" or "busy" (holding call `index`, sent as `request_id`,
    until `deadline`)."""

    def __init__(self, proc: subprocess.Popen, request_fd: int, reader: FrameReader, workdir: str | None,
                 start_deadline: float):
        self.proc, self.request_fd, self.reader, self.workdir = proc, request_fd, reader, workdir
        self.state = "starting"
        self.index: int | None = None
        self.request_id: int | None = None
        self.deadline: float | None = start_deadline


class UserCodeProcesses:
    """`size` worker processes running one pickled function; see the module docstring.

    `label` names the pool in messages ("reward", "tool"); `sandbox` isolates the workers (module
    docstring); `validate` checks each "ok" value a worker sends. Not thread-safe: one `run` at a time.
    `close()` (or garbage collection, or interpreter exit) kills the workers.
    """

    def __init__(self, payload: bytes, size: int, *, start_timeout_s: float = 120.0,
                 limits: ResourceLimits | None = None, label: str = "reward", sandbox: bool = False,
                 validate: Validate | None = None):
        if size < 1:
            raise ValueError(f"UserCodeProcesses size={size} must be at least 1.")
        self._payload, self._start_timeout_s = payload, start_timeout_s
        self._limits, self._label = limits or ResourceLimits(), label
        self._sandbox, self._validate = sandbox, validate
        self._isolation: Isolation | None = None  # a root trainer's sandboxed pool: how its calls leave root
        if sandbox and os.geteuid() == 0:
            self._isolation = isolation(label)
            if self._isolation.kind == "refused":
                raise UserError(self._isolation.reason)
        self._next_id = 0
        self._workers: list[_Child] = []  # the live ones; a slot whose worker could not start waits in _down
        self._down: list[float] = []  # when each such slot tries again
        self._start_failures, self._why_down = 0, ""  # failed starts in a row (the backoff), and the last reason
        self._started = self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        try:
            for _ in range(size):
                self._workers.append(self._spawn())
            while any(w.state == "starting" for w in self._workers):
                self._poll([])
        except BaseException:
            self.close()
            raise
        self._started = True

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def run(self, tasks: list[Task], timeout_s: float | None) -> list[Outcome]:
        """The outcome of fn(*args, **kwargs) for each (args, kwargs) task, in order.

        A call running longer than `timeout_s` (counted from when a worker takes it) gets
        ("timeout", None) and its worker is replaced; a worker that dies mid-call gets ("error", why),
        or ("killed", why) when it exceeded a resource limit, and is replaced too; so is one that breaks
        the reply protocol (its call gets ("error", why)). A replacement that cannot start (e.g. EAGAIN while a
        fork bomb is reaped) is tried again with backoff (0.5 s doubling to 30 s); while no worker runs, calls
        get ("error", why) at once.
        """
        if self._closed:
            raise RuntimeError(f"this {self._label} worker pool is closed (by close(), or by an earlier error in "
                               f"run()); start a new one.")
        outcomes: list[Outcome | None] = [None] * len(tasks)
        queue = deque(range(len(tasks)))
        try:
            while queue or any(w.state == "busy" for w in self._workers):
                self._revive()
                if queue and not self._workers:  # every slot waits to try again: these calls fail now
                    retry = max(0.0, min(self._down) - time.monotonic())
                    for i in queue:
                        outcomes[i] = ("error", f"no {self._label} worker process is running ({self._why_down}); "
                                                f"the next start is tried in {retry:.1f} s")
                    queue.clear()
                    break
                self._dispatch(queue, tasks, outcomes, timeout_s)
                if queue or any(w.state == "busy" for w in self._workers):
                    self._poll(outcomes)
        except BaseException:  # Ctrl-C, or a replacement that cannot start: busy workers hold stale calls
            self.close()
            raise
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def _revive(self) -> None:
        """Start a worker in each slot whose time to try again has come."""
        now = time.monotonic()
        due = [t for t in self._down if t <= now]
        self._down = [t for t in self._down if t > now]
        for _ in due:
            try:
                self._workers.append(self._spawn())
            except UserCodeStartError as e:
                self._went_down(str(e))

    def _went_down(self, why: str) -> None:
        """A slot lost its worker and could not start another: it tries again after a backoff."""
        if not self._started:
            raise UserCodeStartError(why)
        self._start_failures += 1
        lines = why.strip().splitlines() or [""]
        self._why_down = lines[0].rstrip(":.") + (f": {lines[-1]}" if len(lines) > 1 else "")  # one line, for calls
        backoff = min(30.0, 0.5 * 2 ** (self._start_failures - 1))
        self._down.append(time.monotonic() + backoff)
        log.warning("%s; the %s pool tries again in %.1f s (%d of its workers running).", why.rstrip("."),
                    self._label, backoff, len(self._workers))

    def _start_failed(self, w: _Child, why: str) -> None:
        """`w` failed while starting: raise while the pool starts, else kill it and let its slot try again."""
        if not self._started:
            raise UserCodeStartError(why)
        _kill(w)
        self._workers.remove(w)
        self._went_down(why)

    def _dispatch(self, queue: deque, tasks: list[Task], outcomes: list, timeout_s: float | None) -> None:
        for w in list(self._workers):
            while queue and w in self._workers and w.state == "idle":
                i = queue.popleft()
                try:
                    body = pickle.dumps(tasks[i], protocol=pickle.HIGHEST_PROTOCOL)
                except (pickle.PicklingError, TypeError, AttributeError) as e:
                    outcomes[i] = ("error", f"its arguments could not be sent to a {self._label} worker process: "
                                            f"{e!r}")
                    continue
                self._next_id += 1
                try:
                    _send_frame(w.request_fd, REQUEST_ID.pack(self._next_id) + body,
                                time.monotonic() + _SEND_TIMEOUT_S)
                except (OSError, TimeoutError):  # it died or does not read: a replacement takes the call
                    queue.appendleft(i)
                    self._replace(w)
                    break
                w.state, w.index, w.request_id = "busy", i, self._next_id
                w.deadline = time.monotonic() + timeout_s if timeout_s is not None else None

    def _poll(self, outcomes: list) -> None:
        """Wait for the next reply or deadline; record results, replace hung, dead or misbehaving workers."""
        waiting = [w for w in self._workers if w.state in ("busy", "starting")]
        if not waiting:
            return
        deadlines = [w.deadline for w in waiting if w.deadline is not None] + self._down
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        ready = set(wait([w.reader.fd for w in self._workers], timeout))  # idle ones too: they must stay silent
        for w in list(self._workers):
            if w.reader.fd in ready and w in self._workers:
                self._receive(w, outcomes)
        now = time.monotonic()
        for w in list(self._workers):
            if w.state == "busy" and w.index is not None and w.deadline is not None and now >= w.deadline:
                outcomes[w.index] = ("timeout", None)
                self._replace(w)
            elif w.state == "starting" and w.deadline is not None and now >= w.deadline:
                self._start_failed(w, f"a {self._label} worker process did not start within "
                                      f"{self._start_timeout_s} s.")

    def _receive(self, w: _Child, outcomes: list) -> None:
        try:
            replies = w.reader.read()
        except ProtocolError as e:
            self._violation(w, outcomes, str(e))
            return
        for reply in replies:
            if not self._accept(w, reply, outcomes):
                return  # w was replaced
        if w.reader.closed:
            code = _exit_code(w.proc)
            if w.state == "starting":
                self._start_failed(w, f"a {self._label} worker process exited (code {code}) while starting.")
                return
            if w.state == "busy" and w.index is not None:
                outcomes[w.index] = self._death(code)
            else:
                log.warning("an idle %s worker process exited (code %s); it is replaced.", self._label, code)
            self._replace(w)

    def _accept(self, w: _Child, reply: dict, outcomes: list) -> bool:
        """Take one reply from `w`; False if `w` was replaced (it broke the protocol, or hit its memory limit)."""
        kind, info, request_id = reply["kind"], reply["info"], reply["id"]
        if w.state == "starting":
            if kind == "refused" and request_id is None:  # a call of it could not leave root
                raise UserError(f"a sandboxed {self._label} worker refused to start: {info}; calls never run as "
                                f"root (docs/multi-turn.md, 'What the sandbox stops').")
            if kind == "init_error" and request_id is None:
                self._start_failed(w, f"a {self._label} worker process could not load its function:\n{info}")
                return False
            if kind != "ready" or request_id is not None:
                self._start_failed(w, f"a {self._label} worker process sent {kind!r} while starting.")
                return False
            w.state, w.deadline = "idle", None
            self._start_failures = 0
            return True
        if w.state != "busy" or request_id != w.request_id or kind not in _CALL_KINDS:
            held = f"request {w.request_id}" if w.state == "busy" else "no request"
            self._violation(w, outcomes, f"a {kind!r} reply for request {request_id} while it held {held}")
            return False
        if kind == "ok" and self._validate is not None:
            try:
                info = self._validate(info)
            except ValueError as e:
                self._violation(w, outcomes, f"a value its function cannot have returned ({e})")
                return False
        elif kind != "ok" and not isinstance(info, str):
            self._violation(w, outcomes, f"an {kind!r} reply whose text is a {type(info).__name__}")
            return False
        assert w.index is not None  # a busy worker holds a call
        outcomes[w.index] = (kind, info)
        w.state, w.index, w.request_id, w.deadline = "idle", None, None, None
        if kind == "killed":  # it hit its memory limit: its heap may be left in any state
            self._replace(w)
            return False
        return True

    def _violation(self, w: _Child, outcomes: list, why: str) -> None:
        log.warning("a %s worker process (pid %d) broke the reply protocol: %s. It was killed and replaced; code "
                    "running in it tried to forge or corrupt its replies.", self._label, w.proc.pid, why)
        if w.state == "busy" and w.index is not None:
            outcomes[w.index] = ("error", f"its {self._label} worker process broke the reply protocol ({why}) and "
                                          f"was killed")
        self._replace(w)

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

    def _spawn(self) -> _Child:
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        workdir = tempfile.mkdtemp(prefix=f"grpoflow-{self._label}-") if self._sandbox else None
        quiet = subprocess.DEVNULL if self._sandbox else None
        view = self._isolation if self._isolation is not None and self._isolation.kind == "view" else None
        # in the view the worker's parent is bubblewrap's init (pid 1 of its pid namespace), killed with the trainer
        argv = [sys.executable, "-c", _BOOT.format(path=list(sys.path)), str(request_r), str(reply_w),
                "1" if view else str(os.getpid())]
        if view is not None and workdir is not None:
            argv = view_command(workdir, view, argv)
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=(request_r, reply_w), stdin=subprocess.DEVNULL, stdout=quiet, stderr=quiet,
                start_new_session=True, cwd=workdir, env=minimal_environment(workdir) if workdir else None)
        except OSError as e:
            for fd in (request_w, reply_r):
                os.close(fd)
            raise UserCodeStartError(f"cannot start a {self._label} worker process: {e}") from e
        finally:
            os.close(request_r)
            os.close(reply_w)
        os.set_blocking(request_w, False)
        w = _Child(proc, request_w, FrameReader(reply_r), workdir, time.monotonic() + self._start_timeout_s)
        uid = call_uid(proc.pid) if self._isolation is not None else None
        settings = pickle.dumps({"limits": self._limits, "workdir": workdir, "uid": uid})
        try:
            _send_frame(request_w, settings, w.deadline or 0.0)
            _send_frame(request_w, self._payload, w.deadline or 0.0)
        except (OSError, TimeoutError) as e:
            _kill(w)
            raise UserCodeStartError(f"a {self._label} worker process did not take its function: {e!r}") from None
        return w

    def _replace(self, w: _Child) -> None:
        """Kill `w` and start another in its place (its slot waits to try again if that cannot start)."""
        _kill(w)
        slot = self._workers.index(w)
        try:
            self._workers[slot] = self._spawn()
        except UserCodeStartError as e:
            del self._workers[slot]
            self._went_down(str(e))


def _send_frame(fd: int, body: bytes, deadline: float) -> None:
    """Write one frame to a non-blocking pipe; TimeoutError if the reader does not take it by `deadline`."""
    view = memoryview(HEADER.pack(len(body)) + body)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the worker process does not read its requests") from None
            select.select([], [fd], [], remaining)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # e.g. a real-time signal
        return str(number)


def _exit_code(proc: subprocess.Popen) -> int | None:
    """The exit status of a worker whose pipe closed (it is exiting; None if it has not within 2 s)."""
    try:
        return proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return None


def _kill(w: _Child) -> None:
    """SIGKILL the worker and every process it started (its own session, and every descendant: a sandboxed
    worker is a subreaper, so what its calls orphaned in other sessions is still below it), reap it, delete its
    folder."""
    if w.workdir is not None:
        for pid in _descendants(w.proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(w.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        w.proc.kill()
    try:
        w.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("worker process %d did not exit 5 s after SIGKILL; left behind.", w.proc.pid)
    for fd in (w.request_fd, w.reader.fd):
        try:
            os.close(fd)
        except OSError:
            pass
    if w.workdir is not None:
        shutil.rmtree(w.workdir, ignore_errors=True)


def _descendants(root: int) -> list[int]:
    """Every process below `root` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        parent = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(parent, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_all(workers: list[_Child]) -> None:
    for w in workers:
        _kill(w)
    workers.clear()
