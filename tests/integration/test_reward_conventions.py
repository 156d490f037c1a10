"""Issue 52 items 1, 3, 4 in whole runs of the tiny model: a reward that changes its row scores the file's value at
every step (in this process and in reward workers); TRL's conventions train beside a grpoflow-shaped function, the
batch-relative one varying; rewards returning bools, NumPy arrays and NumPy scalars train."""

import json

import pytest

from grpoflow.commands.run import train
from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics

ARGS = ["data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=8", "trainer.total_steps=3",
        "trainer.log_every=1"]

REWARDS = '''
import numpy as np

def counter(prompt, completion, extra_info, **row):
    extra_info["count"] += 1                  # the row's dict column, changed: the next call must not see it
    return float(extra_info["count"])

def appender(completions, tags, **kwargs):
    for t in tags:                            # TRL's column list, each entry changed
        t.append("seen")
    return [float(len(t)) for t in tags]

def reward_num_unique_letters(completion_ids, **kwargs):   # TRL docs, Example 1: completion_ids only
    return [float(len(set(ids))) for ids in completion_ids]

class SoftOverlong:
    """What TRL's get_soft_overlong_punishment(64, 16) returns (TRL is not installed here): a callable of
    completion_ids."""
    def __init__(self, max_completion_len, soft_punish_cache):
        self.max_len, self.cache = max_completion_len, soft_punish_cache

    def __call__(self, completion_ids, **kwargs):
        out = []
        for ids in completion_ids:
            n = len(ids)
            out.append(0.0 if n <= self.max_len - self.cache else
                       (self.max_len - self.cache - n) / self.cache if n <= self.max_len else -1.0)
        return out

soft_overlong = SoftOverlong(6, 2)   # at most 8 new tokens: the ramp is reached

def relative(completions, **kwargs):          # batch-relative: 1 - len / max(len) over the whole step
    longest = max(len(c) for c in completions)
    return [1 - len(c) / longest for c in completions]

def exact(prompt, completion, answer, **row):  # grpoflow's shape, beside them
    return float(completion.strip() == answer)

def bools(completions, **kwargs):
    return [len(c) % 2 == 0 for c in completions]

def ones(completions, **kwargs):
    return np.ones(len(completions))

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return np.float32(1.0)
'''


@pytest.fixture()
def setup(tmp_path, tiny_model_path):
    (tmp_path / "rewards.py").write_text(REWARDS)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "extra_info": {"count": 0}, "tags": [],
             "data_source": "mine", "reward_model": {"ground_truth": str(i + 1)}} for i in range(8)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def run(name, functions, *extra):
        specs = ",".join(f"{tmp_path / 'rewards.py'}:{f}" for f in functions)
        train(load_config("builtin", [f"model.path={tiny_model_path}", f"data.train_files={tmp_path / 'rows.jsonl'}",
                                      f"reward.functions=[{specs}]", f"trainer.output_dir={tmp_path / name}", *ARGS,
                                      *extra]))
        samples = [json.loads(line) for line in (tmp_path / name / "train_samples.jsonl").read_text().splitlines()]
        return read_metrics(tmp_path / name), samples
    return run


@pytest.mark.parametrize("workers", [0, 2])
def test_rewards_that_change_their_rows_score_the_files_value_at_every_step(setup, workers):
    metrics, _ = setup(f"run{workers}", ["counter", "appender"], f"reward.workers={workers}")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [(m["reward/counter/mean"], m["reward/appender/mean"], m["reward/errors"]) for m in metrics] == \
        [(1.0, 1.0, 0)] * 3


def test_trl_conventions_train_beside_a_grpoflow_function(setup, caplog):
    metrics, samples = setup("trl", ["reward_num_unique_letters", "soft_overlong", "relative", "exact"])
    assert [m["reward/errors"] for m in metrics] == [0, 0, 0]
    assert all(f"reward/{p}/mean" in metrics[0] for p in ("reward_num_unique_letters", "soft_overlong", "exact"))
    for step in (1, 2, 3):  # the batch-relative part varies within each step (called per sample, it was 0 always)
        parts = [s["reward_parts"] for g in samples if g["step"] == step for s in g["samples"]]
        assert len({p["relative"] for p in parts}) > 1 and min(p["relative"] for p in parts) == 0.0
    assert "reward part(s)" not in caplog.text


def test_bools_numpy_arrays_and_numpy_scalars_train(setup):
    metrics, _ = setup("values", ["bools", "ones", "compute_score"], "reward.workers=2")
    assert [(m["reward/errors"], m["reward/ones/mean"], m["reward/compute_score/mean"]) for m in metrics] == \
        [(0, 1.0, 1.0)] * 3
