"""`grpoflow plot`: PNGs and report.md from two small fake runs written here."""

import json
import math

import pytest

from grpoflow.plotting import load_runs, plot_runs, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(path, *, reward_slope, kl_in_reward=False, steps=10, val_every=5):
    """A metrics.jsonl shaped like the controller's: validation alone at step 0, then training steps."""
    path.mkdir(parents=True)
    rows = [{"step": 0, "val/addition/mean@1": 0.2, "val/mean@1": 0.2}]
    for s in range(1, steps + 1):
        row = {"step": s, "critic/score/mean": 0.1 + reward_slope * s, "actor/kl_loss": 0.001 * s,
               "actor/entropy": 0.7 - 0.02 * s, "actor/pg_loss": 0.01 * math.sin(s),
               "response_length/mean": 3.5 - 0.05 * s, "timing_s/step": 0.5 + 0.01 * (s % 3),
               "timing_s/gen": 0.2}
        if kl_in_reward:
            row["kl_in_reward/kl_mean"] = 0.002 * s
        if s % val_every == 0:
            row.update({"val/addition/mean@1": 0.2 + reward_slope * s, "val/mean@1": 0.2 + reward_slope * s})
        rows.append(row)
    rows[3]["actor/entropy"] = None  # a non-finite value, as MetricsLogger writes it
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture()
def two_runs(tmp_path):
    return [fake_run(tmp_path / "grpo_lr1e-4", reward_slope=0.05),
            fake_run(tmp_path / "dapo_lr1e-4", reward_slope=0.03, kl_in_reward=True)]


def test_plots_and_report_for_two_runs(tmp_path, two_runs):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    images = plot_runs(two_runs, str(out))
    names = sorted(p.rsplit("/", 1)[-1] for p in images)
    assert names == ["entropy.png", "kl.png", "response_length.png", "reward.png", "step_time.png",
                     "val_accuracy.png"]
    for image in images:
        data = open(image, "rb").read()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, image

    report = write_report(two_runs, str(out), images)
    text = open(report).read()
    # one row per run: steps, first/last reward, first/last val accuracy, median step time
    assert "| grpo_lr1e-4 | 10 | 0.15 | 0.6 | 0.2 | 0.7 | 0.51 |" in text
    assert "| dapo_lr1e-4 | 10 | 0.13 | 0.4 | 0.2 | 0.5 | 0.51 |" in text
    assert "![reward](reward.png)" in text and "![kl](kl.png)" in text


def test_absent_groups_are_skipped_and_explicit_metrics_must_exist(tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "no_kl"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "critic/score/mean": 0.5, "actor/grad_norm": 1.0}\n'
                                       '{"step": 2, "critic/score/mean": 0.6, "actor/grad_norm": 0.9}\n')
    assert [p.rsplit("/", 1)[-1] for p in plot_runs([str(run)], str(tmp_path / "a"))] == ["reward.png"]
    assert [p.rsplit("/", 1)[-1] for p in plot_runs([str(run)], str(tmp_path / "b"), ["actor/grad_norm"])] == \
        ["actor_grad_norm.png"]
    with pytest.raises(ValueError, match="no run logged a metric for 'kl'"):
        plot_runs([str(run)], str(tmp_path / "c"), ["kl"])


def test_run_without_metrics_jsonl_is_a_clear_error(tmp_path, two_runs):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty has no metrics.jsonl; give a run folder"):
        load_runs([two_runs[0], str(tmp_path / "empty")])
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        write_report([str(tmp_path / "empty")], str(tmp_path / "out"), [])
