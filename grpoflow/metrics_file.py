"""metrics.jsonl, read back: the one rule for what a line of it is, for every reader (resume, `grpoflow plot`,
`grpoflow eval`, `grpoflow view`).

A record is a line holding a JSON object with an integer "step". Any other non-blank line is damaged: it is
skipped with a warning that names the file and the line number, so one bad line never blanks a run's curves or
stops a resume. The last line of a file without a final newline is torn (a crash while it was appended): a
whole-file read drops it with a warning that says whether the checkpoint of its step exists; the viewer, which
follows a file a run is still writing, waits for the rest of it instead.

Standard library only, below both the controller (which writes the file) and the viewer.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from grpoflow.errors import UserError

METRICS = "metrics.jsonl"

log = logging.getLogger("grpoflow.metrics")


def metrics_record(line: bytes | str) -> dict | None:
    """`line` as a metrics record: a JSON object with an integer "step"; None for anything else (blank, damaged,
    not an object, no step)."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    if not isinstance(value, dict):
        return None
    step = value.get("step")
    return value if isinstance(step, int) and not isinstance(step, bool) else None


def warn_skipped(path: Path, number: int, line: bytes | str) -> None:
    """The warning for a damaged line (number counts from 1)."""
    text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
    log.warning("%s, line %d, is not a metrics record (a JSON object with an integer \"step\"); skipped: %r", path,
                number, text[:120])


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of `run_dir/metrics.jsonl`, in file order (the module docstring's rule for other lines)."""
    path = Path(run_dir) / METRICS
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not a metrics file.") from None
    lines = text.split("\n")
    torn = lines.pop() if not text.endswith("\n") else ""  # after the last newline: a line cut short, or nothing
    records = []
    for number, line in enumerate(lines, 1):
        record = metrics_record(line)
        if record is not None:
            records.append(record)
        elif line.strip():
            warn_skipped(path, number, line)
    if torn.strip():
        record = metrics_record(torn)
        if record is not None:  # complete but for its newline: kept
            records.append(record)
        else:
            log.warning("%s: its last line (line %d) is cut short, as by a crash while it was written; dropped "
                        "(%s).", path, len(lines) + 1, _behind(path.parent, torn))
    return records


def _behind(run_dir: Path, torn: str) -> str:
    """What stands behind a torn metrics line: whether the checkpoint of its step exists."""
    step = re.match(r'\s*\{\s*"step"\s*:\s*(\d+)', torn)
    if step is None:
        return "its step cannot be read; a resume starts from the newest checkpoint"
    folder = run_dir / "checkpoints" / f"step_{int(step.group(1)):06d}"
    if folder.is_dir():
        return (f"but the checkpoint of its step, {folder.name}, was written: that step's metrics are lost and a "
                "resume starts after it")
    return "no checkpoint is behind it: a resume runs that step again"
