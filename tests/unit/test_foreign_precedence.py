"""verl's and TRL's settings as they count them (issue 52): an explicit step count beats epochs, sizes no run can
take refused naming the key, Hydra's prefixes, TRL field names on the command line, the run folder verl would
name, and `grpoflow translate` output that runs as a shell script. Config-level: milliseconds each."""

import os
import shlex
import subprocess
import textwrap

import pytest

from grpoflow.commands.translate import script_text, translate_file
from grpoflow.config.foreign.verl_script import verl_script_pairs
from grpoflow.config import ConfigError, load_config


def loaded(*args, recipe=None):
    notes: list[str] = []
    return load_config(recipe, list(args), notes), "\n".join(filter(None, notes))


# ---------------------------------------------------------------- steps


@pytest.mark.parametrize("args", [
    ["trainer.total_epochs=15", "trainer.total_training_steps=2"],    # verl
    ["trainer.total_training_steps=2", "trainer.total_epochs=15"],    # the order does not matter
    ["num_train_epochs=15", "max_steps=2"],                           # TRL's field names
    ["trainer.total_epochs=15", "trainer.total_steps=2"],             # ours
])
def test_an_explicit_step_count_beats_epochs_and_says_so(args):
    cfg, notes = loaded("model.path=/m", *args)
    assert (cfg.trainer.total_steps, cfg.trainer.total_epochs) == (2, None)
    assert "trainer.total_steps=2 wins over trainer.total_epochs=15" in notes


def test_epochs_on_the_command_line_replace_a_recipes_step_count(tmp_path):
    (tmp_path / "r.yaml").write_text("trainer:\n  total_steps: 40\n")
    cfg, notes = loaded("model.path=/m", "trainer.total_epochs=3", recipe=str(tmp_path / "r.yaml"))
    assert cfg.trainer.total_epochs == 3 and "trainer.total_epochs=3 (the command line) replaces" in notes
    cfg, notes = loaded("model.path=/m", "trainer.total_epochs=3")  # epochs alone: nothing to decide
    assert cfg.trainer.total_epochs == 3 and "steps:" not in notes


def test_trl_max_steps_minus_one_is_unset_so_epochs_count(tmp_path):
    (tmp_path / "trl.yaml").write_text("max_steps: -1\nnum_train_epochs: 2\nlearning_rate: 1.0e-6\n")
    cfg, notes = loaded("model.path=/m", recipe=str(tmp_path / "trl.yaml"))
    assert (cfg.trainer.total_epochs, cfg.trainer.total_steps) == (2, 150) and "max_steps=-1" in notes


def test_translate_says_which_won_and_prints_only_the_winner(tmp_path):
    (tmp_path / "trl.yaml").write_text("max_steps: 10\nnum_train_epochs: 2\n")
    command, notes = translate_file("trl", str(tmp_path / "trl.yaml"))
    assert "trainer.total_steps=10" in command and "total_epochs" not in command
    assert any("trainer.total_steps=10 wins over trainer.total_epochs=2" in n for n in notes)


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("args, says", [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=0"], "ppo_mini_batch_size=0 is not a size"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=-8"], "ppo_mini_batch_size=-8 is not a size"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=0.5"], "ppo_mini_batch_size=0.5 is not a size"),
    (["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=12"],
     "ppo_mini_batch_size=12 does not divide data.train_batch_size=32"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"], "ppo_micro_batch_size_per_gpu=0 is not a size"),
    (["num_generations=0"], "num_generations=0 is not a size"),
    (["gradient_accumulation_steps=0"], "gradient_accumulation_steps=0 is not a size"),
    (["gradient_accumulation_steps=null"], "gradient_accumulation_steps=null is not a size"),
    (["num_generations=4", "per_device_train_batch_size=6"], "= 6 completions is not a multiple of num_generations=4"),
])
def test_sizes_no_run_can_take_are_refused_in_one_line_naming_the_key(args, says):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.path=/m", *args])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_trl_recipe_with_zero_generations_is_refused_not_divided_by(tmp_path):
    (tmp_path / "trl.yaml").write_text("num_generations: 0\nper_device_train_batch_size: 8\n")
    with pytest.raises(ConfigError, match="num_generations=0 is not a size"):
        load_config(str(tmp_path / "trl.yaml"), ["model.path=/m"])
    with pytest.raises(ConfigError, match="num_generations=0 is not a size"):
        translate_file("trl", str(tmp_path / "trl.yaml"))


# ---------------------------------------------------------------- the command line


def test_hydras_add_prefixes_are_read_and_delete_is_answered():
    cfg, _ = loaded("model.path=/m", "+trainer.total_steps=3", "++actor.lr=2e-6", "+actor_rollout_ref.rollout.n=4")
    assert (cfg.trainer.total_steps, cfg.actor.lr, cfg.rollout.n) == (3, 2e-6, 4)
    with pytest.raises(ConfigError, match=r"`~trainer.logger` deletes a key in Hydra.*leave `trainer.logger` out"):
        load_config(None, ["~trainer.logger"])


def test_trl_field_names_are_read_on_the_command_line():
    cfg, notes = loaded("model.path=/m", "output_dir=/tmp/o", "learning_rate=3e-6", "num_generations=4",
                        "per_device_train_batch_size=16")
    assert (cfg.trainer.output_dir, cfg.actor.lr, cfg.rollout.n, cfg.data.prompts_per_step) == ("/tmp/o", 3e-6, 4, 4)
    assert "output_dir=/tmp/o -> trainer.output_dir=/tmp/o" in notes


def test_verls_project_and_experiment_name_the_run_folder_unless_one_is_given():
    cfg, notes = loaded("model.path=/m", "trainer.project_name=gsm8k", "trainer.experiment_name=qwen_a")
    assert cfg.trainer.output_dir == "checkpoints/gsm8k/qwen_a" and "verl's folder" in notes
    cfg, _ = loaded("model.path=/m", "trainer.experiment_name=qwen_b")
    assert cfg.trainer.output_dir == "checkpoints/verl_examples/qwen_b"  # verl's default project_name
    cfg, _ = loaded("model.path=/m", "trainer.project_name=gsm8k", "trainer.output_dir=mine")
    assert cfg.trainer.output_dir == "mine"
    cfg, _ = loaded("model.path=/m", "trainer.project=gsm8k")  # ours names the W&B project only
    assert cfg.trainer.output_dir == "runs/default"


def test_the_builtin_recipes_reward_gives_way_on_the_users_own_data():
    cfg, notes = loaded("data.train_files=[rows.jsonl]")  # the built-in model, the user's rows
    assert cfg.reward.function == "auto" and "scored by each row's data_source" in notes
    assert loaded("data.train_files=[rows.jsonl]", "reward.function=gsm8k")[0].reward.function == "gsm8k"
    assert loaded()[0].reward.function == "exact_match"  # the built-in job as it is
    assert loaded("data.train_files=[builtin:chat_addition/train]")[0].reward.function == "exact_match"


# ---------------------------------------------------------------- translate verl


SCRIPT = textwrap.dedent("""\
    set -x
    gsm8k_train_path=$HOME/data/gsm8k/train.parquet
    export MODEL="/models/qwen"
    train_files="['$gsm8k_train_path']"
    stamp=$(date +%s)
    python3 -m verl.trainer.main_ppo \\
        data.train_files="$train_files" \\
        data.val_files=${VAL:-/data/val.parquet} \\
        actor_rollout_ref.model.path=$MODEL \\
        trainer.experiment_name=run_$stamp \\
        trainer.default_local_dir=$OUT_DIR \\
        +trainer.total_epochs=15 trainer.total_training_steps=2 $@
    """)


def test_translate_verl_expands_the_scripts_own_variables_and_warns_per_dollar_it_cannot(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.delenv("OUT_DIR", raising=False)
    warnings: list[str] = []
    pairs = dict(verl_script_pairs(SCRIPT, warnings))
    assert pairs["data.train_files"] == ["/home/u/data/gsm8k/train.parquet"]
    assert pairs["data.val_files"] == "/data/val.parquet" and pairs["actor_rollout_ref.model.path"] == "/models/qwen"
    assert pairs["trainer.total_epochs"] == 15  # Hydra's `+` dropped
    assert len(warnings) == 2 and "$stamp" in warnings[0] and "$OUT_DIR" in warnings[1]


def test_translate_verls_output_runs_as_a_script(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.setenv("OUT_DIR", "/runs/o")
    (tmp_path / "run.sh").write_text(SCRIPT)
    command, notes = translate_file("verl", str(tmp_path / "run.sh"))
    (tmp_path / "out.sh").write_text(script_text(command, notes))
    # a stand-in `grpoflow` that prints the words it was given, one per line
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "grpoflow").write_text('#!/bin/sh\nfor w in "$@"; do echo "$w"; done\n')
    (tmp_path / "bin" / "grpoflow").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", str(tmp_path / "out.sh")], capture_output=True, text=True, env=env, check=True)
    words = out.stdout.splitlines()
    assert words[0] == "train" and out.stderr == ""
    cfg = load_config(None, words[1:])
    assert (cfg.trainer.total_steps, cfg.trainer.total_epochs, cfg.trainer.output_dir) == (2, None, "/runs/o")
    assert any(n.startswith("steps: trainer.total_steps=2 wins") for n in notes)
    (tmp_path / "named.sh").write_text(SCRIPT.replace("trainer.default_local_dir=$OUT_DIR", ""))
    command, notes = translate_file("verl", str(tmp_path / "named.sh"))  # the folder verl would name, and why
    assert "trainer.output_dir=checkpoints/verl_examples/run_$stamp" in command
    assert any(n.startswith("trainer.output_dir=checkpoints/verl_examples/run_$stamp: verl's folder") for n in notes)


def test_translate_trl_with_reward_weights_says_to_add_the_functions(tmp_path):
    (tmp_path / "trl.yaml").write_text("reward_weights: [1.0, 0.5]\nlearning_rate: 1.0e-6\n")
    command, notes = translate_file("trl", str(tmp_path / "trl.yaml"))
    assert shlex.split(command)[2] == "reward.weights=[1.0, 0.5]"
    assert any("add reward.functions=" in n and "2 functions" in n for n in notes)


def test_num_generations_alone_is_rollout_n_with_our_prompts_per_step():
    cfg, _ = loaded("model.path=/m", "num_generations=3", "data.prompts_per_step=4")
    assert (cfg.rollout.n, cfg.data.prompts_per_step) == (3, 4)


def test_a_verl_key_given_twice_converts_once_with_its_later_value():
    """verl scripts end in `$@`, so a user shortens a run by repeating keys: the later value wins, as in Hydra."""
    mini = "actor_rollout_ref.actor.ppo_mini_batch_size"
    cfg, notes = loaded("model.path=/m", "data.train_batch_size=1024", f"{mini}=256",
                        "data.train_batch_size=2", f"{mini}=2")
    assert (cfg.data.prompts_per_step, cfg.actor.minibatches) == (2, 1)
    assert "ppo_mini_batch_size=256" not in notes


def test_translate_verl_warns_of_an_engine_setting_the_run_refuses(tmp_path):
    """verl's run_qwen2-7b.sh asks for vLLM with tensor parallel 2: translate says so before the first try."""
    (tmp_path / "run.sh").write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=/m \\\n"
                                     "    actor_rollout_ref.rollout.name=vllm \\\n"
                                     "    actor_rollout_ref.rollout.tensor_model_parallel_size=2\n")
    _, notes = translate_file("verl", str(tmp_path / "run.sh"))
    assert any(n.startswith("WARNING: the command is refused as it is: rollout.tensor_parallel_size=2 with "
                            "rollout.engine=vllm") and n.endswith("rollout.engine=hf rollout.tensor_parallel_size=1 "
                                                                  "(nothing to install).") for n in notes)
    (tmp_path / "run.sh").write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=/m\n")
    assert not any("refused" in n for n in translate_file("verl", str(tmp_path / "run.sh"))[1])
