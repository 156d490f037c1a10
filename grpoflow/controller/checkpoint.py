"""Atomic checkpoints: written aside, renamed into place, `latest` updated last.

Layout of `<run_dir>/checkpoints/`:

    step_000050/
      actor/            HF folder (config, safetensors weights, tokenizer) + optimizer.pt
      critic/           the same for the critic, when there is one
      controller.pt     step, sampler position, KL controller, weight version, RNG states
    latest              the name of the newest complete checkpoint

A crash at any moment leaves either the previous checkpoint or the new one complete: the new
folder is written as `.tmp-step_000050` and only renamed when every file is on disk, and
`latest` is replaced (write-then-rename) after that. Loading uses safe formats only:
safetensors for weights and `torch.load(weights_only=True)` for optimizer and controller state.

Storage faults. A write that fails (a full disk, no permission) removes its temporary folder and
raises CheckpointWriteError naming the folder, the cause and the free space; the previous
checkpoint and `latest` are untouched. Each checkpoint lists its files and their sizes in
`manifest.json`; at resume a folder with a missing or truncated file or an unreadable
controller.pt is skipped with a warning, and the one before it is used.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from grpoflow.distributed.worker_group import WorkerError

LATEST = "latest"
MANIFEST = "manifest.json"

log = logging.getLogger("grpoflow.checkpoint")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the previous one and `latest` are unchanged."""


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


class CheckpointManager:
    def __init__(self, run_dir: str | Path, keep_last: int = 0) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call write(folder) on a temporary folder, then publish it as step `step`.

        Any failure on the way (write's own, or the file system's) removes the temporary folder, so a full
        disk gets its space back, and raises CheckpointWriteError; `latest` moves only after a complete write."""
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            write(tmp)
            _write_manifest(tmp)
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            _atomic_write_text(self.root / LATEST, final.name)
        except WorkerError:  # a rank died or hung while saving: not a storage fault (a restart may cure it)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)  # best effort: the error below is what the user sees
            with contextlib.suppress(OSError):
                (self.root / f"{LATEST}.tmp").unlink(missing_ok=True)
            raise CheckpointWriteError(self._write_failure(final, e)) from e
        self._prune()
        return final

    def _write_failure(self, final: Path, error: BaseException) -> str:
        existing = next(p for p in (self.root, *self.root.parents) if p.exists())
        usage = shutil.disk_usage(existing)
        previous = self.latest()
        kept = (f"the previous checkpoint {previous} and `latest` are unchanged, and the same command resumes from "
                f"it" if previous else "no earlier checkpoint exists, so a rerun starts from step 0")
        fix = (f"make {self.root} writable for this user" if isinstance(error, PermissionError) else
               "free space (or lower trainer.keep_last), or set trainer.output_dir to a disk with room")
        return (f"could not write the checkpoint {final}: {type(error).__name__}: {error}. The disk holding "
                f"{existing} has {_gib(usage.free)} free of {_gib(usage.total)}. To go on, {fix}; {kept}.")

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None: the one `latest` names, else the newest folder.

        A folder that fails `problem()` is skipped with a warning and the one before it is tried."""
        if not self.root.exists():
            return None
        folders = sorted((p for p in self.root.glob("step_*") if p.is_dir()), reverse=True)
        pointer = self.root / LATEST
        if pointer.exists():
            named = pointer.read_text().strip()
            if not (self.root / named).is_dir():
                log.warning("%s names %s, which does not exist; taking the newest checkpoint folder before it.",
                            pointer, named)
            # Folders newer than the pointer are not trusted: a run with trainer.resume=never leaves them behind.
            folders = [p for p in folders if p.name <= named]
        for folder in folders:
            why = problem(folder)
            if why is None:
                return folder
            log.warning("skipping the checkpoint %s: %s; falling back to the one before.", folder, why)
        return None

    def resolve(self, resume: str) -> Path | None:
        """`trainer.resume`: auto (the latest, if any), never, or a checkpoint folder."""
        if resume == "never":
            return None
        if resume == "auto":
            return self.latest()
        path = Path(resume)
        if not (path / "controller.pt").exists():
            raise FileNotFoundError(f"trainer.resume={resume}: not a checkpoint folder (no controller.pt); give a "
                                    f"folder such as {self.root / step_dir_name(50)}, or auto / never.")
        why = problem(path)
        if why is not None:
            raise ValueError(f"trainer.resume={resume}: the checkpoint is damaged ({why}); give an earlier one, or "
                             f"trainer.resume=auto to take the newest complete checkpoint of the run folder.")
        return path

    def _prune(self) -> None:
        if self.keep_last <= 0:
            return
        for old in sorted(p for p in self.root.glob("step_*") if p.is_dir())[:-self.keep_last]:
            shutil.rmtree(old)


def problem(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint, or None. Cheap: sizes against the manifest (a missing or
    truncated file) and controller.pt loaded; the weights are read only when the checkpoint is loaded."""
    manifest = folder / MANIFEST
    if manifest.exists():
        try:
            sizes = json.loads(manifest.read_text())
        except (OSError, ValueError) as e:
            return f"{MANIFEST} cannot be read ({e})"
        for name, size in sizes.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} holds {path.stat().st_size} bytes, {size} were written (truncated or overwritten)"
    elif not (folder / "actor").is_dir():  # a checkpoint written before manifests existed
        return "actor/ is missing"
    try:
        load_state(folder / "controller.pt")
    except Exception as e:  # any way of failing to unpickle (a missing file, zip damage, wrong content)
        return f"controller.pt cannot be read ({type(e).__name__}: {str(e).split('. ')[0]})"  # torch's advice is long
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
    return torch.load(path, weights_only=True)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_manifest(folder: Path) -> None:
    sizes = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / MANIFEST).write_text(json.dumps(sizes, indent=1))


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
