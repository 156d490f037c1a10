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
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

LATEST = "latest"


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


class CheckpointManager:
    def __init__(self, run_dir: str | Path, keep_last: int = 0) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call write(folder) on a temporary folder, then publish it as step `step`."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        write(tmp)
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _atomic_write_text(self.root / LATEST, final.name)
        self._prune()
        return final

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        pointer = self.root / LATEST
        if pointer.exists():
            path = self.root / pointer.read_text().strip()
            if path.is_dir():
                return path
        complete = sorted(p for p in self.root.glob("step_*") if p.is_dir()) if self.root.exists() else []
        return complete[-1] if complete else None

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
        return path

    def _prune(self) -> None:
        if self.keep_last <= 0:
            return
        for old in sorted(p for p in self.root.glob("step_*") if p.is_dir())[:-self.keep_last]:
            shutil.rmtree(old)


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


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
