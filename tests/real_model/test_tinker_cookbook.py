"""Cookbook conformance (issue 37): tinker-cookbook's own `sl_loop` and `rl_loop` recipes, unchanged, run as
`python -m tinker_cookbook.recipes.<name>` against `grpoflow serve tinker` on SmolLM2-135M, two steps each.

Only their command-line arguments are ours (tiny batches so that a step takes seconds); their hub downloads are the
local folders that bench/tinker_workdir.py writes (docs/tinker.md, "tinker-cookbook recipes, unchanged"). The server
and its folder are conftest.py's `cookbook_server`, shared with test_tinker_cookbook_recipes.py."""

import math

import pytest

pytestmark = pytest.mark.real_model

SMALL = ("lora_rank=8", "learning_rate=1e-4", "max_steps=2", "save_every=0")


def test_sl_loop_and_rl_loop_run_unchanged_against_the_server(tmp_path, cookbook_server):
    sl, sl_s = cookbook_server.run("sl_loop", tmp_path / "sl_loop", "train_mean_nll", *SMALL, "batch_size=4")
    rl, rl_s = cookbook_server.run("rl_loop", tmp_path / "rl_loop", "reward/total", *SMALL, "batch_size=2",
                                   "group_size=2", "max_tokens=8",
                                   "loss_fn=importance_sampling")   # the recipe's default, stable_reinforce, is refused

    assert [row["step"] for row in sl] == [0, 1], sl
    assert all(math.isfinite(row["train_mean_nll"]) and row["train_mean_nll"] > 0 for row in sl), sl
    assert [row["step"] for row in rl] == [0, 1], rl
    assert all(0 <= row["reward/total"] <= 1 for row in rl), rl   # NaN fails this too
    cookbook_server.assert_log_clean()
    print(f"\ntinker-cookbook against grpoflow serve tinker: sl_loop {sl_s:.1f} s, train_mean_nll "
          f"{[round(r['train_mean_nll'], 3) for r in sl]}; rl_loop {rl_s:.1f} s, reward/total "
          f"{[r['reward/total'] for r in rl]}")
