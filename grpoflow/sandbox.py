"""What a worker process that runs untrusted code (the `python` tool) gives up, and the reply format it speaks.

Standard library only (with ctypes for prctl), so grpoflow/user_code.py can use it from the bottom layer.

Replies are data. A worker writes each reply as one frame: a 4-byte big-endian length, then that many bytes
of UTF-8 JSON `{"id": <request id or null>, "kind": str, "info": <JSON value>}`. The parent reads frames
with `FrameReader` (non-blocking, bounded size, bounded nesting), never unpickles them, and checks the id
and kind itself (user_code.py). Requests from the parent are pickled: the worker trusts its parent.

A sandboxed worker is a fork server (grpoflow/user_code_child.py): it loads its function and `PRELOAD`, then
forks one child per call, so every call starts from the same pristine interpreter state (nothing a call changes,
builtins, modules, `random`'s state, files in its folder, reaches another call). `enter_sandbox(workdir,
memory_mb, drop_uid=)` runs in that child before the call:

- its cwd becomes `workdir`, a fresh temporary folder of its own (deleted after the call);
- running as root, it becomes a uid of its worker's own (`call_uid`: UID_BASE + the worker's pid, no passwd
  entry, no groups), so it cannot read root-only files, write outside its folder and world-writable ones, signal
  the trainer, another worker or another worker's call, or raise its own hard limits; its bounding, inheritable
  and ambient capability sets are emptied too. It is never root: a worker that cannot give a call such a uid, or
  whose calls could not read Python as that uid, refuses to start (`probe_call_uid`) and the pool says why;
- `PR_SET_NO_NEW_PRIVS`: no setuid binary or file capability can give privileges back;
- hard limits: RLIMIT_AS (`memory_mb`, soft = hard, so the code cannot raise it), RLIMIT_NPROC = 0 (no
  fork, no new thread: nothing it starts can leave its process group or outlive it), RLIMIT_FSIZE
  (`MAX_FILE_BYTES` per file written), RLIMIT_CORE = 0.

Where bubblewrap (`bwrap`, Debian's `bubblewrap`) is installed and works, a root trainer starts each sandboxed
worker inside it (`view_command`): the whole file system read-only but the worker's own folder, its own /proc,
/dev and pid namespace (a call sees no process outside its worker, so it cannot even name the trainer's), and the
worker itself with only the capabilities it needs to hand its calls their uid (WORKER_CAPS). Folders that a call's
uid could not pass through (pyenv's Python under /root) are covered by an empty tmpfs into which the folders Python
and grpoflow are read from are bound again, read-only: so the calls can import the standard library without root.
Without bubblewrap, where such a uid can read Python, the workers run as root in the trainer's file system and
only the calls' uid protects it; where it cannot, the `python` tool is refused at start with the fix
(`isolation`).

What it does not stop: reading world-readable files, the network, spending its CPU until the per-call
timeout, writing many files up to MAX_FILE_BYTES each in its folder. docs/multi-turn.md says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import json
import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

HEADER = struct.Struct("!I")
MAX_REPLY_BYTES = 64 * 2**20   # a longer reply frame is a protocol violation (the worker is killed)
MAX_FILE_BYTES = 64 * 2**20    # RLIMIT_FSIZE of a sandboxed worker: its captured output counts too
UID_BASE = 1 << 30  # a call's uid is this + its worker's pid (call_uid)
BWRAP = shutil.which("bwrap")  # bubblewrap, for the read-only view (None: not installed; tests set it to test without)
# What a worker in the view keeps, to give each call its uid, chown and delete its folder, end what it left behind
WORKER_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID")
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_active = False  # set by enter_sandbox: this process is a sandboxed worker


class ProtocolError(ValueError):
    """A worker's bytes are not a well-formed reply frame (too long, not JSON, not a reply object)."""


# ---------------------------------------------------------------- the reply format


def encode_reply(request_id: int | None, kind: str, info: Any) -> bytes:
    """One reply frame; raises TypeError/ValueError if `info` is not JSON data (NaN and inf are allowed)."""
    body = json.dumps({"id": request_id, "kind": kind, "info": info}, ensure_ascii=False).encode()
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Reads reply frames from a non-blocking pipe end, whatever the writer sends, without ever blocking."""

    def __init__(self, fd: int, max_bytes: int = MAX_REPLY_BYTES):
        self.fd, self.max_bytes = fd, max_bytes
        self._buffer = bytearray()
        self.closed = False
        os.set_blocking(fd, False)

    def read(self) -> list[dict]:
        """The complete replies now readable (maybe none); `closed` turns True at end of file.

        Raises ProtocolError for a frame over `max_bytes`, bytes that are not JSON, or JSON that is not
        an object with exactly the keys id, kind (a str) and info.
        """
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self._buffer += chunk
            if len(self._buffer) > self.max_bytes + HEADER.size:
                break  # _frames raises on the length; read no more from a flood
        return self._frames()

    def _frames(self) -> list[dict]:
        replies = []
        while len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            if length > self.max_bytes:
                raise ProtocolError(f"a reply of {length} bytes (the limit is {self.max_bytes})")
            if len(self._buffer) < HEADER.size + length:
                break
            body = bytes(self._buffer[HEADER.size:HEADER.size + length])
            del self._buffer[:HEADER.size + length]
            replies.append(_decode(body))
        return replies


def _decode(body: bytes) -> dict:
    try:
        reply = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, huge ints
        raise ProtocolError(f"a reply that is not JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if (not isinstance(reply, dict) or set(reply) != {"id", "kind", "info"} or not isinstance(reply["kind"], str)
            or not (reply["id"] is None or type(reply["id"]) is int)):
        raise ProtocolError(f"a reply that is not {{id, kind, info}}: {str(reply)[:200]}")
    return reply


# ---------------------------------------------------------------- giving things up


def minimal_environment(workdir: str) -> dict[str, str]:
    """The whole environment of a sandboxed worker: no API keys or tokens from the trainer's; one BLAS / OpenMP
    thread (no new thread may start in it: RLIMIT_NPROC)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


# What a sandboxed worker imports before its first call (each call's child then has them without reading a file).
PRELOAD = ("math", "cmath", "random", "re", "json", "itertools", "collections", "functools", "fractions", "decimal",
           "statistics", "datetime", "string", "operator", "heapq", "bisect", "glob", "textwrap", "typing")


def python_paths() -> list[str]:
    """The directories Python reads modules from: the standard library (and lib-dynload) and site-packages."""
    paths = sysconfig.get_paths()
    found = [paths["stdlib"], os.path.join(paths["stdlib"], "lib-dynload"), paths["platstdlib"], paths["purelib"]]
    return list(dict.fromkeys(p for p in found if os.path.isdir(p)))


def python_dirs() -> list[str]:
    """Python's own folders, resolved: its prefixes, the standard library and site-packages (what a call needs)."""
    found = python_paths() + [sys.base_prefix, sys.prefix]
    return list(dict.fromkeys(os.path.realpath(p) for p in found if os.path.isdir(p)))


def import_paths() -> list[str]:
    """Every folder a worker may import from, resolved: `python_dirs` and `sys.path`'s (a tool file's folder)."""
    found = python_dirs() + [p for p in sys.path if os.path.isabs(p)]
    return list(dict.fromkeys(os.path.realpath(p) for p in found if os.path.isdir(p)))


# ---------------------------------------------------------------- who a call runs as, and what it sees


def call_uid(worker_pid: int) -> int:
    """The uid of a worker's calls: UID_BASE + the worker's pid (pids stay below 2**22), so no two live workers,
    of this run or another, share one, and none is a real user's."""
    return UID_BASE + worker_pid


@dataclass(frozen=True)
class Isolation:
    """How a root trainer isolates its sandboxed workers (the module docstring).

    kind: "view" (in bubblewrap), "uid" (only the calls' uid) or "refused" (`reason` says why and the fix).
    covered: folders a call's uid cannot pass through, each covered by a tmpfs in the view; rebound: the import
    folders under them, bound into it again read-only.
    """

    kind: str
    covered: tuple[str, ...] = ()
    rebound: tuple[str, ...] = ()
    reason: str = ""


def isolation(label: str) -> Isolation:
    """How to isolate the sandboxed `label` workers of a root trainer: what its calls' uid cannot read of
    `python_dirs` decides; the view binds back every folder of `import_paths` it covers."""
    blocked = blocked_folders(python_dirs())
    problem = _bwrap_problem(BWRAP) if BWRAP is not None else "it is not installed"
    if problem is None:
        rebound = [p for p in import_paths() if any(_under(p, f) for f in blocked)]
        rebound = [p for p in rebound if not any(q != p and _under(p, q) for q in rebound)]
        return Isolation("view", tuple(blocked), tuple(rebound))
    if not blocked:
        return Isolation("uid")
    folder = blocked[0]
    return Isolation("refused", reason=(
        f"sandboxed {label} calls never run as root, and a uid of their own cannot read {folder}, where Python "
        f"lives ({sys.base_prefix}); install bubblewrap (apt-get install bubblewrap; here {problem}) so that they "
        f"see Python read-only, or make the folder readable (chmod o+rx {folder}), or use a Python installed where "
        f"every user can read it (e.g. /usr/local or /opt)."))


def blocked_folders(paths: list[str]) -> list[str]:
    """For each path, the first folder on it that a process with a uid and gid of its own (only the "other"
    permission bits apply to it) cannot pass through, or the path itself if it cannot list it; each once."""
    found: list[str] = []
    for path in paths:
        parts = os.path.abspath(path).split(os.sep)
        for k in range(2, len(parts) + 1):
            folder = os.sep.join(parts[:k])
            try:
                mode = os.stat(folder).st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH or (k == len(parts) and not mode & stat.S_IROTH):
                if folder not in found:
                    found.append(folder)
                break
    return found


def view_command(workdir: str, view: Isolation, argv: list[str]) -> list[str]:
    """`argv` inside bubblewrap: the file system read-only but `workdir`, `view.covered` hidden but what is rebound
    (the module docstring); its own /proc, /dev, pid and IPC namespaces; only WORKER_CAPS; killed with its parent."""
    assert BWRAP is not None
    command = [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for folder in view.covered:
        command += ["--tmpfs", folder]
        for path in [*view.rebound, workdir]:
            if _under(path, folder):
                parts = os.path.relpath(path, folder).split(os.sep)
                for k in range(1, len(parts)):  # made 0755: a call's uid passes through to what is bound
                    command += ["--perms", "0755", "--dir", os.path.join(folder, *parts[:k])]
                if path != workdir:
                    command += ["--ro-bind", path, path]
    command += ["--bind", workdir, workdir, "--unshare-pid", "--unshare-ipc", "--die-with-parent",
                "--cap-drop", "ALL"]
    for cap in WORKER_CAPS:
        command += ["--cap-add", cap]
    return command + ["--", *argv]


@functools.lru_cache(maxsize=None)
def _bwrap_problem(bwrap: str) -> str | None:
    """None if `bwrap` can start a process with view_command's options here, else its error (once per process)."""
    probe = view_command(tempfile.gettempdir(), Isolation("view"), [sys.executable, "-S", "-c", ""])
    try:
        done = subprocess.run([bwrap, *probe[1:]], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{bwrap} fails: {e}"
    if done.returncode != 0:
        return f"{bwrap} fails: {done.stderr.decode(errors='replace').strip()[:200] or done.returncode}"
    return None


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def probe_call_uid(uid: int, paths: list[str]) -> str | None:
    """Why a call of this (root) worker could not run as `uid` and read `paths`, found by a child that becomes
    `uid`; None if it can."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: become the calls' uid, then look
        problem = ""
        try:
            os.close(read_end)
            _become(uid)
            folder = _first_unreadable(paths)
            if folder is not None:
                problem = f"uid {uid} cannot read {folder}, where Python lives ({sys.base_prefix})"
        except BaseException as e:
            problem = f"this root process cannot give up root ({type(e).__name__}: {e}): give it CAP_SETUID, " \
                      f"CAP_SETGID and CAP_SETPCAP, or run the trainer as an ordinary user"
        with contextlib.suppress(BaseException):
            os.write(write_end, problem.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        found = f.read().decode()
    os.waitpid(pid, 0)
    return found or None


def _first_unreadable(paths: list[str]) -> str | None:
    for path in paths:
        parts = os.path.abspath(path).split(os.sep)
        for k in range(2, len(parts) + 1):
            folder = os.sep.join(parts[:k])
            if not os.access(folder, os.X_OK) or (k == len(parts) and not os.access(folder, os.R_OK)):
                return folder
    return None


def _become(uid: int) -> None:
    """Give up root for good: an empty capability bounding set, uid and gid `uid` with no groups, then no
    capability in any set (setuid empties the permitted and effective ones; capset the inheritable one)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT_CLEAR_ALL) failed")
    for cap in range(_last_capability() + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}) failed")
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    if libc.capset(ctypes.byref(header), (_CapData * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


@functools.lru_cache(maxsize=None)
def _last_capability() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def enter_sandbox(workdir: str, memory_mb: int | None, *, uid: int | None) -> None:
    """Give up what this worker can give up (the module docstring); raises OSError if a step fails. `uid`: the
    calls' uid (`call_uid`), required of root; None only for a worker that is not root (it keeps its uid)."""
    global _active
    os.chdir(workdir)
    if uid is not None:
        os.chown(workdir, uid, uid)
        _become(uid)
    if os.geteuid() == 0 or os.getuid() == 0:
        raise PermissionError("a sandboxed call must not run as root, and no uid was given to it")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if memory_mb is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # last: setuid above must not count against it
    _active = True


def in_sandbox() -> bool:
    """Whether this process is a sandboxed worker (enter_sandbox ran)."""
    return _active


@contextlib.contextmanager
def captured_output(max_bytes: int) -> Iterator[io.StringIO]:
    """Everything written to fd 1 and 2 (print, sys.stdout, os.write(1, ...)) while inside, in order.

    On exit the yielded StringIO holds the text (at most `max_bytes` bytes of it, decoded with
    replacement; `truncated` tells). Only for a sandboxed worker: fds 1 and 2 are the whole process's.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    sink = tempfile.TemporaryFile(dir=".")
    result = io.StringIO()
    try:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        stream = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            yield result
        with contextlib.suppress(OSError):
            stream.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        sink.seek(0)
        data = sink.read(max_bytes + 1)
        sink.close()
        result.truncated = len(data) > max_bytes  # type: ignore[attr-defined]
        result.write(data[:max_bytes].decode("utf-8", errors="replace"))
