"""Curves of one or more runs from their metrics.jsonl, and a report.md (`grpoflow plot RUN_DIR... [--out DIR]`).

One PNG per metric group (GROUPS), one panel per metric key in the group, every run overlaid
and labelled by its folder name. Groups whose keys no run logged are skipped. Drawing uses
matplotlib's Agg canvas through `Figure` (not pyplot), so no global backend is switched and no
display is needed. Needs the `plot` extra: pip install 'grpoflow[plot]'.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import statistics
from pathlib import Path

from grpoflow.metrics_file import read_metrics
from grpoflow.errors import MissingExtraError, UserError, UserFileNotFoundError

# group name (also the PNG's name) -> (title, metric keys or fnmatch patterns)
GROUPS: dict[str, tuple[str, list[str]]] = {
    "reward": ("Training reward", ["critic/score/mean"]),
    "val_accuracy": ("Validation accuracy (mean@k)", ["val/*/mean@*"]),
    "kl": ("KL", ["actor/kl_loss", "kl_in_reward/kl_mean"]),
    "entropy": ("Policy entropy", ["actor/entropy"]),
    "response_length": ("Response length (tokens)", ["response_length/mean"]),
    "step_time": ("Step time (s)", ["timing_s/step"]),
}
REWARD, STEP_TIME = "critic/score/mean", "timing_s/step"


def load_runs(run_dirs: list[str]) -> dict[str, list[dict]]:
    """{label: records} per run; the label is the folder name (with its parent when two names clash)."""
    if not run_dirs:
        raise UserError("give at least one run folder (a trainer.output_dir holding metrics.jsonl).")
    for d in run_dirs:
        if not (Path(d) / "metrics.jsonl").is_file():
            raise UserFileNotFoundError(f"{d} has no metrics.jsonl; give a run folder that training wrote "
                                        f"(its trainer.output_dir, e.g. runs/default).")
    paths = [Path(d).resolve() for d in run_dirs]
    names = [p.name for p in paths]
    labels = [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]
    runs = {}
    for label, d in zip(labels, run_dirs):
        records = read_metrics(d)
        if not records:
            raise UserError(f"{Path(d) / 'metrics.jsonl'} has no records; the run stopped before its first step.")
        runs[label] = records
    return runs


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric; steps where it is missing or non-finite (null) are left out."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def matching_keys(runs: dict[str, list[dict]], patterns: list[str]) -> list[str]:
    """Keys logged by any run that match a pattern, in pattern order then name order."""
    logged = sorted({k for records in runs.values() for r in records for k in r} - {"step"})
    keys: list[str] = []
    for pattern in patterns:
        keys += [k for k in logged if fnmatch.fnmatchcase(k, pattern) and k not in keys]
    return keys


def _require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingExtraError("grpoflow plot needs matplotlib, which is not installed; pip install 'grpoflow[plot]'")


def _draw(runs: dict[str, list[dict]], title: str, keys: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    cols = min(len(keys), 3)
    rows = -(-len(keys) // cols)
    fig = Figure(figsize=(5 * cols, 3.6 * rows), layout="constrained")
    fig.suptitle(title)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        for n, (label, records) in enumerate(runs.items()):
            steps, values = series(records, key)
            if steps:  # one colour per run in every panel; validation keys have a few points: mark them
                ax.plot(steps, values, label=label, color=f"C{n % 10}", marker="o" if len(steps) < 30 else None,
                        markersize=3)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)


def plot_runs(run_dirs: list[str], out_dir: str, metrics: list[str] | None = None) -> list[str]:
    """Write one PNG per group into `out_dir`; returns their paths.

    `metrics`: group names (GROUPS) and/or metric keys or fnmatch patterns (each its own PNG);
    None draws every group that some run logged. A name given explicitly must match something.
    """
    _require_matplotlib()
    runs = load_runs(run_dirs)
    wanted = list(GROUPS) if metrics is None else metrics
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images = []
    for name in wanted:
        title, patterns = GROUPS.get(name, (name, [name]))
        keys = matching_keys(runs, patterns)
        if not keys:
            if metrics is not None:
                raise UserError(f"no run logged a metric for {name!r}; use a group ({', '.join(GROUPS)}) "
                                f"or a key of metrics.jsonl, e.g. {', '.join(matching_keys(runs, ['*'])[:5])}.")
            continue
        path = out / (re.sub(r"[^\w.-]+", "_", name).strip("_") + ".png")
        _draw(runs, title, keys, path)
        images.append(str(path))
    return images


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _summary_row(label: str, records: list[dict]) -> str:
    overall = sorted(k for r in records for k in r if k.startswith("val/mean@"))
    val_key = overall[0] if overall else next(iter(matching_keys({label: records}, ["val/*/mean@*"])), None)
    reward = series(records, REWARD)[1]
    val = series(records, val_key)[1] if val_key else []
    step_s = series(records, STEP_TIME)[1]
    cells = [label, str(max(r["step"] for r in records)),
             _fmt(reward[0] if reward else None), _fmt(reward[-1] if reward else None),
             _fmt(val[0] if val else None), _fmt(val[-1] if val else None),
             _fmt(statistics.median(step_s) if step_s else None)]
    return "| " + " | ".join(cells) + " |"


def write_report(run_dirs: list[str], out_dir: str, images: list[str]) -> str:
    """Write `out_dir/report.md`: one row per run (steps, reward, validation accuracy, step time), then the images."""
    runs = load_runs(run_dirs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Runs", "",
             "Validation accuracy is `val/mean@k` (or the first `val/<source>/mean@k` when absent); "
             "first = before training when validated at step 0. Step time is the median of `timing_s/step`.", "",
             "| run | steps | first reward | last reward | first val acc | last val acc | median step s |",
             "|---|---|---|---|---|---|---|"]
    lines += [_summary_row(label, records) for label, records in runs.items()]
    lines += ["", "Run folders: " + ", ".join(f"`{d}`" for d in run_dirs), ""]
    for image in images:
        name, link = Path(image).stem, Path(os.path.relpath(image, out)).as_posix()
        lines += [f"## {name}", "", f"![{name}]({link})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return str(path)
