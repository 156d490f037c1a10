"""A config is checked once, at the edge: `load_config` resolves it and checks its values, `grpoflow train` runs the
start-up check (`check_config`, which imports the user's files) once, and the Controller only requires the mark
that check leaves. No check rewrites what the user set; the dependent values are resolved by loading."""

import dataclasses

import pytest

from grpoflow.config import (Config, ConfigError, check_config_values, is_checked, load_config, resolve_defaults,
                             resolve_total_steps)
from grpoflow.plan.checks import check_config

TINY = ["model.path=builtin:tiny-0.5m", "sft.steps=0", "data.prompts_per_step=4", "rollout.n=2",
        "rollout.max_new_tokens=4", "trainer.val_every=0"]


def _controller(cfg: Config, tiny_model_path: str, tmp_path):
    """A Controller of a plan whose config is `cfg` (a plan is built from a checked config: swapped in here)."""
    from plans import plan_of

    from grpoflow.controller.trainer import Controller

    plan = plan_of(load_config(None, TINY), model_path=tiny_model_path, train_items=[], run_dir=tmp_path)
    return Controller(dataclasses.replace(plan, cfg=cfg))


# ---------------------------------------------------------------- the checks change nothing


def test_check_config_values_refuses_an_unresolved_config_instead_of_resolving_it():
    cfg = Config()  # actor.rollout_is=None: resolved by loading, not by a check
    with pytest.raises(ConfigError, match="actor.rollout_is=None is unresolved"):
        check_config_values(cfg)
    assert cfg.actor.rollout_is is None
    resolve_defaults(cfg)
    before = cfg.to_dict()
    check_config_values(cfg)
    assert cfg.to_dict() == before and cfg.actor.rollout_is == "off"


def test_resolving_keeps_what_the_user_set():
    stale = ["backend=ray", "placement=split", "trainer.mode=async"]
    assert load_config(None, stale).actor.rollout_is == "token"
    assert load_config(None, [*stale, "actor.rollout_is=sequence"]).actor.rollout_is == "sequence"


def test_the_start_up_check_changes_no_value_and_marks_the_config():
    cfg = load_config(None, ["trainer.total_epochs=2"])
    before = cfg.to_dict()
    assert not is_checked(cfg)  # loaded and its values checked, not yet through the registries
    check_config(cfg)
    assert cfg.to_dict() == before and is_checked(cfg)
    cfg.rollout.n = 3
    assert not is_checked(cfg)  # changed after the check


def test_total_epochs_resolve_into_a_new_checked_config():
    cfg = load_config(None, ["trainer.total_epochs=2", "data.prompts_per_step=4"])
    check_config(cfg)
    resolved = resolve_total_steps(cfg, prompts=10)
    assert resolved.trainer.total_steps == 2 * 3  # ceil(10 / 4) steps per epoch
    assert cfg.trainer.total_steps == 300 and is_checked(cfg) and is_checked(resolved)
    assert not is_checked(resolve_total_steps(load_config(None, ["trainer.total_epochs=1"]), prompts=10))
    plain = load_config()
    assert resolve_total_steps(plain, prompts=10) is plain


# ---------------------------------------------------------------- the controller requires the mark


def test_the_controller_refuses_an_unchecked_config(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="has not passed the start-up check: call .*check_config"):
        _controller(load_config(), tiny_model_path, tmp_path)


def test_the_controller_refuses_a_config_changed_after_the_check(tiny_model_path, tmp_path):
    cfg = load_config()
    check_config(cfg)
    cfg.actor.lr = 1.0
    with pytest.raises(ValueError, match="or was changed after it"):
        _controller(cfg, tiny_model_path, tmp_path)


# ---------------------------------------------------------------- once per `grpoflow train`


class _Built(Exception):
    """Stops the run where the controller starts building its workers."""


def test_grpoflow_train_checks_once_and_imports_the_reward_file_once(tmp_path, monkeypatch):
    from grpoflow.commands.run import train
    from grpoflow.controller import trainer
    from grpoflow.plan import checks

    imports = tmp_path / "imports.txt"
    reward = tmp_path / "my_reward.py"
    reward.write_text(f"open({str(imports)!r}, 'a').write('imported\\n')\n\n"
                      "def score(prompt, completion, **row):\n    return 0.0\n")
    checked = []
    real = checks.check_teacher_path  # called by check_config only, once per check
    monkeypatch.setattr(checks, "check_teacher_path", lambda path: checked.append(path) or real(path))
    reached = []

    def stop(cfg):
        reached.append(cfg.reward.function)
        raise _Built

    monkeypatch.setattr(trainer, "build_placement", stop)
    cfg = load_config(None, [*TINY, f"trainer.output_dir={tmp_path / 'run'}", f"reward.function={reward}:score"])
    with pytest.raises(_Built):
        train(cfg)
    assert reached == [f"{reward}:score"]  # the controller was built ...
    assert len(checked) == 1  # ... from a config checked once, not again inside it
    assert imports.read_text() == "imported\n"
