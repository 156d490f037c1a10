"""A run folder written by an older grpoflow, whose config.yaml holds the multi-turn settings as flat rollout.*
keys (since moved into rollout.multi_turn and rollout.agent), must still resume: failing would strand its
checkpoints. Its saved settings are compared under their new names, with a warning naming them."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import yaml

from grpoflow.commands.run import train
from grpoflow.config import ConfigError, load_config
from hostile_runs import metrics
from old_configs import old_flat

MULTI_TURN = ["model.path=builtin:tiny-0.5m", "sft.steps=0", "data.prompts_per_step=2", "rollout.n=2",
              "rollout.max_new_tokens=16", "rollout.multi_turn.max_turns=2", "rollout.val_n=1", "trainer.save_every=1",
              "trainer.val_every=0", "trainer.log_every=100"]


def run(out: Path, *extra: str, steps: int) -> dict:
    """A tiny guess_number run (the environment's multi-turn loop) into `out`, in this process."""
    return train(load_config("guess_number", [f"trainer.output_dir={out}", f"trainer.total_steps={steps}",
                                              *MULTI_TURN, *extra]))


def write_as_older_grpoflow(path: Path) -> None:
    """Rewrite a saved config.yaml with the flat keys; a checkpoint's is listed in its manifest.json with its size
    and checksum, which the older grpoflow wrote for that file (else the checkpoint is damaged, not old)."""
    path.write_text(yaml.safe_dump(old_flat(yaml.safe_load(path.read_text())), sort_keys=False))
    manifest = path.parent / "manifest.json"
    if manifest.exists():
        data = json.loads(manifest.read_text())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        data["files"][path.name] = {"size": path.stat().st_size, "sha256": digest}
        manifest.write_text(json.dumps(data))


def test_a_run_folder_of_an_older_grpoflow_resumes_comparing_its_flat_keys(tmp_path, caplog):
    out = tmp_path / "run"
    run(out, steps=2)
    saved = [out / "config.yaml", *sorted(out.glob("checkpoints/step_*/config.yaml"))]
    for path in saved:
        write_as_older_grpoflow(path)
    assert "max_turns: 2" in saved[0].read_text() and "multi_turn:" not in saved[0].read_text()
    before = {p: p.read_bytes() for p in saved}

    with pytest.raises(ConfigError) as refused:  # a changed multi-turn setting is still seen, under its new name
        run(out, "rollout.multi_turn.max_turns=3", steps=3)
    assert "rollout.multi_turn.max_turns: 2 -> 3" in str(refused.value)

    with caplog.at_level(logging.WARNING, logger="grpoflow.run_folder"):
        run(out, steps=3)
    assert [r["step"] for r in metrics(out)] == [1, 2, 3], "the run did not continue from its step-2 checkpoint"
    assert not (out / "previous").exists(), "the old run was moved aside: a fresh start, not a resume"
    warned = " ".join(r.getMessage() for r in caplog.records if "written by an older grpoflow" in r.getMessage())
    for moved in ("rollout.env -> rollout.multi_turn.env", "rollout.max_turns -> rollout.multi_turn.max_turns",
                  "rollout.agent -> rollout.agent.program", "rollout.agent_timeout_s -> rollout.agent.timeout_s"):
        assert moved in warned, warned
    kept = [out / "config.yaml", out / "checkpoints" / "step_000002" / "config.yaml"]  # step 1: pruned (keep_last)
    assert all(p.read_bytes() == before[p] for p in kept), "the old run's config.yaml was rewritten"
