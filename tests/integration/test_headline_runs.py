"""The README's tiny-model headline commands, run as a user runs them (slow stage): `make train` (`grpoflow train`)
whole against the range bench/headlines.yaml accepts, the range the README's figure came from; `grpoflow train
guess_number` and `grpoflow train calculator_tool`, whose warm starts alone take 4-12 minutes in float32 on a 2-core
CPU, end to end on a one-step warm start, a GRPO step or two and two held-out prompts (their `ci` overrides): every
metric the docs quote must be logged. Their whole runs, with the figures: `python bench/headlines.py --all`
(bench/headlines.py says why).

`-s` shows each run's output and its `measured:` block (bench/headlines.py)."""

import pytest
import yaml


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["builtin", "guess_number", "calculator_tool"])
def test_headline_command_lands_in_the_quoted_range(recipe, tmp_path, headlines):
    measured, problems = headlines.ci_check(recipe, tmp_path / "run")
    print(yaml.safe_dump({recipe: {"measured": measured}}, sort_keys=False, default_flow_style=None))
    assert not problems, (problems, measured)
