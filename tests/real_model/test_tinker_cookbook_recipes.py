"""Cookbook conformance, the rest of issue 37's set: an RL recipe with a non-default loss whose update runs, DPO,
on-policy distillation and a supervised run resumed after `kill -9`, each an unchanged tinker-cookbook recipe run as
`python -m tinker_cookbook.recipes.<name>` against conftest.py's shared `grpoflow serve tinker` on SmolLM2-135M.

Only their command-line arguments are ours; the datasets they load are bench/tinker_workdir.py's local folders.
Each test asserts from the recipe's own metrics that its optimizer steps happened and did something, and prints
the recipe's wall seconds (docs/tinker.md, "Tests")."""

import math
import signal
import time

import pytest
from cookbook_recipes import NAME, TIMEOUT_S, checkpoints, metrics

pytestmark = pytest.mark.real_model


def steps(rows: list[dict]) -> list[int]:
    return [row["step"] for row in rows]


def test_math_rl_ppo_update_runs(tmp_path, cookbook_server):
    """math_rl's arithmetic environment (no dataset: sums of two numbers up to 100, 5 tokens, a few-shot turn).
    Its reward is 1 for the right sum minus 0.1 for an answer that does not end with the renderer's stop token.
    With `renderer_name=qwen3_instruct` (ChatML, SmolLM2-Instruct's own turns; the Llama name's `role_colon` would
    need "User:" within 5 tokens) SmolLM2 ends some answers with <|im_end|> and not others (25-75 % per step), so
    a group's rewards differ and the `ppo` update (not the recipe's default loss) has non-zero advantages."""
    rows, seconds = cookbook_server.run(
        "math_rl.train", tmp_path / "math_rl", "env/all/reward/total", "env=arithmetic", "renderer_name=qwen3_instruct",
        "loss_fn=ppo", "group_size=4", "groups_per_batch=2", "max_tokens=5", "lora_rank=8", "learning_rate=1e-4",
        "max_steps=2", "save_every=0", "eval_every=0")
    assert steps(rows) == [0, 1], rows
    assert all(math.isfinite(row["env/all/reward/total"]) for row in rows), rows
    # the server's optim_step answers grad_norm, which the recipe logs; the ppo loss is -sum(min(r A, clip(r) A)),
    # so its gradient is exactly 0 when every advantage is: > 0 means some group's rewards differed and it trained
    assert all("grad_norm:mean" in row for row in rows), rows
    assert max(row["grad_norm:mean"] for row in rows) > 0, rows
    cookbook_server.assert_log_clean()
    print(f"\nmath_rl (loss_fn=ppo) {seconds:.1f} s: reward/total "
          f"{[round(r['env/all/reward/total'], 3) for r in rows]}, format {[r['env/all/format'] for r in rows]}, "
          f"grad_norm {[round(r['grad_norm:mean'], 3) for r in rows]}")


def test_dpo_moves_the_policy_from_its_reference(tmp_path, cookbook_server):
    """preference/dpo/train.py on `dataset=hhh` (the local Anthropic/hh-rlhf: the right sum chosen over a wrong one).
    Its reference is a sampling client of the initial weights, so at step 0 the policy is the reference: loss ln 2,
    margin 0; after one optim_step the policy's log-probs (forward_backward) differ from the reference's
    (compute_logprobs on the saved sampler weights)."""
    rows, seconds = cookbook_server.run("preference.dpo.train", tmp_path / "dpo", "dpo_loss", "dataset=hhh",
                                        "batch_size=4", "learning_rate=1e-4", "max_length=64", "max_steps=2")
    assert steps(rows) == [0, 1], rows
    assert abs(rows[0]["dpo_loss"] - math.log(2)) < 1e-3 and abs(rows[0]["margin"]) < 1e-3, rows[0]
    assert abs(rows[1]["margin"]) > 1e-3 and math.isfinite(rows[1]["dpo_loss"]), rows[1]
    assert all(math.isfinite(row["test/nll"]) for row in rows), rows   # its evaluator: the test split's NLL
    cookbook_server.assert_log_clean()
    print(f"\npreference.dpo.train {seconds:.1f} s: dpo_loss {[round(r['dpo_loss'], 4) for r in rows]}, "
          f"margin {[round(r['margin'], 4) for r in rows]}")


def test_on_policy_distillation_trains_the_student_away_from_the_teacher(tmp_path, cookbook_server):
    """distillation/on_policy_distillation.py on `dataset=deepmath` (the local zwhe99/DeepMath-103K), the teacher
    the same base model through the same server: the student starts as the teacher (KL ~ 0), and after one
    optim_step on the KL-penalty advantages it differs from it (the teacher's sampling client kept the base
    weights)."""
    rows, seconds = cookbook_server.run(
        "distillation.on_policy_distillation", tmp_path / "distill", "teacher_kl", f"teacher_model={NAME}",
        "dataset=deepmath", "group_size=2", "groups_per_batch=2", "max_tokens=8", "lora_rank=8", "max_steps=2",
        "save_every=0", "eval_every=0")
    assert steps(rows) == [0, 1], rows
    assert all("grad_norm:mean" in row for row in rows), rows   # optim_step ran at every step
    # teacher_kl is the mean of log p_student - log p_teacher over the student's own samples: an estimate, of
    # either sign; at step 0 the two models are the same weights (1e-6 here), after it they are not (3e-3)
    assert abs(rows[0]["teacher_kl"]) < 1e-4, rows[0]
    assert abs(rows[1]["teacher_kl"]) > 5e-4, rows[1]
    cookbook_server.assert_log_clean()
    print(f"\ndistillation.on_policy_distillation {seconds:.1f} s: teacher_kl "
          f"{[round(r['teacher_kl'], 5) for r in rows]}")


def test_sl_loop_resumes_after_kill_9(tmp_path, cookbook_server):
    """sl_loop.py with save_every=2, max_steps=4: its checkpoint at step 2 is taken before step 2 trains; SIGKILL the
    recipe once step 2 is logged, then run the same command again. The recipe's own resume
    (checkpoint_utils.get_last_checkpoint(log_path): the last checkpoints.jsonl row with a state_path) loads that
    state with its optimizer from the server and redoes steps 2 and 3. Step 2's batch is the same (the recipe
    shuffles with seed 0) and its loss is taken before the update, so the resumed step 2 must report the killed
    run's train_mean_nll: the server restored the trained weights, not the base model's."""
    log_path = tmp_path / "sl_resume"
    args = ("batch_size=4", "lora_rank=8", "learning_rate=1e-3", "max_steps=4", "save_every=2")
    t0 = time.perf_counter()
    proc = cookbook_server.start("sl_loop", log_path, *args)
    try:
        deadline = time.time() + TIMEOUT_S
        while proc.poll() is None and time.time() < deadline:
            if (log_path / "metrics.jsonl").exists() and 2 in steps(metrics(log_path, "train_mean_nll")):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        killed_with = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_s = time.perf_counter() - t0
    saved, killed = checkpoints(log_path), metrics(log_path, "train_mean_nll")
    output = log_path.with_suffix(".out").read_text()
    assert killed_with == -signal.SIGKILL, f"the recipe ended ({killed_with}) before it was killed:\n{output[-4000:]}"
    assert [c["batch"] for c in saved] == [2] and steps(killed) == [0, 1, 2], (saved, killed)

    rows, rerun_s = cookbook_server.run("sl_loop", log_path, "train_mean_nll", *args)
    output = log_path.with_suffix(".out").read_text()
    assert "Resuming from batch 2" in output, output[-4000:]
    resumed = rows[len(killed):]
    assert steps(resumed) == [2, 3], resumed
    assert abs(resumed[0]["train_mean_nll"] - killed[2]["train_mean_nll"]) < 1e-4, (killed, resumed)
    cookbook_server.assert_log_clean()
    print(f"\nsl_loop killed -9 after step 2 ({killed_s:.1f} s), resumed from its checkpoint ({rerun_s:.1f} s): "
          f"train_mean_nll at step 2 {killed[2]['train_mean_nll']:.5f} killed, {resumed[0]['train_mean_nll']:.5f} "
          f"resumed")


def test_rl_numerics_check_finds_the_sampler_and_the_trainer_agree(tmp_path, cookbook_server):
    """rl_numerics_check/train.py (a many-turn `read_page` tool task; the cookbook's check of RL numerics), small:
    documents of 2-3 pages of 400 characters of the local text (bench/tinker_workdir.py's Salesforce/wikitext),
    2 groups of 2, 24 tokens a turn, ChatML turns (SmolLM2-Instruct's, as math_rl's test). It logs
    optim/kl_sample_train_v1, the mean over sampled tokens of the sampler's log-prob minus the trainer's, and _v2,
    half their mean squared difference. Its README's healthy runs: v1 ~2e-4 on a dense 27B model, 1-2e-3 on an MoE;
    a long-context bug it caught: 0.09. Here the server's HF engine and trainer agree to float32 rounding: v1
    -7e-7 .. 6e-7, v2 ~3e-11. The bound on v1 catches a one-signed offset as small as the sampler's float32
    log-softmax had over SmolLM2's 49,152 logits before b2624c5 (v1 8.9e-6 and 9.4e-6 in this test then)."""
    rows, seconds = cookbook_server.run(
        "rl_numerics_check.train", tmp_path / "numerics", "optim/kl_sample_train_v1", "renderer_name=qwen3_instruct",
        "group_size=2", "groups_per_batch=2", "max_tokens=24", "lora_rank=8", "max_steps=2", "save_every=0",
        "eval_every=0", "task.num_pages_min=2", "task.num_pages_max=3", "task.page_chars=400",
        "max_trajectory_tokens=4096", "behavior_if_log_dir_exists=delete")
    assert steps(rows) == [0, 1], rows
    for row in rows:
        assert abs(row["optim/kl_sample_train_v1"]) < 3e-6 and 0 <= row["optim/kl_sample_train_v2"] < 1e-9, row
    cookbook_server.assert_log_clean()
    v1, v2 = ([f"{r[k]:.2e}" for r in rows] for k in ("optim/kl_sample_train_v1", "optim/kl_sample_train_v2"))
    print(f"\nrl_numerics_check {seconds:.1f} s: kl_sample_train_v1 {v1}, v2 {v2} (healthy in its README: v1 ~2e-4 "
          "on a dense model)")
