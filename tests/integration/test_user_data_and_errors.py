"""A user's own jsonl + reward file through the CLI, and every bad-input path of the spine."""

import json

import pytest

from grpoflow.algorithms import register_advantage
from grpoflow.cli import main
from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train
from grpoflow.controller.fit import TrainingError
from grpoflow.errors import UserError

# The tiny model folder was trained from scratch: runs use the `builtin` recipe (its settings) like builtin: models.
ARGS = ["data.prompts_per_step=4", "rollout.n=2", "rollout.max_new_tokens=4", "trainer.total_steps=2",
        "trainer.log_every=1"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture()
def user_files(tmp_path):
    rows = [{"prompt": f"say {i}:", "bonus": 0.25 * (i % 2), "data_source": "mine"} for i in range(8)]
    rows.append({"text": "a row without a prompt"})
    data = write_jsonl(tmp_path / "my.jsonl", rows)
    reward = tmp_path / "my_reward.py"
    reward.write_text("def score(prompt, completion, bonus, data_source, **row):\n"
                      "    assert data_source == 'mine'\n"
                      "    return {'score': bonus, 'chars': float(len(completion))}\n")
    return data, f"{reward}:score"


def test_user_jsonl_and_reward_function_via_cli(tmp_path, tiny_model_path, user_files, capsys):
    data, reward = user_files
    code = main(["train", "builtin", f"model.path={tiny_model_path}", f"data.train_files={data}",
                 f"reward.function={reward}", f"trainer.output_dir={tmp_path / 'run'}", *ARGS])
    assert code == 0
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]              # no validation files: no step-0 line
    for r in rows:                                          # the `bonus` column reached the reward
        assert r["critic/score/mean"] == pytest.approx(0.125)
        assert "reward/chars/mean" in r and r["reward/errors"] == 0
    assert not (tmp_path / "run" / "sft_model").exists()    # a given model gets no warm start
    assert "8 of 9 training prompts kept (1 without a prompt" in capsys.readouterr().out


@pytest.mark.parametrize("args, expected", [
    (["actor.lrr=1e-4"], "Did you mean `actor.lr`"),
    (["rollout.n=many"], "`rollout.n` expects int"),
    (["data.train_files=/nope/missing.jsonl"], "/nope/missing.jsonl"),
    (["reward.function=exact_mach"], "did you mean 'exact_match'"),
    (["model.path=/nope/model"], "model.path=/nope/model is not a folder"),
    (["actor.minibatches=3"], "does not divide data.prompts_per_step=4"),
])
def test_bad_input_is_one_clear_message(tmp_path, capsys, args, expected):
    code = main(["train", f"trainer.output_dir={tmp_path / 'run'}", *ARGS, *args])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err


def test_overlong_prompt_error_names_the_setting(tmp_path, tiny_model_path, user_files, capsys):
    data, reward = user_files
    code = main(["train", "builtin", f"model.path={tiny_model_path}", f"data.train_files={data}",
                 f"reward.function={reward}", "data.max_prompt_length=5", "data.overlong=error",
                 f"trainer.output_dir={tmp_path}", *ARGS])
    assert code == 2 and "data.max_prompt_length" in capsys.readouterr().err


def test_a_reward_that_fails_on_every_sample_stops_the_run(tmp_path, tiny_model_path, user_files):
    data, _ = user_files
    bad = tmp_path / "bad.py"
    bad.write_text("def score(prompt, completion, **row):\n    raise RuntimeError('boom')\n")
    with pytest.raises(UserError, match=r"(?s)bad.py:score failed on all 8 samples of step 1.*boom"):
        train(load_config("builtin", [f"model.path={tiny_model_path}", f"data.train_files={data}",
                                      f"reward.function={bad}:score", "reward.error_score=-1",
                                      f"trainer.output_dir={tmp_path / 'run'}", *ARGS]))
    assert read_metrics(tmp_path / "run") == []  # nothing was trained or logged as if it had been


@register_advantage("test_nan_advantage", override=True)
def nan_advantage(scores, response_mask):
    return response_mask * float("nan")


def test_nan_loss_stops_with_clear_message(tmp_path, tiny_model_path, user_files):
    data, reward = user_files
    cfg = load_config("builtin", [f"model.path={tiny_model_path}", f"data.train_files={data}",
                             f"reward.function={reward}", "algorithm.adv_estimator=test_nan_advantage",
                             f"trainer.output_dir={tmp_path}", *ARGS])
    with pytest.raises(TrainingError, match=r"Stopped at step 1: the loss became nan.*Lower actor.lr"):
        train(cfg)


TRL_REWARDS = """
def accuracy_reward(completions, solution, **kwargs):
    return [float(c.strip() == s) + 0.1 * len(c) for c, s in zip(completions, solution)]

def buggy_reward(completions, solution, **kwargs):
    return [float(c == s) for c, s in zip(completions, solution, kwargs["missing_column"])]
"""
VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth) + 0.1 * len(solution_str)

def compute_score_buggy(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth["value"])
"""


@pytest.mark.parametrize("fn, bug, convention", [("trl_rewards.py:accuracy_reward", "trl_rewards.py:buggy_reward",
                                                  "TRL's batched shape"),
                                                 ("verl_reward.py:compute_score", "verl_reward.py:compute_score_buggy",
                                                  "verl's compute_score")])
def test_trl_and_verl_reward_files_train_unchanged_and_a_bug_stops_at_step_1(tmp_path, tiny_model_path, capsys, fn,
                                                                             bug, convention):
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    (tmp_path / "verl_reward.py").write_text(VERL_REWARD)
    rows = [{"prompt": f"{i}+1=", "solution": str(i + 1), "data_source": "mine",
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(8)]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    common = ["builtin", f"model.path={tiny_model_path}", f"data.train_files={data}", *ARGS]
    assert main(["train", *common, f"reward.function={tmp_path / fn}", f"trainer.output_dir={tmp_path / 'ok'}"]) == 0
    metrics = read_metrics(tmp_path / "ok")
    assert [m["reward/errors"] for m in metrics] == [0, 0] and all(m["critic/score/mean"] > 0 for m in metrics)
    capsys.readouterr()
    assert main(["train", *common, f"reward.function={tmp_path / bug}", f"trainer.output_dir={tmp_path / 'bug'}"]) == 2
    err = capsys.readouterr().err
    assert "failed on all 8 samples of step 1" in err and convention in err and bug.split(":")[1] in err
