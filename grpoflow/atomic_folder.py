"""Folders published whole: written aside, listed with checksums in manifest.json, renamed into place.

Both the run's step checkpoints (controller/checkpoint.py) and `grpoflow serve tinker`'s saved states
(tinker_server/) are folders that a crash must never leave half-written under their final name. The pieces both
use live here, below both of them; standard library only.

- `publish_folder(final, write)`: write a temporary folder beside `final`, list its files in `manifest.json`
  (size + SHA-256), fsync, then replace-then-remove; `recover_folders(parent)` finishes or undoes what a kill
  interrupted.
- `against_manifest(folder)` / `damaged_file(folder)`: the first missing, truncated or changed file.
- `kept_or_published(final, write, what)`: a run's built model folders (base_model/, sft_model/): reused when they
  match their manifest, rebuilt with a warning when damaged.
- `copy_contents(source, dest)`: a folder's files as plain contents, writable whatever the source's modes.
- `write_manifest`, `fsync_tree`, `atomic_write_text`: the steps, for writers with their own rename rules
  (CheckpointManager keeps a `latest` pointer beside its folders).

A temporary name is `.tmp-<name>-<pid>-<random>`: a name no other process uses, and one that run-folder readers
skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
import logging
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
OLD_SUFFIX = ".old"  # publish_folder: the folder it replaces, set aside until the new one is in place
log = logging.getLogger("grpoflow.folders")


def temporary_name(final: Path) -> Path:
    """A name beside `final` that no other process uses: `.tmp-<name>-<pid>-<random>`."""
    return final.with_name(f"{TMP_PREFIX}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def publish_folder(final: Path, write: Callable[[Path], object]) -> Path:
    """Call write(folder) on a temporary folder beside `final`, list its files in manifest.json, fsync them, then
    put it in place of `final`: replace-then-remove, never remove-then-replace. An older `final` is renamed aside
    (`.tmp-<name>-...old`), the new folder renamed in, and only then the old one removed, so a kill at any
    moment leaves a complete folder under the final name or aside, which `recover_folders` puts back. For
    folders other than a run's step checkpoints (grpoflow serve tinker's saved states); a failed write removes
    the temporary folder and raises what writing raised."""
    tmp = temporary_name(final)
    old = tmp.with_name(tmp.name + OLD_SUFFIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(tmp)
        write_manifest(tmp)
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old.exists() and not final.exists():
            os.replace(old, final)  # put the old one back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def kept_or_published(final: Path, write: Callable[[Path], object], what: str,
                      legacy: Callable[[Path], bool] | None = None) -> Path:
    """`final` as it is when its files match its manifest (SHA-256 included); else written by `publish_folder`.
    A folder that no longer matches (a file changed in place, truncated or missing) is rebuilt with a warning
    naming `what` and the file. `legacy(final)`: whether a folder without a manifest, written before they were kept,
    is taken as it is (it cannot be checked)."""
    if (final / MANIFEST).exists():
        wrong = damaged_file(final)
        if wrong is None:
            return final
        log.warning("%s %s is damaged (%s); it is built again.", what, final, wrong)
    elif final.exists() and legacy is not None and legacy(final):
        return final
    return publish_folder(final, write)


def copy_contents(source: Path, dest: Path) -> None:
    """Copy every file under `source` into `dest` as plain contents: new files and folders with this process's
    default modes, so a copy of a read-only install (0444 files, 0555 folders) is writable and deletable."""
    for path in sorted(source.rglob("*")):
        target = dest / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def recover_folders(parent: Path) -> int:
    """Finish or undo the `publish_folder` calls in `parent` that a kill interrupted: an old folder set aside
    whose new one never arrived goes back under its name, every other `.tmp-` leftover (an unfinished new
    folder, an old one already replaced) is removed. How many leftovers there were. Call it before anything
    else uses `parent` (at a server's start)."""
    leftovers = sorted(parent.glob(f"{TMP_PREFIX}*"))
    for path in leftovers:
        if path.name.endswith(OLD_SUFFIX):
            name = path.name[len(TMP_PREFIX):-len(OLD_SUFFIX)].rsplit("-", 2)[0]
            final = parent / name
            if not final.exists() and damaged_file(path) is None:
                os.replace(path, final)
                continue
        shutil.rmtree(path, ignore_errors=True)
    return len(leftovers)


def damaged_file(folder: Path) -> str | None:
    """What is wrong with a folder `publish_folder` wrote (a missing, truncated or changed file against its
    manifest, SHA-256 included), or None."""
    return against_manifest(folder, verify=True)


def against_manifest(folder: Path, *, verify: bool) -> str | None:
    """The first file of `folder` that is missing, truncated or (with `verify`) changed against its manifest."""
    try:
        files = _manifest_entries(json.loads((folder / MANIFEST).read_text()))
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        return f"{MANIFEST} cannot be read ({e!r})"
    for name, (size, digest) in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} holds {path.stat().st_size} bytes, {size} were written (truncated or overwritten)"
        if verify and digest is not None and _sha256(path) != digest:
            return f"{name} does not match its checksum in {MANIFEST} (damaged in place)"
    return None


def _manifest_entries(data: dict) -> dict[str, tuple[int, str | None]]:
    """name -> (size, sha256 or None) of a manifest: {"files": {name: {size, sha256}}}, or an older {name: size}."""
    if "files" in data and isinstance(data["files"], dict):
        return {name: (int(e["size"]), str(e["sha256"])) for name, e in data["files"].items()}
    return {name: (int(size), None) for name, size in data.items()}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """List every file of `folder` (relative path -> size, SHA-256) in its manifest.json."""
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text`: written and fsynced under a temporary name, then renamed."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_tree(folder: Path) -> None:
    """Put every file under `folder` on disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def fsync_dir(folder: Path) -> None:
    """Make the renames inside `folder` durable (a directory fsync; skipped where the OS cannot)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
