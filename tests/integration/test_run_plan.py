"""One place assembles a run (grpoflow/plan/): a plain `grpoflow train` loads the policy's tokenizer once in its
process and resolves each registry name of its config once, the start-up check's results handed to every role."""

import pickle

import pytest

from grpoflow.commands.run import train
from grpoflow.config import load_config
from grpoflow.models.loading import TOKENIZER_LOADS
from grpoflow.plan.checks import check_config
from grpoflow.plugins import RESOLVED

TINY = ["model.path=builtin:tiny-0.5m", "sft.steps=0", "data.prompts_per_step=4", "rollout.n=2",
        "rollout.max_new_tokens=4", "trainer.total_steps=2", "trainer.val_every=2", "data.val_max_prompts=4",
        "trainer.save_every=2"]
GUESS = ["rollout.multi_turn.env=guess_number", "data.train_files=[builtin:guess_number/train]",
         "data.val_files=[builtin:guess_number/val]", "reward.function=null", "rollout.max_new_tokens=12"]


@pytest.mark.parametrize("extra", [[], GUESS], ids=["single_turn", "environment"])
def test_a_plain_train_loads_the_tokenizer_once_and_resolves_each_name_once(tmp_path, extra):
    """Validation, a step, a checkpoint (which saves the tokenizer) and the environment loop all take the plan's
    tokenizer and resolved parts (before the plan: 5-6 loads, and 2-5 resolutions of a name)."""
    TOKENIZER_LOADS.clear()
    RESOLVED.clear()
    train(load_config(None, [*TINY, f"trainer.output_dir={tmp_path / 'run'}", *extra]))
    assert dict(TOKENIZER_LOADS) == {str((tmp_path / "run" / "base_model").resolve()): 1}
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "actor" / "tokenizer.json").exists()
    assert RESOLVED and {name: n for name, n in RESOLVED.items() if n != 1} == {}
    kinds = {kind for kind, _ in RESOLVED}
    assert {"advantage estimator", "policy loss", "rollout engine", "KL controller"} <= kinds
    assert ("environment" in kinds) == bool(extra) and ("reward function" in kinds) != bool(extra)


def test_the_resolved_parts_travel_as_their_config_and_resolve_once_where_they_arrive():
    """A Ray worker receives the parts pickled: they resolve again in its process (user files imported there), never
    as references to functions of a module that process has not loaded."""
    cfg = load_config(None, ["rollout.multi_turn.tools=[calculator]"])
    parts = check_config(cfg)
    RESOLVED.clear()
    copy = pickle.loads(pickle.dumps(parts))
    assert copy is not parts and copy.advantage_fn is parts.advantage_fn and copy.tool_schemas == parts.tool_schemas
    assert RESOLVED[("advantage estimator", "grpo")] == 1 and RESOLVED[("tool", "calculator")] == 1
