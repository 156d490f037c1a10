"""bench/learning.py and its child settings (no training): seed statistics, greedy lengths, grpoflow's overrides."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # learning imports its siblings compare_trl, children, limits
    try:
        spec = importlib.util.spec_from_file_location("learning", BENCH / "learning.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        import children
        yield module, children
    finally:
        sys.path.remove(str(BENCH))


def test_mean_and_standard_error_over_seeds(bench):
    learning, _ = bench
    # 0.4, 0.5, 0.6, 0.7: mean 0.55, sample std sqrt(((.15)^2 + (.05)^2) * 2 / 3) = 0.1291, SE = 0.1291 / 2 = 0.0645
    mean, se = learning.mean_se([0.4, 0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.55) and se == pytest.approx(math.sqrt(0.05 / 3) / 2)
    assert learning.mean_se([0.3]) == (0.3, 0.0)
    # difference of means 0.55 - 0.45 = 0.1, its SE the two SEs in quadrature: sqrt(2) * 0.0645
    diff, dse = learning.diff_se([0.4, 0.5, 0.6, 0.7], [0.3, 0.4, 0.5, 0.6])
    assert diff == pytest.approx(0.1) and dse == pytest.approx(math.sqrt(2) * math.sqrt(0.05 / 3) / 2)


def test_greedy_lengths_count_up_to_the_first_eos(bench):
    _, children = bench
    eos = 2
    new = torch.tensor([[5, 6, eos, eos, eos],   # answered in 3 tokens (EOS counted), then generate's padding = EOS
                        [5, 6, 7, 8, 9],          # cut at the budget
                        [eos, eos, eos, eos, eos]])
    lengths, cut = children.greedy_lengths(new, eos)
    assert lengths == [3, 5, 1] and cut == [False, True, False]


def test_the_learning_runs_use_grpoflow_defaults(bench):
    _, children = bench
    spec = {"model_path": "m", "task": "chat_addition", "prompts": 8, "group_size": 8, "max_new_tokens": 24,
            "lr": 1e-5, "steps": 10, "kl": 0.0, "threads": 2, "compute_dtype": "float32", "seed": 3}
    twin = children.grpoflow_overrides(spec, Path("out"))
    assert "algorithm.epsilon=1e-4" in twin and any(o.startswith("actor.max_tokens_per_microbatch=") for o in twin)
    defaults = children.grpoflow_overrides({**spec, "match_trl": False, "overrides": ["algorithm.epsilon=1e-5"]},
                                           Path("out"))
    keys = [o.split("=")[0] for o in defaults]
    assert "algorithm.epsilon" in keys and defaults[-1] == "algorithm.epsilon=1e-5"  # only the variant's override
    assert not {"actor.max_tokens_per_microbatch", "actor.lr_schedule", "actor.loss_agg_mode"} & set(keys)
    assert "trainer.seed=3" in defaults and "actor.lr=1e-05" in defaults
    # the speed bench's default-budget run keeps the TRL twin settings but not the step-sized micro-batch
    default_budget = children.grpoflow_overrides({**spec, "microbatch": "default"}, Path("out"))
    assert not any(o.startswith("actor.max_tokens_per_microbatch=") for o in default_budget)


def test_runs_of_a_seed_add_the_variants(bench):
    learning, _ = bench
    args = learning.parse(["--variant", "eps", "algorithm.epsilon=1e-4", "--variant", "clip", "actor.grad_clip=0"])
    assert learning.runs_of(args) == [("grpoflow", "grpoflow", []), ("trl", "trl", []),
                                      ("grpoflow-eps", "grpoflow", ["algorithm.epsilon=1e-4"]),
                                      ("grpoflow-clip", "grpoflow", ["actor.grad_clip=0"])]
    assert (args.max_new_tokens, args.lr) == (16, 5e-5)  # tiny defaults
    real = learning.parse(["--model", "/some/folder", "--task", "chat_addition"])
    assert (real.max_new_tokens, real.lr) == (24, 1e-5)
