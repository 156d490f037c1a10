"""`grpoflow train` end to end on tiny models: metrics, determinism, the reference and old-log-prob paths."""

import json


from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train

REQUIRED = ["critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm",
            "response_length/mean", "timing_s/gen", "timing_s/reward", "timing_s/adv", "timing_s/update_actor",
            "timing_s/sync", "timing_s/step", "perf/throughput"]


def small(out, *extra):
    return load_config(None, [f"trainer.output_dir={out}", "model.path=builtin:tiny-0.5m", "sft.steps=20",
                              "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=5",
                              "trainer.total_steps=3", "trainer.val_every=2", "data.val_max_prompts=16",
                              "trainer.log_every=1", *extra])


def test_default_pipeline_writes_metrics(tmp_path):
    result = train(small(tmp_path / "run", "actor.kl_coef=0.05", "actor.minibatches=2"))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert set(rows[0]) == {"step", "val/addition/mean@1", "val/mean@1"}       # validation before step 1
    for r in rows[1:]:
        missing = [k for k in REQUIRED + ["actor/kl_loss", "timing_s/ref", "timing_s/old_log_prob"] if k not in r]
        assert not missing, missing
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        # the actor's own model math, inside its update (what bench/children.py reads instead of wrapping functions)
        assert 0 < r["timing_s/train_forward"] < r["timing_s/forward_backward"] < r["timing_s/update_actor"]
        assert 0 < r["timing_s/optimizer"] < r["timing_s/update_actor"]
    assert "val/addition/mean@1" in rows[2] and "val/addition/mean@1" in rows[3]  # every 2 steps and at the end
    assert result["before"]["val/mean@1"] == rows[0]["val/mean@1"]
    assert (tmp_path / "run" / "config.yaml").exists() and (tmp_path / "run" / "sft_model" / "config.json").exists()


def test_on_policy_skips_reference_and_old_log_prob(tmp_path):
    train(small(tmp_path / "run", "trainer.val_every=0"))
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 3
    assert "timing_s/ref" not in rows[0] and "timing_s/old_log_prob" not in rows[0]
    assert "actor/kl_loss" not in rows[0]
    assert rows[0]["actor/ppo_kl"] == 0.0   # ratio exactly 1 on-policy


def test_same_seed_same_metrics(tmp_path):
    def run(name):
        train(small(tmp_path / name, "actor.minibatches=2"))
        return [{k: v for k, v in r.items() if not k.startswith(("timing_s", "perf"))}
                for r in read_metrics(tmp_path / name)]

    assert json.dumps(run("a")) == json.dumps(run("b"))
