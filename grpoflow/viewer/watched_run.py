"""Reading a run folder while a run may be writing it: JSON-lines files followed by offset, the rollouts of a
step grouped, and the run's facts (config, schedule, checkpoints, restarts).

Nothing here imports torch or the training code: `grpoflow view` starts in well under a second and can look at
a run that another process is training. The file names are the ones the run writes
(tests/unit/test_viewer_routes.py checks them against the controller's).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from grpoflow.config.moved import translate_moved
from grpoflow.errors import UserFileNotFoundError
from grpoflow.metrics_file import METRICS, metrics_record, warn_skipped

VAL_SAMPLES = "samples.jsonl"
TRAIN_SAMPLES, RESTARTS = "train_samples.jsonl", "restarts.jsonl"
CONFIG, CHECKPOINTS, LATEST, MANIFEST = "config.yaml", "checkpoints", "latest", "manifest.json"


@dataclass
class JsonlFile:
    """The complete lines of a JSON-lines file, read again only from where the last read stopped.

    A file that shrank or was replaced (a resumed run rewrites metrics.jsonl and train_samples.jsonl) is read
    from the start, and `generation` counts those restarts, so a client that asked from an offset knows to
    drop what it had. A half-written last line waits for the next read. `parse` says what a record is (None:
    skip the line); `on_skipped(path, line number, line)` hears of each non-blank line skipped (metrics.jsonl:
    metrics_file's rule and warning, those of every reader of it)."""

    path: Path
    parse: Callable[[bytes], dict | None] = field(default=lambda line: _record(line))
    on_skipped: Callable[[Path, int, bytes], None] | None = None
    records: list[dict] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)   # byte offset where each record's line ends
    generation: int = 0
    _identity: tuple[int, int] | None = None
    _read_to: int = 0
    _lines: int = 0                                    # complete lines read so far

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self.records or self._read_to:
                self._reset(None)
            return
        identity = (st.st_ino, st.st_dev)
        if identity != self._identity or st.st_size < self._read_to:
            self._reset(identity)
        if st.st_size == self._read_to:
            return
        with open(self.path, "rb") as f:
            f.seek(self._read_to)
            chunk = f.read(st.st_size - self._read_to)
        end = chunk.rfind(b"\n") + 1
        at = self._read_to
        for line in chunk[:end].split(b"\n")[:-1]:
            at += len(line) + 1
            self._lines += 1
            record = self.parse(line)
            if record is not None:  # a damaged line or one that is not an object (`3`, `[]`) is skipped
                self.records.append(record)
                self.offsets.append(at)
            elif self.on_skipped is not None and line.strip():
                self.on_skipped(self.path, self._lines, line)
        self._read_to += end

    def _reset(self, identity: tuple[int, int] | None) -> None:
        self.records, self.offsets, self._read_to, self._identity, self._lines = [], [], 0, identity, 0
        self.generation += 1

    def since(self, count: int, generation: int) -> tuple[list[dict], bool]:
        """Records after the first `count` (all of them, and reset=True, if the file was rewritten since
        `generation`)."""
        self.refresh()
        if generation != self.generation:
            return list(self.records), True
        return self.records[count:], False


def _record(line: bytes) -> dict | None:
    """A JSON-lines line as a record: a JSON object (None: blank, damaged, or not an object)."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class StepIndex:
    """Where each step's records of a JSON-lines file are (byte ranges), so that one step's records are read without
    holding the file: train_samples.jsonl holds every logged group of a run and may be larger than memory. Read on
    from where the last read stopped, in blocks; a file that shrank or was replaced is indexed again."""

    path: Path
    spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)   # step -> [(offset, length)]
    block: int = 1 << 20
    _identity: tuple[int, int] | None = None
    _read_to: int = 0

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.spans, self._read_to, self._identity = {}, 0, None
            return
        identity = (st.st_ino, st.st_dev)
        if identity != self._identity or st.st_size < self._read_to:
            self.spans, self._read_to, self._identity = {}, 0, identity
        with open(self.path, "rb") as f:
            f.seek(self._read_to)
            remaining, carry = st.st_size - self._read_to, b""
            while remaining > 0:
                chunk = f.read(min(self.block, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                lines = (carry + chunk).split(b"\n")
                carry = lines.pop()  # a line not complete yet (in this block, or still being written)
                for line in lines:
                    record = _record(line)
                    step = record.get("step") if record is not None else None
                    if isinstance(step, int) and not isinstance(step, bool):
                        self.spans.setdefault(step, []).append((self._read_to, len(line)))
                    self._read_to += len(line) + 1

    def steps(self) -> list[int]:
        self.refresh()
        return sorted(self.spans)

    def records(self, step: int) -> list[dict]:
        """The records of `step`, in file order."""
        self.refresh()
        out = []
        with open(self.path, "rb") as f:
            for offset, length in self.spans.get(step, []):
                f.seek(offset)
                record = _record(f.read(length))
                if record is not None:
                    out.append(record)
        return out


class WatchedRun:
    """One run folder's files, each followed as the run writes it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise UserFileNotFoundError(f"run folder {str(path)!r} does not exist; give the trainer.output_dir of a "
                                        f"run (e.g. runs/default).")
        self.metrics = JsonlFile(self.path / METRICS, parse=metrics_record, on_skipped=warn_skipped)
        self.val_samples = JsonlFile(self.path / VAL_SAMPLES)
        self.train_samples = StepIndex(self.path / TRAIN_SAMPLES)
        self.restarts = JsonlFile(self.path / RESTARTS)

    @property
    def name(self) -> str:
        return self.path.name

    def rollout_steps(self) -> dict[str, list[int]]:
        """The steps that have rollouts to read: training groups and validation samples."""
        self.val_samples.refresh()
        return {"train": self.train_samples.steps(),
                "val": sorted({r["step"] for r in self.val_samples.records if isinstance(r.get("step"), int)})}

    def groups(self, kind: str, step: int) -> list[dict]:
        """The groups of `step`: training groups as written, or validation samples grouped by prompt."""
        if kind == "train":
            return [with_group_stats(r) for r in self.train_samples.records(step)]
        if kind == "val":
            self.val_samples.refresh()
            return validation_groups([r for r in self.val_samples.records if r.get("step") == step])
        raise ValueError(f"rollout kind {kind!r}: use train or val.")

    def facts(self) -> dict[str, Any]:
        """Config (text and parsed), schedule, progress, checkpoints, restarts, files."""
        self.metrics.refresh()
        self.restarts.refresh()
        config_text, config = read_config(self.path / CONFIG)
        trained = [r["step"] for r in self.metrics.records if "timing_s/step" in r]
        return {"name": self.name, "path": str(self.path), "config_text": config_text,
                "schedule": schedule_line(self.path / CONFIG), "summary": summary(config),
                "total_steps": (config.get("trainer") or {}).get("total_steps"),
                "last_step": max(trained, default=0), "steps_logged": len(trained),
                "last_write_s_ago": seconds_since_last_write(self.path),
                "checkpoints": checkpoints(self.path / CHECKPOINTS), "restarts": list(self.restarts.records),
                "files": files(self.path)}


def score_of(sample: dict) -> float | None:
    """A sample's score as a finite number, None where it has none (a record written by hand or by other tools)."""
    score = sample.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return None
    return float(score)


def with_group_stats(group: dict) -> dict:
    """The group with the mean and (population) standard deviation of its samples' scores. A group without a
    `samples` list is shown empty and a sample without a numeric score with none, each with a `note` saying so,
    instead of failing the page."""
    samples = group.get("samples")
    notes = []
    if not isinstance(samples, list):
        samples = []
        notes.append("this group's record has no `samples` list: nothing to show")
    samples = [{**s, "score": score_of(s)} for s in samples if isinstance(s, dict)]
    scores = [s["score"] for s in samples if s["score"] is not None]
    if len(scores) < len(samples):
        notes.append(f"{len(samples) - len(scores)} of {len(samples)} samples have no score: left out of the mean")
    mean = sum(scores) / len(scores) if scores else 0.0
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores)) if scores else 0.0
    return {**group, "samples": samples, "mean": mean, "std": std, **({"note": "; ".join(notes)} if notes else {})}


def validation_groups(samples: list[dict]) -> list[dict]:
    """samples.jsonl records of one step as groups: consecutive samples of one prompt together. A resumed run
    may have written a step's samples twice: exact repeats are dropped."""
    seen: set[str] = set()
    groups: list[dict] = []
    for s in samples:
        key = json.dumps(s, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        sample = {"completion": s.get("completion", ""), "score": s.get("score"),
                  **({"conversation": s["conversation"]} if "conversation" in s else {})}
        if groups and groups[-1]["prompt"] == s.get("prompt") and groups[-1]["data_source"] == s.get("data_source"):
            groups[-1]["samples"].append(sample)
        else:
            groups.append({"step": s.get("step"), "group": len(groups), "data_source": s.get("data_source", "default"),
                           "prompt": s.get("prompt", ""), "samples": [sample]})
    return [with_group_stats(g) for g in groups]


def read_config(path: Path) -> tuple[str, dict]:
    if not path.exists():
        return "", {}
    text = path.read_text()
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return text, {}
    if not isinstance(parsed, dict):
        return text, {}
    translate_moved(parsed)  # an older grpoflow's flat multi-turn keys, under their sections' names
    return text, parsed


def schedule_line(path: Path) -> str:
    """The batch schedule the run printed at start, from its resolved config (a note instead when the config
    is not one this version of grpoflow reads)."""
    if not path.exists():
        return ""
    from grpoflow.config import batch_schedule, saved_config

    parsed = read_config(path)[1]
    if not parsed:
        return "(no schedule: config.yaml is not a YAML mapping)"
    try:
        return batch_schedule(saved_config(parsed)).describe()
    except Exception as e:  # noqa: BLE001 - an older or foreign config: the page says why instead
        return f"(no schedule: {type(e).__name__}: {e})"


def summary(config: dict) -> dict[str, Any]:
    """The few settings a person asks about first."""
    def get(dotted: str) -> Any:
        node: Any = config
        for key in dotted.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        return node

    keys = ["model.path", "algorithm.adv_estimator", "actor.policy_loss", "actor.lr", "data.prompts_per_step",
            "rollout.n", "rollout.max_new_tokens", "rollout.engine", "rollout.multi_turn.env",
            "rollout.multi_turn.tools", "rollout.agent.program", "backend", "placement", "trainer.mode",
            "trainer.seed", "trainer.total_steps"]
    return {k: get(k) for k in keys if get(k) not in (None, [], "")}


def checkpoints(root: Path) -> list[dict]:
    """Complete checkpoints (step_* folders), newest last: step, bytes (from manifest.json), time, latest."""
    if not root.is_dir():
        return []
    latest = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
    out = []
    for folder in sorted(root.glob("step_*")):
        out.append({"name": folder.name, "step": int(folder.name.split("_")[-1]), "bytes": checkpoint_bytes(folder),
                    "time": folder.stat().st_mtime, "latest": folder.name == latest})
    return out


def checkpoint_bytes(folder: Path) -> int | None:
    """The checkpoint's size from its manifest.json: {"files": {name: {"size", "sha256"}}}, or the older
    {name: size}; None when there is none or it cannot be read (the page then shows no size)."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
        entries = data["files"] if isinstance(data.get("files"), dict) else data
        return sum(int(v["size"]) if isinstance(v, dict) else int(v) for v in entries.values())
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def files(path: Path) -> list[dict]:
    return [{"name": p.name + ("/" if p.is_dir() else ""), "bytes": p.stat().st_size if p.is_file() else None}
            for p in sorted(path.iterdir()) if not p.name.startswith(".")]


def seconds_since_last_write(path: Path) -> float | None:
    stamps = [p.stat().st_mtime for p in (path / METRICS, path / TRAIN_SAMPLES) if p.exists()]
    return time.time() - max(stamps) if stamps else None
