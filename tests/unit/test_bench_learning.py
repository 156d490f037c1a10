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


def piece(task: str, label: str, seed_accuracies: dict[int, float], before: float = 0.3) -> dict:
    """A `--out` file of learning.py as one piece of a study writes it (only the fields --merge reads)."""
    args = {"task": task, "model": "m", "steps": 10, "prompts": 8, "group_size": 8, "max_new_tokens": 24,
            "lr": 1e-5, "compute_dtype": "bfloat16", "variant": []}
    return {"args": args, "before": {"accuracy": before},
            "runs": {label: [{"seed": s, "accuracy": a} for s, a in seed_accuracies.items()]}}


def test_merge_puts_pieces_together_per_task_and_overall(bench, tmp_path):
    learning, _ = bench
    pieces = {"a_g.json": piece("a", "grpoflow", {0: 0.4, 1: 0.5}), "a_t.json": piece("a", "trl", {0: 0.3, 1: 0.4}),
              "b_g.json": piece("b", "grpoflow", {0: 0.6}, before=0.5), "b_g1.json": piece("b", "grpoflow", {1: 0.8},
                                                                                            before=0.5),
              "b_t.json": piece("b", "trl", {0: 0.5, 1: 0.5}, before=0.5)}
    for name, p in pieces.items():
        (tmp_path / name).write_text(__import__("json").dumps(p))
    table = learning.merge(sorted(tmp_path.glob("*.json")))
    # task a: grpoflow gains 0.1, 0.2 (mean 15.0%, SE 5.0%); trl 0.0, 0.1 (5.0% ± 5.0%); difference 10.0% ± 7.1%
    assert "| a | 30.0% | 0 1 | 45.0% ± 5.0% | +15.0% ± 5.0% | 35.0% ± 5.0% | +5.0% ± 5.0% | +10.0% ± 7.1% |" in table
    # task b from two grpoflow pieces: gains 0.1, 0.3 (20.0% ± 10.0%); trl 0.0, 0.0
    assert ("| b | 50.0% | 0 1 | 70.0% ± 10.0% | +20.0% ± 10.0% | 50.0% ± 0.0% | +0.0% ± 0.0% | +20.0% ± 10.0% |"
            in table)
    # overall: the mean of the task means, SE = sqrt(sum SE^2) / tasks: grpoflow 17.5% ± sqrt(.05^2 + .1^2) / 2 = 5.6%
    assert "| overall (2 of 2 tasks) | | |  | +17.5% ± 5.6% |  | +2.5% ± 2.5% | +15.0% ± 6.1% |" in table
    (tmp_path / "again.json").write_text(__import__("json").dumps(piece("a", "trl", {1: 0.9})))
    with pytest.raises(SystemExit, match="trl seed \\[1\\] of a is in two pieces"):
        learning.merge(sorted(tmp_path.glob("*.json")))


def test_merge_refuses_pieces_of_another_shape_and_counts_only_complete_tasks(bench, tmp_path):
    learning, _ = bench
    other = piece("a", "trl", {0: 0.3})
    other["args"]["steps"] = 16
    paths = [tmp_path / "g.json", tmp_path / "t.json"]
    paths[0].write_text(__import__("json").dumps(piece("a", "grpoflow", {0: 0.4})))
    paths[1].write_text(__import__("json").dumps(other))
    with pytest.raises(SystemExit, match="merge only pieces of one shape"):
        learning.merge(paths)
    paths[1].write_text(__import__("json").dumps(piece("a", "trl", {0: 0.3}, before=0.25)))
    with pytest.raises(SystemExit, match="their held-out rows differ"):
        learning.merge(paths)
    paths[1].write_text(__import__("json").dumps(piece("b", "trl", {0: 0.3})))
    table = learning.merge(paths)   # neither task has both frameworks yet: no overall row
    assert "not run" in table and "overall" not in table
    assert "| a | 30.0% | 0 | 40.0% (1 seed) | +10.0% (1 seed) | not run |" in table   # one seed: no SE, not "± 0"


def test_reasoning_gym_held_out_questions_are_not_training_questions(bench):
    pytest.importorskip("reasoning_gym")
    import rg_task
    for task in rg_task.STUDY_TASKS:
        train, held = rg_task.rg_splits(task)
        assert len(held) == rg_task.HELDOUT_SIZE, task   # new questions (seeds 1 and 2 would replay the training ones)
        assert len({r["prompt"][0]["content"] for r in held}) == len(held), task   # each once
        assert not {r["prompt"][0]["content"] for r in held} & {r["prompt"][0]["content"] for r in train}
        assert all(r["prompt"][0]["content"].endswith(rg_task.ONLY_THE_NUMBER) for r in held)
