"""A reasoning-gym task trains end to end on the tiny model with the task's own verifier as the reward: single
turn (`reward.function=reasoning_gym`) and with retries (`rollout.multi_turn.env=reasoning_gym`), against the real
package."""

import json

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")

from grpoflow.config import load_config  # noqa: E402
from grpoflow.controller.metrics import read_metrics  # noqa: E402
from grpoflow.commands.run import train  # noqa: E402

SPEC = "reasoning_gym:chain_sum?size=32&seed=1&min_terms=2&max_terms=2&max_digits=1"
BASE = ["model.path=builtin:tiny-0.5m", "sft.steps=20", "data.max_prompt_length=160", "sft.response_key=demo",
        f"data.train_files={SPEC}", "data.prompts_per_step=4", "rollout.n=4", "trainer.total_steps=2",
        "trainer.log_every=1", "trainer.save_every=0", "trainer.resume=never", "data.val_max_prompts=8"]


def test_single_turn_run_is_scored_by_the_tasks_verifier(tmp_path):
    out = tmp_path / "run"
    train(load_config(None, BASE + [f"trainer.output_dir={out}", "reward.function=reasoning_gym",
                                    "rollout.max_new_tokens=6", "trainer.val_every=2"]))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "val/reasoning_gym/chain_sum/mean@1" in rows[0]  # the default held-out split: seed 1 + 32, past training
    # every logged validation sample's score is the task's score_answer on its completion
    held_out = reasoning_gym.create_dataset("chain_sum", size=32, seed=33, min_terms=2, max_terms=2, max_digits=1)
    by_question = {e["question"]: e for e in held_out}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples
    for s in samples:
        entry = next(e for q, e in by_question.items() if q in s["prompt"])
        assert s["score"] == held_out.score_answer(s["completion"].strip(), entry)


def test_the_retry_environment_trains_and_tells_the_model_it_was_wrong(tmp_path):
    out = tmp_path / "run"
    train(load_config(None, BASE + [f"trainer.output_dir={out}", "rollout.multi_turn.env=reasoning_gym",
                                    "reward.function=null", "rollout.multi_turn.max_turns=2",
                                    "rollout.max_new_tokens=96", "trainer.val_every=0", "trainer.log_train_groups=4"]))
    steps = [r for r in read_metrics(out) if "timing_s/step" in r]
    assert len(steps) == 2 and all("reward/env/mean" in r for r in steps)
    groups = [json.loads(line) for line in (out / "train_samples.jsonl").read_text().splitlines()]
    conversations = [s["conversation"] for g in groups for s in g["samples"]]
    retried = [c for c in conversations if sum(m["role"] == "assistant" for m in c) == 2]
    assert retried, "a wrong first answer should be followed by a second turn"
    for c in retried:
        assert {"role": "user", "content": "That is not right. Try again."} in c
