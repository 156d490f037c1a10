"""Running tinker-cookbook recipes, unchanged, against one `grpoflow serve tinker` (tests/real_model, issue 37).

Imported by name (pytest puts this folder on sys.path). `CookbookServer` is a working folder that
bench/tinker_workdir.py fills with the recipes' hub datasets and model name, plus the server on SmolLM2;
conftest.py starts one per session, which every cookbook test shares.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the recipes' hub name for the model: the server maps it to SmolLM2 (tinker.model_name), and the cookbook's
# tokenizer and renderer table find it as a folder in the working directory (bench/tinker_workdir.py links it)
NAME = "meta-llama/Llama-3.2-1B"
TIMEOUT_S = 240  # per recipe process


def by_path(relative: str):
    """A module of this repository outside the test's import path (bench/ and tests/integration/), by its file."""
    spec = importlib.util.spec_from_file_location(Path(relative).stem, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


server_process = by_path("tests/integration/tinker_server_process.py")


class CookbookServer:
    """The working folder (every local dataset the recipes here load, the model link) and the server."""

    def __init__(self, root: Path, model: str) -> None:
        workdir = by_path("bench/tinker_workdir.py")
        self.workdir = root / "work"
        workdir.write_dataset(self.workdir, train=64, test=8)              # openai/gsm8k: rl_loop
        workdir.write_chat_dataset(self.workdir, train=64, test=8)         # HuggingFaceH4/no_robots: sl_loop
        workdir.write_preference_dataset(self.workdir, train=64, test=2)   # Anthropic/hh-rlhf: DPO (test: its eval)
        workdir.write_prompt_dataset(self.workdir, train=64)               # zwhe99/DeepMath-103K: distillation
        workdir.write_text_corpus(self.workdir)                            # Salesforce/wikitext: rl_numerics_check
        workdir.link_model(self.workdir, model, NAME)
        self.server = server_process.ServerProcess(root / "server", f"model.path={model}", f"tinker.model_name={NAME}",
                                                   log=root / "server.log")
        self.url = self.server.url

    def command(self, recipe: str, log_path: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", f"tinker_cookbook.recipes.{recipe}", f"base_url={self.url}",
                f"model_name={NAME}", f"log_path={log_path}", *args]

    def start(self, recipe: str, log_path: Path, *args: str) -> subprocess.Popen:
        """The recipe as a child process in the working folder, its output in `log_path`.out."""
        env = dict(os.environ, TINKER_API_KEY=server_process.API_KEY, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   HF_DATASETS_CACHE=str(self.workdir / "hf-datasets"), OMP_NUM_THREADS="1",
                   TOKENIZERS_PARALLELISM="false")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path.with_suffix(".out"), "a") as out:
            return subprocess.Popen(self.command(recipe, log_path, *args), cwd=self.workdir, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, text=True)

    def run(self, recipe: str, log_path: Path, key: str, *args: str) -> tuple[list[dict], float]:
        """Run one recipe to its end: its metrics.jsonl rows that hold `key`, and its wall seconds."""
        t0 = time.perf_counter()
        proc = self.start(recipe, log_path, *args)
        try:
            code = proc.wait(TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        seconds = time.perf_counter() - t0
        output = log_path.with_suffix(".out").read_text()
        assert code == 0, f"{recipe} exited {code}:\n{output[-4000:]}"
        final = checkpoints(log_path)[-1]
        # the recipe's last call, save_checkpoint(kind="both"): save_state and save_weights_for_sampler answered paths
        assert final["name"] == "final" and final["state_path"] and final["sampler_path"], final
        return metrics(log_path, key), seconds

    def close(self) -> None:
        self.server.kill()

    def assert_log_clean(self) -> None:
        log = self.server.log.read_text()
        assert "Traceback" not in log and "ERROR" not in log, log


def checkpoints(log_path: Path) -> list[dict]:
    path = log_path / "checkpoints.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def metrics(log_path: Path, key: str) -> list[dict]:
    """The rows of a training step, which hold `key` (the recipes also append summary rows, e.g. math_rl's last)."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if key in row]
