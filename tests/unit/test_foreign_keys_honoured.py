"""verl's `trainer.val_before_train=False` and `data.shuffle=False` (TRL's `shuffle_dataset`) change what the run
does, as they do in verl and TRL: no validation before step 1; prompts in file order. The run loop with a stand-in
controller (no model) and the sampler alone: milliseconds."""

from pathlib import Path

import pytest

from grpoflow.config import Config, ConfigError, load_config
from grpoflow.controller.curriculum import build_sampler
from grpoflow.controller.fit import RunLoop


class ValidatingController:
    """What RunLoop.train_from reads of a Controller, recording the steps it validated at."""

    def __init__(self, run_dir: Path, cfg: Config) -> None:
        self.cfg, self.run_dir, self.val_items, self.validated = cfg, run_dir, ["a held-out prompt"], []

    def step(self, step: int) -> dict[str, float]:
        return {"critic/score/mean": 0.5}

    def evaluate_held_out(self, step: int) -> dict[str, float]:
        self.validated.append(step)
        return {"val/mean@1": 0.25}

    def drain(self) -> None:
        pass


@pytest.mark.parametrize("before, validated", [("True", [0, 2, 4]), ("False", [2, 4])])
def test_val_before_train_false_skips_the_validation_before_step_1(tmp_path, before, validated):
    cfg = load_config(None, ["model.path=/m", "trainer.total_steps=4", "trainer.val_every=2", "trainer.save_every=0",
                             f"trainer.val_before_train={before}"])
    controller = ValidatingController(tmp_path, cfg)
    loop = RunLoop(controller)
    loop.logger.start(0)
    loop.trackers = []
    result = loop.train_from(0, [])
    assert controller.validated == validated
    assert result["before"] == ({} if before == "False" else {"val/mean@1": 0.25})


@pytest.mark.parametrize("args", [["data.shuffle=False"], ["actor_rollout_ref.model.path=/m", "data.shuffle=False"],
                                  ["shuffle_dataset=false"]])
def test_shuffle_false_draws_the_prompts_in_file_order_epoch_after_epoch(args):
    cfg = load_config(None, ["model.path=/m", *args])
    sampler = build_sampler(cfg, num_items=5)
    assert [sampler.next_indices(3) for _ in range(4)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]
    shuffled = build_sampler(load_config(None, ["model.path=/m"]), num_items=5)
    assert sorted(shuffled.next_indices(5)) == [0, 1, 2, 3, 4] and shuffled.next_indices(5) != [0, 1, 2, 3, 4]


def test_verls_keys_are_ours_now_not_ignored():
    notes: list[str] = []
    cfg = load_config(None, ["model.path=/m", "trainer.val_before_train=False", "data.shuffle=False"], notes)
    assert (cfg.trainer.val_before_train, cfg.data.shuffle) == (False, False)
    assert "ignored" not in "\n".join(filter(None, notes))


def test_file_order_and_a_curriculum_are_refused_together():
    with pytest.raises(ConfigError, match="data.shuffle=false asks for the prompts in file order"):
        load_config(None, ["model.path=/m", "data.shuffle=false", "data.curriculum.enable=true"])
