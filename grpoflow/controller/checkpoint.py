"""Atomic checkpoints: written aside, renamed into place, `latest` updated last.

Layout of `<run_dir>/checkpoints/`:

    step_000050/
      actor/            HF folder (config, safetensors weights, tokenizer) + optimizer.pt
      critic/           the same for the critic, when there is one
      controller.pt     step, sampler position, KL controller, weight version, RNG states
    latest              the name of the newest complete checkpoint

A crash at any moment leaves either the previous checkpoint or the new one complete: the new folder is written as
`.tmp-step_000050-<pid>-<random>` (a name no other process uses) and only renamed when every file is on disk, and
`latest` is replaced (write-then-rename) after that. Loading uses safe formats only: safetensors for weights and
`torch.load(weights_only=True)` for optimizer and controller state.

Storage faults. A write that fails (a full disk, no permission, a file over the process's file-size limit)
removes its temporary folder and raises CheckpointWriteError naming the folder, the cause and the free space
(for EFBIG, the file-size limit, `ulimit -f`, instead of the disk); the previous checkpoint and `latest` are
untouched. Each checkpoint lists its files with their sizes and
SHA-256 checksums in `manifest.json`. Choosing a checkpoint to resume (`latest(verify=True)`, also
for `grpoflow export`) skips, with a warning, a folder with a missing, truncated or changed file
(a checksum that differs: flipped bits, random bytes, a damaged safetensors header) or an
unreadable controller.pt, and takes the one before it. A `latest` pointer that names no
checkpoint folder (empty, garbage) is not trusted either: the newest valid folder is used, with
a warning. Pruning (`keep_last`) counts steps, not names, and never removes the folder just written.

The writing steps (temporary name, manifest, fsync, the pointer's atomic write) are grpoflow/atomic_folder.py's,
shared with `grpoflow serve tinker`'s saved states.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from grpoflow.atomic_folder import (MANIFEST, against_manifest, atomic_write_text, fsync_tree, temporary_name,
                                    write_manifest)
from grpoflow.distributed.worker_group import WorkerError
from grpoflow.errors import UserError, UserFileNotFoundError
from grpoflow.training.engine import load_tensor_file

LATEST = "latest"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")

log = logging.getLogger("grpoflow.checkpoint")


RESCANS = 5         # latest(): how often the folders are listed again when one vanishes while it is checked
VANISHED = object()


class CheckpointStateError(UserError):
    """A checkpoint's controller state that this run cannot take (edited, or written for other data)."""


def restore_queue(queue: Any, state: dict, path: Path) -> None:
    """`queue.load_state_dict` with the rollout state that controller.pt (`path`) holds: the sampler's position and
    the steps or partial-rollout groups in flight. A state that does not fit is one CheckpointStateError, not a
    traceback from deep inside the queue (a UserError it raises, e.g. data of another size, passes as it is)."""
    try:
        queue.load_state_dict(state["sampler"], state["step"], state.get("in_flight"))
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise CheckpointStateError(
            f"{path} holds a rollout state (the sampler's position, the steps or partial-rollout groups in flight) "
            f"that this run cannot take ({type(e).__name__}: {e}): it was edited, or written by another version; "
            "resume from another checkpoint (trainer.resume=<its folder>) or start over (trainer.resume=never)."
        ) from None


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the previous one and `latest` are unchanged."""


def too_large(error: BaseException | None) -> bool:
    """The error (or one it came from) is EFBIG: a file over the file-size limit, which libraries that wrap the
    OS error (safetensors: "File too large (os error 27)") report in their own words."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno == errno.EFBIG:
            return True
        if "File too large" in str(error) or "FileTooLarge" in str(error):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def file_size_limit() -> int | None:
    """This process's RLIMIT_FSIZE in bytes (`ulimit -f`), None when unlimited or unknown."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def fail_writes_past_the_file_size_limit() -> None:
    """Under a file-size limit (`ulimit -f`) the kernel kills a process that writes past it (SIGXFSZ) before it can
    say anything; with the signal ignored the write fails with EFBIG instead, which the checkpoint error names.
    Called once by `grpoflow train` (main thread); nothing changes without a limit."""
    import signal
    import threading

    if file_size_limit() is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def step_of(folder: Path) -> int:
    """The step of a checkpoint folder `.../step_NNNNNN`; ValueError for another name."""
    match = _STEP_DIR.match(folder.name)
    if match is None:
        raise ValueError(f"{folder} is not a checkpoint folder (step_NNNNNN).")
    return int(match[1])


class CheckpointManager:
    def __init__(self, run_dir: str | Path, keep_last: int = 0) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call write(folder) on a temporary folder, then publish it as step `step`.

        Any failure on the way (write's own, or the file system's) removes the temporary folder, so a full
        disk gets its space back, and raises CheckpointWriteError; `latest` moves only after a complete write."""
        final = self.root / step_dir_name(step)
        tmp = temporary_name(final)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            write(tmp)
            write_manifest(tmp)
            fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            atomic_write_text(self.root / LATEST, final.name)
        except WorkerError:  # a rank died or hung while saving: not a storage fault (a restart may cure it)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)  # best effort: the error below is what the user sees
            with contextlib.suppress(OSError):
                for leftover in self.root.glob(f"{LATEST}.tmp-{os.getpid()}-*"):
                    leftover.unlink(missing_ok=True)
            raise CheckpointWriteError(self._write_failure(final, e)) from e
        self._prune(keep=final)
        return final

    def _write_failure(self, final: Path, error: BaseException) -> str:
        existing = next(p for p in (self.root, *self.root.parents) if p.exists())
        usage = shutil.disk_usage(existing)
        previous = self.latest()
        kept = (f"the previous checkpoint {previous} and `latest` are unchanged, and the same command resumes from "
                f"it" if previous else "no earlier checkpoint exists, so a rerun starts from step 0")
        space = f"The disk holding {existing} has {_gib(usage.free)} free of {_gib(usage.total)}"
        if too_large(error):
            limit = file_size_limit()
            where = (f"but this process may write no file over {limit} bytes (its file-size limit: ulimit -f, "
                     "RLIMIT_FSIZE)" if limit is not None else "but its file system takes no file this large")
            fix = ("raise the limit (ulimit -f unlimited) in the shell that starts grpoflow" if limit is not None else
                   "set trainer.output_dir to a file system without that limit")
            return (f"could not write the checkpoint {final}: {type(error).__name__}: {error}. {space}, {where}. "
                    f"To go on, {fix}; {kept}.")
        fix = (f"make {self.root} writable for this user" if isinstance(error, PermissionError) else
               "free space (or lower trainer.keep_last), or set trainer.output_dir to a disk with room")
        return (f"could not write the checkpoint {final}: {type(error).__name__}: {error}. {space}. To go on, {fix}; "
                f"{kept}.")

    def folders(self) -> list[Path]:
        """The step_NNNNNN folders, newest step first (by number, not by name)."""
        if not self.root.exists():
            return []
        found = [(int(m[1]), p) for p in self.root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
        return [p for _, p in sorted(found, reverse=True)]

    def latest(self, *, verify: bool = False) -> Path | None:
        """The newest complete checkpoint, or None: the one `latest` names, else the newest folder.

        A folder that fails `problem()` (with `verify`: also its checksums) is skipped with a warning and
        the one before it is tried. A pointer that names no checkpoint folder is ignored, with a warning. A folder
        that disappears while it is checked was pruned by the run writing a newer one (`trainer.keep_last`; a
        `grpoflow export` beside a run): the folders are listed again, not skipped."""
        for _ in range(RESCANS):
            found = self._latest(verify)
            if found is not VANISHED:
                return found  # type: ignore[return-value]  # a Path or None
        return None

    def _latest(self, verify: bool) -> Path | None | object:
        """latest()'s one pass over the folders; VANISHED when one was removed while it was checked."""
        folders = self.folders()
        pointer = self.root / LATEST
        named = _read_pointer(pointer)
        if named is not None and named in {p.name for p in folders}:
            # Folders newer than the pointer are not trusted: a write that crashed between rename and pointer.
            folders = folders[[p.name for p in folders].index(named):]
        elif pointer.exists():
            log.warning("%s holds %r, which is not a checkpoint folder of %s; taking the newest valid checkpoint "
                        "folder instead.", pointer, named if named is not None else "unreadable bytes", self.root)
        for folder in folders:
            why = problem(folder, verify=verify)
            if why is None:
                return folder
            if not folder.exists():
                return VANISHED
            log.warning("skipping the checkpoint %s: %s; falling back to the one before.", folder, why)
        return None

    def resolve(self, resume: str) -> Path | None:
        """`trainer.resume`: auto (the latest, if any), never, or a checkpoint folder."""
        if resume == "never":
            return None
        if resume == "auto":
            return self.latest(verify=True)
        path = Path(resume)
        if not (path / "controller.pt").exists():
            raise UserFileNotFoundError(f"trainer.resume={resume}: not a checkpoint folder (no controller.pt); give a "
                                        f"folder such as {self.root / step_dir_name(50)}, or auto / never.")
        why = problem(path, verify=True)
        if why is not None:
            raise UserError(f"trainer.resume={resume}: the checkpoint is damaged ({why}); give an earlier one, or "
                            f"trainer.resume=auto to take the newest complete checkpoint of the run folder.")
        return path

    def _prune(self, keep: Path) -> None:
        """Remove all but the newest `keep_last` step folders; never `keep`, the one just written."""
        if self.keep_last <= 0:
            return
        for old in self.folders()[self.keep_last:]:
            if old != keep:
                shutil.rmtree(old)


def problem(folder: Path, *, verify: bool = False) -> str | None:
    """Why `folder` is not a complete checkpoint, or None. Sizes against the manifest (a missing or truncated
    file) and controller.pt loaded; with `verify`, every file's SHA-256 against the manifest too (it reads the
    whole checkpoint: done for the one that is loaded or exported)."""
    if (folder / MANIFEST).exists():
        wrong = against_manifest(folder, verify=verify)
        if wrong is not None:
            return wrong
    elif not (folder / "actor").is_dir():  # a checkpoint written before manifests existed
        return "actor/ is missing"
    try:
        load_state(folder / "controller.pt")
    except Exception as e:  # any way of failing to unpickle (a missing file, zip damage, wrong content)
        return f"controller.pt cannot be read ({type(e).__name__}: {str(e).split('. ')[0]})"  # torch's advice is long
    return None


def _read_pointer(pointer: Path) -> str | None:
    """The folder name `latest` holds, or None if it is missing or not text."""
    try:
        return pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def save_state(obj: dict, path: Path) -> None:
    torch.save(obj, path)


def load_state(path: Path) -> dict:
    return load_tensor_file(path)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
