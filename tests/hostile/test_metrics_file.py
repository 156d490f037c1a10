"""Finding 7: a torn last line of metrics.jsonl (a crash mid-append) blocks neither resume nor plots, and any
other bad line is skipped with a warning that names the file and the line (issue 34: the one rule of
grpoflow/metrics_file.py, which the viewer follows too)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from grpoflow.controller.metrics import read_metrics
from hostile_runs import metrics, run


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run(out, steps=2)
    return out


def copy_of(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished), str(out)], check=True)
    return out


def test_a_torn_last_line_is_dropped_with_a_warning_and_the_run_resumes(finished, tmp_path, caplog):
    out = copy_of(finished, tmp_path)
    before = metrics(out)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "critic/score/mean": 0.2, "actor/pg_lo')  # the crash came mid-line
    with caplog.at_level(logging.WARNING, logger="grpoflow.metrics"):
        assert [r["step"] for r in read_metrics(out)] == [1, 2]
        run(out, steps=3)
    assert [r["step"] for r in metrics(out)] == [1, 2, 3] and metrics(out)[:2] == before
    assert any("metrics.jsonl" in r.getMessage() and "cut short" in r.getMessage() for r in caplog.records)


def test_plotting_a_run_with_a_torn_last_line_works(finished, tmp_path):
    pytest.importorskip("matplotlib")
    from grpoflow.plotting import plot_runs

    out = copy_of(finished, tmp_path)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "crit')
    assert plot_runs([str(out)], str(tmp_path / "plots"), None)


def test_a_bad_line_elsewhere_is_skipped_naming_the_file_and_the_line(finished, tmp_path, caplog):
    out = copy_of(finished, tmp_path)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    with caplog.at_level(logging.WARNING, logger="grpoflow.metrics"):
        assert [r["step"] for r in read_metrics(out)] == [1, 2]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "metrics.jsonl, line 2, is not a metrics record" in warning and "garbage" in warning


def test_the_torn_line_warning_says_whether_a_checkpoint_is_behind_it(tmp_path, caplog):
    """Issue 36: the warning checks the checkpoints instead of asserting that none is behind the torn line."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "critic/score/mean": 0.1}\n{"step": 2, "critic/sc')
    with caplog.at_level(logging.WARNING, logger="grpoflow.metrics"):
        read_metrics(tmp_path)
        (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
        read_metrics(tmp_path)
    first, second = [r.getMessage() for r in caplog.records]
    assert "no checkpoint is behind it" in first
    assert "the checkpoint of its step, step_000002, was written" in second and "no checkpoint" not in second
