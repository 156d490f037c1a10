"""Cookbook conformance (issue 37): tinker-cookbook's own `sl_loop` and `rl_loop` recipes, unchanged, run as
`python -m tinker_cookbook.recipes.<name>` against `grpoflow serve tinker` on SmolLM2-135M, two steps each.

Only their command-line arguments are ours (tiny batches so that a step takes seconds); their hub downloads are the
local folders that bench/tinker_workdir.py writes (docs/tinker.md, "tinker-cookbook recipes, unchanged")."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model

REPO = Path(__file__).resolve().parents[2]
# the recipes' hub name for the model: the server maps it to SmolLM2 (tinker.model_name), and the cookbook's
# tokenizer and renderer table find it as a folder in the working directory (bench/tinker_workdir.py links it)
NAME = "meta-llama/Llama-3.2-1B"
TIMEOUT_S = 240  # per recipe; the whole test takes about 70 s on a 2-core CPU


def by_path(relative: str):
    """A module of this repository outside the test's import path (bench/ and tests/integration/), by its file."""
    spec = importlib.util.spec_from_file_location(Path(relative).stem, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


server_process = by_path("tests/integration/tinker_server_process.py")


def run_recipe(recipe: str, workdir: Path, url: str, *args: str) -> list[dict]:
    """Run one recipe in `workdir` to its end; its metrics.jsonl rows."""
    log_path = workdir / recipe
    env = dict(os.environ, TINKER_API_KEY=server_process.API_KEY, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(workdir / "hf-datasets"), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", f"tinker_cookbook.recipes.{recipe}", f"base_url={url}", f"model_name={NAME}",
           f"log_path={log_path}", "lora_rank=8", "learning_rate=1e-4", "max_steps=2", "save_every=0", *args]
    out = subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=TIMEOUT_S)
    assert out.returncode == 0, f"{recipe} exited {out.returncode}:\n{out.stdout[-4000:]}"
    final = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    # the recipe's last call, save_checkpoint(kind="both"): save_state and save_weights_for_sampler answered paths
    assert final["name"] == "final" and final["state_path"] and final["sampler_path"], final
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def test_sl_loop_and_rl_loop_run_unchanged_against_the_server(tmp_path, smollm2_path, tinker_cookbook):
    tinker_workdir = by_path("bench/tinker_workdir.py")
    workdir = tmp_path / "work"
    tinker_workdir.write_dataset(workdir, train=64, test=8)        # openai/gsm8k for rl_loop
    tinker_workdir.write_chat_dataset(workdir, train=64, test=8)   # HuggingFaceH4/no_robots for sl_loop
    tinker_workdir.link_model(workdir, smollm2_path, NAME)
    server = server_process.ServerProcess(tmp_path / "server", f"model.path={smollm2_path}",
                                          f"tinker.model_name={NAME}", log=tmp_path / "server.log")
    try:
        sl = run_recipe("sl_loop", workdir, server.url, "batch_size=4")
        rl = run_recipe("rl_loop", workdir, server.url, "batch_size=2", "group_size=2", "max_tokens=8",
                        "loss_fn=importance_sampling")   # the recipe's default, stable_reinforce, is refused here
    finally:
        server.kill()

    assert [row["step"] for row in sl] == [0, 1], sl
    assert all(math.isfinite(row["train_mean_nll"]) and row["train_mean_nll"] > 0 for row in sl), sl
    assert [row["step"] for row in rl] == [0, 1], rl
    assert all(0 <= row["reward/total"] <= 1 for row in rl), rl   # NaN fails this too
    log = server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log
    print(f"\ntinker-cookbook against grpoflow serve tinker: sl_loop train_mean_nll "
          f"{[round(r['train_mean_nll'], 3) for r in sl]}, rl_loop reward/total {[r['reward/total'] for r in rl]}")
