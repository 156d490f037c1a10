"""The figures README.md and docs/ quote for the recipes' headline commands are the ones bench/headlines.yaml
holds (no run here: tests/integration/test_headline_runs.py and tests/real_model/test_smollm2_headlines.py run the
commands against the file's ranges)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["builtin", "guess_number", "calculator_tool", "smollm2_addition", "smollm2_calculator", "smollm2_guess_number"]
MEASURED = {"before", "after", "seconds", "cpu", "threads", "load_before", "load_after", "date", "commit"}


def test_every_readme_recipe_has_a_complete_entry(headlines):
    recipes = headlines.load()
    assert sorted(recipes) == sorted(NAMES)
    for name, entry in recipes.items():
        assert (ROOT / "grpoflow" / "recipes" / f"{name}.yaml").exists(), name
        assert MEASURED <= set(entry["measured"]), (name, MEASURED - set(entry["measured"]))
        assert set(entry["measured"].get("also") or {}) == set(entry.get("also") or {}), name
        assert entry["quotes"], f"{name}: no doc quotes its figure"


@pytest.mark.parametrize("name", NAMES)
def test_the_docs_quote_the_measured_figures(name, headlines):
    for file, text in headlines.quotes(headlines.load()[name]):
        assert text in (ROOT / file).read_text(), f"{file} should say {text!r} (bench/headlines.yaml, {name})"


@pytest.mark.parametrize("name", NAMES)
def test_the_measured_run_lies_in_its_own_range(name, headlines):
    entry = headlines.load()[name]
    assert headlines.out_of_range(entry["measured"], entry) == []


@pytest.mark.parametrize("name", NAMES)
def test_ci_runs_each_command_whole_or_shortened_within_the_quoted_range(name, headlines):
    """`ci: full`, or overrides that shorten the run and a range that the whole run's `before` lies in (a shortened
    run checks the warm start, so its range can be no stranger to the measured one)."""
    entry = headlines.load()[name]
    if entry["ci"] == "full":
        return
    assert set(entry["ci"]) == {"overrides", "accept"}, entry["ci"]
    assert any(o.startswith("trainer.total_steps=") for o in entry["ci"]["overrides"]), entry["ci"]
    only_before = {"accept": entry["ci"]["accept"]}
    assert headlines.out_of_range(entry["measured"], only_before) == []
    assert "after" not in entry["ci"]["accept"] and "min_gain" not in entry["ci"]["accept"]


def test_every_doc_line_with_a_recipe_command_and_a_figure_quotes_the_data(headlines):
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for name, entry in headlines.load().items():
        if name == "builtin":
            continue   # `grpoflow train` alone is in many lines; its quotes are pinned above
        command = re.compile(re.escape(entry["command"]) + r"(\s|`|$)")
        texts = [text for _, text in headlines.quotes(entry)]
        for doc in docs:
            for line in doc.read_text().splitlines():
                if command.search(line) and "%" in line:
                    assert any(t in line for t in texts), f"{doc.name}: {line.strip()!r} quotes a figure for {name} " \
                        f"that bench/headlines.yaml does not hold"


def test_a_run_outside_the_range_is_named(headlines):
    entry = {"accept": {"before": [0.2, 0.5], "after": [0.6, 0.9], "min_gain": 0.2,
                        "also": {"calls": {"after": [100, 128]}, "reward": {"min_gain": 0.3}}}}
    ok = {"calls": [52, 128], "reward": [0.3, 0.9]}
    assert headlines.out_of_range({"before": 0.3, "after": 0.7, "also": ok}, entry) == []
    # 0.45 -> 0.6: both in range, the gain 15 points < 20
    assert headlines.out_of_range({"before": 0.45, "after": 0.6, "also": ok}, entry) == ["gain +15.0% below +20.0%"]
    assert headlines.out_of_range({"before": 0.1, "after": 0.95, "also": ok}, entry) == [
        "before 10.0% outside [20.0%, 50.0%]", "after 95.0% outside [60.0%, 90.0%]"]
    # the tool called in 90 of 128 trajectories after GRPO; the sampled reward up by 0.25 only
    assert headlines.out_of_range({"before": 0.3, "after": 0.7, "also": {"calls": [52, 90], "reward": [0.3, 0.55]}},
                                  entry) == ["calls after 90 outside [100, 128]", "reward gain +25.0% below +30.0%"]


def test_quotes_render_the_figures(headlines):
    entry = {"measured": {"before": 0.76, "after": 0.85, "seconds": 333, "also": {"calls": [62, 127]}},
             "quotes": {"README.md": ["{before:.0%} -> {after:.1%} ({gain:+.1%}), {seconds} s, {minutes:.1f} min, "
                                      "calls {calls_before} -> {calls_after}"]}}
    assert headlines.quotes(entry) == [("README.md", "76% -> 85.0% (+9.0%), 333 s, 5.5 min, calls 62 -> 127")]


def test_read_run_takes_the_first_and_last_logged_values(tmp_path, headlines):
    lines = ['{"step": 0, "val/mean@1": 0.25, "val/mean@4": 0.5}', '{"step": 1, "critic/score/mean": 0.1}',
             '{"step": 2, "critic/score/mean": 0.3, "val/mean@1": 0.5}', '{"step": 3, "critic/score/mean": 0.6}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    entry = {"metric": "val/mean@1", "also": {"reward": "critic/score/mean"}}
    assert headlines.read_run(tmp_path, entry) == {"before": 0.25, "after": 0.5, "also": {"reward": [0.1, 0.6]}}
    with pytest.raises(ValueError, match="1 values of 'val/mean@4'"):
        headlines.read_run(tmp_path, {"metric": "val/mean@4"})   # validated once: no before/after
