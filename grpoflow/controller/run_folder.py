"""A run folder belongs to one run: a lock, the config the run was trained with, and fresh starts that do not mix.

`open_run_folder(cfg)` runs before anything is written (the config file, base_model/, the warm start), and:

- checks `trainer.output_dir` (not empty, not a file);
- takes an exclusive `fcntl.flock` on `<run folder>/run.lock` for the life of the run: a second run in the
  same folder is refused with the first one's pid, start time and host (the kernel drops the lock when the
  process ends, however it ends, so a crashed run never leaves a stale lock);
- removes temporary checkpoint folders (`checkpoints/.tmp-*`) that crashed runs left behind (it holds the lock,
  so no other run is writing one);
- for a fresh start (no checkpoint to resume: `trainer.resume=never`, or a folder without one) in a folder that
  holds an earlier run's outputs, moves them aside to `<run folder>/previous/<UTC time>/` (checkpoints,
  config.yaml, metrics and sample logs), so the new run never mixes with, prunes or is confused by the old one;
- for a resume, compares the settings that change training with those the checkpoint was written with (the
  checkpoint's own config.yaml, else the run folder's), and refuses with the list of differences unless
  `trainer.resume_config_changes=allow`. A config.yaml written by an older grpoflow, whose keys have moved since
  (config/moved.py: the flat multi-turn, agent and partial-rollout keys), is compared under the new names, with a
  warning.

`write_config(folder, cfg)` then writes `config.yaml` once all input checks have passed, and only on a fresh
start: a resume keeps the run's original config.yaml (each checkpoint holds the config it was written with).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpoflow.atomic_folder import TMP_PREFIX
from grpoflow.config import Config, ConfigError, to_yaml
from grpoflow.config.moved import translate_moved
from grpoflow.controller.checkpoint import CheckpointManager

log = logging.getLogger("grpoflow.run_folder")

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.yaml"
PREVIOUS = "previous"
# what an earlier run leaves that a fresh start must not mix with (base_model/ and sft_model/ are rebuilt in place)
RUN_OUTPUTS = ("checkpoints", CONFIG_FILE, "metrics.jsonl", "samples.jsonl", "train_samples.jsonl", "restarts.jsonl")
# settings that control the run around training, not what it trains: free to change on resume (ray, backend and
# resources: where ranks run, not what they compute)
RUN_CONTROLS = ("trainer.output_dir", "trainer.resume", "trainer.resume_config_changes", "trainer.total_steps",
                "trainer.val_every", "trainer.val_before_train", "trainer.log_every", "trainer.loggers",
                "trainer.project", "trainer.run_name", "trainer.log_samples", "trainer.log_train_every",
                "trainer.log_train_groups", "trainer.save_every", "trainer.keep_last", "trainer.max_restarts",
                "trainer.threads", "data.val_files", "data.val_max_prompts", "model.gguf_cache_dir",
                "rollout.val_temperature", "rollout.val_n", "rollout.val_batch_size", "rollout.sync_timeout_s", "ray",
                "backend", "resources", "reward.judge.api_key_env")


@dataclass
class RunFolder:
    """An open, locked run folder; `resume` is the checkpoint the run continues from (None: a fresh start)."""

    path: Path
    resume: Path | None
    _lock_fd: int
    resumed_compute_dtype: str | None = None  # model.compute_dtype=auto resumed from a run that computed in another


    def close(self) -> None:
        """Release the lock (also released by the kernel when the process ends)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_run_folder(cfg: Config, *, auto_dtype: bool = False) -> RunFolder:
    """Check, lock and prepare `trainer.output_dir` (module docstring); raises ConfigError naming the fix.
    `auto_dtype`: the command asked model.compute_dtype=auto (`cfg` holds what it resolved to here), so a run
    saved with the other dtype (auto on another machine kind) resumes (`check_resume_config`)."""
    path = checked_output_dir(cfg.trainer.output_dir)
    path.mkdir(parents=True, exist_ok=True)
    fd = _lock(path)
    try:
        checkpoints = CheckpointManager(path)
        for leftover in checkpoints.root.glob(f"{TMP_PREFIX}*") if checkpoints.root.exists() else []:
            shutil.rmtree(leftover, ignore_errors=True)
        resume = checkpoints.resolve(cfg.trainer.resume)
        resumed_dtype = None
        if resume is None:
            _move_aside(path)
        else:
            resumed_dtype = check_resume_config(cfg, resume, auto_dtype=auto_dtype)
    except BaseException:
        os.close(fd)
        raise
    return RunFolder(path, resume, fd, resumed_dtype)


def checked_output_dir(output_dir: str) -> Path:
    """`trainer.output_dir` as a Path, if it can be a run folder; ConfigError otherwise."""
    if not str(output_dir).strip():
        raise ConfigError("trainer.output_dir is empty; give a folder for the run, e.g. trainer.output_dir=runs/my_run "
                          "(an empty value would write the run into the current directory).")
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"trainer.output_dir={output_dir} is a file, not a folder; give a folder for the run.")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(f"trainer.output_dir={output_dir}: {blocking} is a file, so the folder cannot be made; "
                          f"give another trainer.output_dir.")
    return path


def _lock(path: Path) -> int:
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "a process that wrote no details yet"
        os.close(fd)
        raise ConfigError(f"trainer.output_dir={path} is in use by another run ({holder}); two runs in one folder "
                          f"would mix their metrics and checkpoints. Wait for it to end, stop it, or give this run "
                          f"another trainer.output_dir.") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {_utc_now()}\n".encode(), 0)
    return fd


def _move_aside(path: Path) -> None:
    """Move an earlier run's outputs to previous/<UTC time>/ before a fresh start (nothing is deleted)."""
    if not any((path / name).exists() for name in ("checkpoints", "metrics.jsonl")):
        return  # no RL run was here (at most a `grpoflow sft` warm start, which a run reuses)
    found = [name for name in RUN_OUTPUTS if (path / name).exists()]
    target = path / PREVIOUS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    suffix = 1
    while target.exists():
        target = target.with_name(f"{target.name.split('-')[0]}-{suffix}")
        suffix += 1
    target.mkdir(parents=True)
    for name in found:
        os.replace(path / name, target / name)
    log.warning("this run starts at step 0 in %s, which holds an earlier run's %s: moved to %s (nothing deleted).",
                path, ", ".join(found), target)


def check_resume_config(cfg: Config, checkpoint: Path, *, auto_dtype: bool = False) -> str | None:
    """Refuse (or, with trainer.resume_config_changes=allow, warn about) training settings that differ from the
    config `checkpoint` was written with. With `auto_dtype` (the command asked model.compute_dtype=auto), a saved
    compute dtype other than the one auto resolved to here is no refusal: the run goes on in this machine's
    dtype, with a warning; that saved dtype is returned (None: no such change)."""
    saved_file = checkpoint / CONFIG_FILE
    if not saved_file.exists():
        saved_file = checkpoint.parent.parent / CONFIG_FILE
    if not saved_file.exists():
        log.warning("resuming from %s without the config it was written with (no %s); settings are not compared.",
                    checkpoint, CONFIG_FILE)
        return None
    try:
        saved = yaml.safe_load(saved_file.read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read {saved_file}, the config of the run to resume ({e}); restore it, or set "
                          f"trainer.resume_config_changes=allow to resume without comparing settings.") from None
    moved = translate_moved(saved)
    if moved:
        log.warning("%s was written by an older grpoflow whose multi-turn, agent and partial-rollout keys have since "
                    "moved into the sections rollout.multi_turn, rollout.agent and rollout.partial; resuming, "
                    "comparing them under their new names "
                    "(%s). The file is left as it is; new commands take the new names.", saved_file, ", ".join(moved))
    changes = config_changes(_flat(saved), _flat(cfg.to_dict()))
    resumed_dtype = None
    dtype_change = next((c for c in changes if c.startswith("model.compute_dtype: ")), None)
    if auto_dtype and dtype_change is not None:
        changes.remove(dtype_change)
        resumed_dtype = _flat(saved)["model.compute_dtype"]
        log.warning("model.compute_dtype=auto resolves to %s on this machine, and the run in %s computed in %s "
                    "(auto on another machine kind): it resumes in %s. The resumed run is not promised to equal one "
                    "that stayed on one machine kind (set model.compute_dtype=%s to keep the run's dtype).",
                    cfg.model.compute_dtype, checkpoint, resumed_dtype, cfg.model.compute_dtype, resumed_dtype)
    if not changes:
        return resumed_dtype
    listed = "; ".join(changes)
    if cfg.trainer.resume_config_changes == "allow":
        log.warning("resuming from %s with changed settings (trainer.resume_config_changes=allow): %s",
                    checkpoint, listed)
        return resumed_dtype
    raise ConfigError(f"resuming from {checkpoint} with settings that change training from those it was written "
                      f"with ({saved_file}): {listed}. Resume with the same settings, start a new run "
                      f"(another trainer.output_dir, or trainer.resume=never), or set "
                      f"trainer.resume_config_changes=allow if you mean to change them.")


def config_changes(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old -> new` for each training setting that differs (keys in RUN_CONTROLS are skipped)."""
    keys = sorted(set(saved) | set(new))
    missing = object()
    out = []
    for key in keys:
        if any(key == c or key.startswith(c + ".") for c in RUN_CONTROLS):
            continue
        old, value = saved.get(key, missing), new.get(key, missing)
        if old is missing or value is missing:
            continue  # a key added or removed by another grpoflow version: not a user's change
        if old != value:
            out.append(f"{key}: {old!r} -> {value!r}")
    return out


def write_config(folder: RunFolder, cfg: Config) -> None:
    """config.yaml of a fresh start (a resume keeps the run's original one)."""
    if folder.resume is None:
        (folder.path / CONFIG_FILE).write_text(to_yaml(cfg))


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and prefix.count(".") < 2:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
