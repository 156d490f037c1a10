"""The README's tiny-model headline commands, run as a user runs them (slow stage): `make train` (`grpoflow train`),
`grpoflow train guess_number` and `grpoflow train calculator_tool`, each into a fresh folder; the held-out figure
before and after GRPO must lie in the range bench/headlines.yaml accepts, the range the README's figure came from.

`-s` shows each run's output and its `measured:` block (bench/headlines.py), ready to paste into headlines.yaml."""

import pytest
import yaml


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["builtin", "guess_number", "calculator_tool"])
def test_headline_command_lands_in_the_quoted_range(recipe, tmp_path, headlines):
    measured = headlines.run_headline(recipe, tmp_path / "run")
    print(yaml.safe_dump({recipe: {"measured": measured}}, sort_keys=False, default_flow_style=None))
    assert not headlines.out_of_range(measured, headlines.load()[recipe]), measured
