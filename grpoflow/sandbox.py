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
- running as root, it becomes `nobody` (uid/gid 65534, no supplementary groups), so it cannot raise its own
  hard limits, read root-only files or signal the trainer (where the container allows setuid; else it stays
  root, and RLIMIT_NPROC, which root ignores, does not stop forks). Not where `nobody` cannot read Python
  itself (`unreadable_for_nobody`: e.g. an interpreter under /root): there it stays root, with every other
  limit, and the pool says so once, naming the directory and the fix;
- `PR_SET_NO_NEW_PRIVS`: no setuid binary or file capability can give privileges back;
- hard limits: RLIMIT_AS (`memory_mb`, soft = hard, so the code cannot raise it), RLIMIT_NPROC = 0 (no
  fork, no new thread: nothing it starts can leave its process group or outlive it), RLIMIT_FSIZE
  (`MAX_FILE_BYTES` per file written), RLIMIT_CORE = 0.

What it does not stop: reading world-readable files, the network, spending its CPU until the per-call
timeout, writing many files up to MAX_FILE_BYTES each in its folder. docs/multi-turn.md says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import resource
import signal
import struct
import sys
import sysconfig
import tempfile
from typing import Any, Iterator

HEADER = struct.Struct("!I")
MAX_REPLY_BYTES = 64 * 2**20   # a longer reply frame is a protocol violation (the worker is killed)
MAX_FILE_BYTES = 64 * 2**20    # RLIMIT_FSIZE of a sandboxed worker: its captured output counts too
NOBODY = 65534
_PR_SET_NO_NEW_PRIVS = 38
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


def unreadable_for_nobody(paths: list[str]) -> str | None:
    """The first directory of `paths` (or above one) that `nobody` cannot read, found by a child that becomes
    `nobody`; None when every one is readable, or when this process is not root or cannot change its uid."""
    if os.geteuid() != 0:
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: become nobody, then look
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write_end, (_first_unreadable(paths) or "").encode())
        except BaseException:  # cannot change uid (a container): nothing to report
            pass
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


def enter_sandbox(workdir: str, memory_mb: int | None, *, drop_uid: bool = True) -> None:
    """Give up what this worker can give up (the module docstring); raises OSError if a step fails. `drop_uid`
    False: stay root (where `nobody` could not read Python itself), with every other limit."""
    global _active
    os.chdir(workdir)
    if os.geteuid() == 0 and drop_uid:
        try:
            os.chown(workdir, NOBODY, NOBODY)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        except PermissionError:  # root without CAP_SETUID/CAP_SETGID (some containers): keep the rest
            pass
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
