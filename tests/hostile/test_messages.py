"""Finding 11: mistakes a careless user makes get one line that names the file or key and the fix, through the
CLI (`grpoflow train ...`), never a raw traceback, and never torch's advice to load with weights_only=False."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from hostile_runs import ARGS, run

TINY = [*ARGS, "trainer.total_steps=1"]


def grpoflow(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPOFLOW_DEBUG": ""}
    return subprocess.run([sys.executable, "-m", "grpoflow.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def assert_one_clear_line(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    for needle in needles:
        assert needle in result.stderr, result.stderr[-2000:]


def test_a_malformed_yaml_recipe(tmp_path):
    (tmp_path / "bad.yaml").write_text("actor:\n  lr: [1e-4\nrollout:\n  n: 4\n")
    assert_one_clear_line(grpoflow("train", "bad.yaml", cwd=tmp_path), "bad.yaml is not valid YAML", "line ")


def test_a_reward_file_with_a_syntax_error(tmp_path):
    (tmp_path / "reward.py").write_text("def score(prompt, completion, **row)\n    return 1.0\n")
    result = grpoflow("train", *TINY, f"trainer.output_dir={tmp_path / 'run'}", "reward.function=reward.py:score",
                      cwd=tmp_path)
    assert_one_clear_line(result, "reward.py", "syntax error at line 1")


def test_a_data_file_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "data.jsonl").write_bytes(b'{"prompt": "caf\xe9", "answer": "1"}\n')
    result = grpoflow("train", *TINY, f"trainer.output_dir={tmp_path / 'run'}", "data.train_files=[data.jsonl]",
                      "data.val_files=[]", cwd=tmp_path)
    assert_one_clear_line(result, "data.jsonl", "not UTF-8")


def test_an_output_dir_that_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    result = grpoflow("train", *TINY, "trainer.output_dir=taken", cwd=tmp_path)
    assert_one_clear_line(result, "trainer.output_dir=taken is a file")


def test_an_empty_output_dir_is_refused_not_the_current_directory(tmp_path):
    result = grpoflow("train", *TINY, "trainer.output_dir=", cwd=tmp_path)
    assert_one_clear_line(result, "trainer.output_dir is empty")
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()


class Payload:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_a_crafted_optimizer_file_never_suggests_weights_only_false(tmp_path):
    out = tmp_path / "run"
    run(out, steps=1)
    folder = out / "checkpoints" / "step_000001"
    optimizer = folder / "actor" / "optimizer.pt"
    torch.save({"optimizer": Payload(), "scheduler": {}}, optimizer)
    manifest = json.loads((folder / "manifest.json").read_text())  # a forger rewrites the manifest too
    if "files" in manifest:
        manifest["files"]["actor/optimizer.pt"] = {"size": optimizer.stat().st_size,
                                                   "sha256": hashlib.sha256(optimizer.read_bytes()).hexdigest()}
    else:  # the manifest of sizes only, before checksums
        manifest["actor/optimizer.pt"] = optimizer.stat().st_size
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = grpoflow("train", *ARGS, "trainer.total_steps=2", f"trainer.output_dir={out}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    advice = result.stderr.replace("do not load this file with weights_only=False", "")
    assert "weights_only=False" not in advice and "`weights_only` set to `False`" not in advice, advice[-2000:]
    assert "optimizer.pt" in result.stderr and "this ran while loading" not in result.stdout + result.stderr
