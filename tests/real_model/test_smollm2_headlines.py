"""The README's SmolLM2 headline commands, run as a user runs them (real-model stage), on the weights the recipes'
GGUF file dequantizes to (the stage's cached folder: `model.path=$GRPOFLOW_SMOLLM2`), each shortened by its `ci`
overrides in bench/headlines.yaml: `smollm2_addition` for one GRPO step, its base model's figure on all 100
held-out prompts against the `ci` range; `smollm2_calculator` and `smollm2_guess_number`, whose warm starts alone
take 5-7 minutes in float32 here, end to end on a one-step warm start, one GRPO step and two held-out prompts.
Every metric the docs quote must be logged. That GRPO raises a real model's reward: test_smollm2_training.py. The
whole runs, with the figures after GRPO: `python bench/headlines.py --all` (bench/headlines.py).

`-s` shows each run's `measured:` block (bench/headlines.py)."""

import pytest
import yaml

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("recipe", ["smollm2_addition", "smollm2_calculator", "smollm2_guess_number"])
def test_headline_command_lands_in_the_quoted_range(recipe, tmp_path, smollm2_path, headlines):
    measured, problems = headlines.ci_check(recipe, tmp_path / "run", (f"model.path={smollm2_path}",))
    print(yaml.safe_dump({recipe: {"measured": measured}}, sort_keys=False, default_flow_style=None))
    assert not problems, (problems, measured)
