"""The README's SmolLM2 headline commands, run as a user runs them (real-model stage): `grpoflow train
smollm2_addition`, `smollm2_calculator` and `smollm2_guess_number`, each into a fresh folder, on the weights the
recipes' GGUF file dequantizes to (the stage's cached folder: `model.path=$GRPOFLOW_SMOLLM2`). The held-out figures
before and after GRPO must lie in the range bench/headlines.yaml accepts; for the two agentic recipes `before` is
the warm-started model, so the range also checks that the warm start taught the tool call and the game.

`-s` shows each run's `measured:` block (bench/headlines.py), ready to paste into headlines.yaml."""

import pytest
import yaml

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("recipe", ["smollm2_addition", "smollm2_calculator", "smollm2_guess_number"])
def test_headline_command_lands_in_the_quoted_range(recipe, tmp_path, smollm2_path, headlines):
    measured = headlines.run_headline(recipe, tmp_path / "run", (f"model.path={smollm2_path}",))
    print(yaml.safe_dump({recipe: {"measured": measured}}, sort_keys=False, default_flow_style=None))
    assert not headlines.out_of_range(measured, headlines.load()[recipe]), measured
