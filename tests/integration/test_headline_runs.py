"""The README's tiny-model headline commands, run as a user runs them (slow stage): `make train` (`grpoflow train`)
whole against the range bench/headlines.yaml accepts, the range the README's figure came from; `grpoflow train
guess_number` and `grpoflow train calculator_tool` shortened by their `ci` overrides (a GRPO step on fewer held-out
prompts) and checked against their `ci` range: the warm start's figure and every metric the docs quote. Their whole
runs, with the figures after GRPO: `python bench/headlines.py --all` (bench/headlines.py says why).

`-s` shows each run's output and its `measured:` block (bench/headlines.py)."""

import pytest
import yaml


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["builtin", "guess_number", "calculator_tool"])
def test_headline_command_lands_in_the_quoted_range(recipe, tmp_path, headlines):
    measured, problems = headlines.ci_check(recipe, tmp_path / "run")
    print(yaml.safe_dump({recipe: {"measured": measured}}, sort_keys=False, default_flow_style=None))
    assert not problems, (problems, measured)
