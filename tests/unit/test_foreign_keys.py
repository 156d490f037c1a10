"""verl's keys and TRL's GRPOConfig fields through the config (grpoflow/config/foreign/, translate.py): every row of
docs/migrating.md's two tables, a whole verl example script, a TRL YAML, all unknown keys at once, and hints that
never point at an unrelated key."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from grpoflow.config import ConfigError, load_config
from grpoflow.config.foreign.trl import translate_trl, trl_category
from grpoflow.config.foreign.verl import translate_verl, verl_category
from grpoflow.commands.translate import translate_file

DOC = Path(__file__).parents[2] / "docs" / "migrating.md"
ROW = re.compile(r"^\| `([^`]+)` \| `([^`]*)` \| (ours|converted|n/a|missing) \| (.*) \|$")


def table(title: str) -> list[tuple[str, object, str, str]]:
    text = DOC.read_text().split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            key, example, kind, ours = m.groups()
            try:
                value = json.loads(example)
            except json.JSONDecodeError:
                value = example
            rows.append((key, value, kind, ours))
    return rows


def as_overrides(pairs):
    return [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
            for k, v in pairs]


@pytest.mark.parametrize("key, value, kind, ours", table("verl keys"))
def test_every_verl_key_of_the_table_goes_through_the_config(key, value, kind, ours):
    key = key.removesuffix("*") + ("param_offload" if key.endswith("*") else "")
    assert verl_category(key) == kind
    t = translate_verl([(key, value)])
    assert not t.unknown
    load_config(None, as_overrides(t.overrides))  # what it becomes is a valid config
    if kind == "ours":
        assert t.overrides and t.overrides[0][0] == re.search(r"`([^`]+)`", ours).group(1)
    if kind in ("n/a", "missing"):
        assert t.overrides == [] and (key in " ".join(t.not_applicable + t.missing))


@pytest.mark.parametrize("key, value, kind, ours", table("TRL GRPOConfig fields"))
def test_every_trl_field_of_the_table_goes_through_the_config(key, value, kind, ours):
    assert trl_category(key) == kind
    t = translate_trl({key: value})
    assert not t.unknown
    needs = ["reward.functions=[exact_match]"] if key == "reward_weights" else []  # one weight per function
    load_config(None, as_overrides(t.overrides) + needs)
    if kind == "ours":
        assert t.overrides[0][0] == re.search(r"`([^`]+)`", ours).group(1)


def test_the_tables_hold_the_counts_the_notes_give():
    kinds = [r[2] for r in table("verl keys")]
    assert len(kinds) >= 130 and kinds.count("ours") >= 60
    assert len(table("TRL GRPOConfig fields")) >= 60


VERL_SCRIPT = textwrap.dedent("""\
    set -x
    python3 -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=grpo \\
        data.train_files=$HOME/data/gsm8k/train.parquet \\
        data.train_batch_size=1024 \\
        data.max_prompt_length=512 \\
        data.max_response_length=1024 \\
        data.filter_overlong_prompts=True \\
        data.truncation='error' \\
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \\
        actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 \\
        actor_rollout_ref.actor.use_kl_loss=True \\
        actor_rollout_ref.actor.kl_loss_coef=0.001 \\
        actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
        actor_rollout_ref.actor.fsdp_config.param_offload=False \\
        actor_rollout_ref.rollout.name=vllm \\
        actor_rollout_ref.rollout.n=5 \\
        trainer.logger=['console','wandb'] \\
        trainer.n_gpus_per_node=8 \\
        trainer.test_freq=5 \\
        trainer.total_epochs=15 $@
    """)


def test_a_verl_script_translates_with_its_units_converted(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    (tmp_path / "run.sh").write_text(VERL_SCRIPT)
    command, notes = translate_file("verl", str(tmp_path / "run.sh"))
    assert command.startswith("grpoflow train ")
    cfg = load_config(None, __import__("shlex").split(command.replace("\\\n", ""))[2:])  # one line per key
    assert (cfg.data.prompts_per_step, cfg.actor.minibatches, cfg.rollout.n, cfg.rollout.max_new_tokens) == \
        (1024, 4, 5, 1024)
    assert (cfg.actor.kl_coef, cfg.actor.kl_estimator, cfg.data.overlong) == (0.001, "k3", "drop")
    assert cfg.actor.max_tokens_per_microbatch == 40 * (512 + 1024) and cfg.trainer.total_epochs == 15
    assert cfg.data.train_files == ["/home/u/data/gsm8k/train.parquet"] and cfg.trainer.val_every == 5
    assert "trainer.n_gpus_per_node" in notes[0] and "wandb" in cfg.trainer.loggers


def test_verl_keys_are_taken_on_the_command_line_as_they_are():
    notes: list[str] = []
    cfg = load_config(None, ["actor_rollout_ref.rollout.n=4", "data.train_batch_size=16",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                             "actor_rollout_ref.actor.use_kl_loss=False",
                             "actor_rollout_ref.actor.kl_loss_coef=0.5", "rollout.temperature=0.7"], notes)
    assert (cfg.rollout.n, cfg.data.prompts_per_step, cfg.actor.minibatches, cfg.actor.kl_coef) == (4, 16, 2, 0.0)
    assert cfg.rollout.temperature == 0.7 and "actor_rollout_ref.rollout.n -> rollout.n=4" in notes[0]


def test_a_trl_grpo_config_yaml_is_a_recipe(tmp_path):
    (tmp_path / "trl.yaml").write_text(textwrap.dedent("""\
        learning_rate: 3.0e-6
        num_generations: 4
        per_device_train_batch_size: 16
        gradient_accumulation_steps: 2
        max_completion_length: 128
        loss_type: dr_grpo
        epsilon: 0.2
        epsilon_high: 0.28
        lr_scheduler_type: linear
        beta: 0.04
        bf16: false
        logging_steps: 5
        """))
    notes: list[str] = []
    cfg = load_config(str(tmp_path / "trl.yaml"), ["model.path=/m"], notes)
    assert (cfg.actor.lr, cfg.rollout.n, cfg.data.prompts_per_step, cfg.rollout.max_new_tokens) == (3e-6, 4, 8, 128)
    assert (cfg.actor.loss_agg_mode, cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == \
        ("seq-mean-token-sum-norm", 0.2, 0.28)
    assert (cfg.actor.lr_schedule, cfg.actor.min_lr_ratio, cfg.actor.kl_coef) == ("linear", 0.0, 0.04)
    assert cfg.model.compute_dtype == "float32" and "TRL" in notes[0]


def test_every_unknown_key_is_reported_at_once_and_hints_stay_in_their_section():
    keys = [f"actor.not_a_key_{i}=1" for i in range(28)] + ["actor.lrr=1", "trainer.test_freqq=3"]
    with pytest.raises(ConfigError) as e:
        load_config(None, keys)
    text = str(e.value)
    assert "30 problems" in text and all(f"not_a_key_{i}`" in text for i in range(28))
    assert "Did you mean `actor.lr`" in text and "trainer.seed" not in text


def test_grpoflow_config_checks_keys_without_importing_torch():
    code = ("import sys; from grpoflow.cli import main; "
            "rc = main(['config'] + [f'actor.bad_{i}=1' for i in range(30)]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("Unknown config key") == 30, out.stderr


def test_lr_schedules_hand_values():
    from grpoflow.training.engine import lr_multiplier
    # linear (TRL's default, to 0): 1 - progress; 10 steps after 2 of warm-up: step 7 is 5/10 of the way
    assert lr_multiplier(7, warmup_steps=2, total_steps=12, schedule="linear", min_lr_ratio=0.0) == 0.5
    # to min_lr_ratio 0.1: 0.1 + 0.9 x 0.5
    assert lr_multiplier(7, warmup_steps=2, total_steps=12, schedule="linear", min_lr_ratio=0.1) == pytest.approx(0.55)
    # cosine half way: 0.5 (1 + cos(pi/2)) = 0.5; warm-up step 0 of 2: 1/2; constant: 1
    assert lr_multiplier(7, warmup_steps=2, total_steps=12, schedule="cosine", min_lr_ratio=0.0) == pytest.approx(0.5)
    assert lr_multiplier(0, warmup_steps=2, total_steps=12, schedule="linear") == 0.5
    assert lr_multiplier(9, total_steps=12, schedule="constant") == 1.0
