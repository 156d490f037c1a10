"""What the run-folder tests share: one tiny run (the 0.5M built-in model, a few steps of 2 prompts x 2 samples,
a checkpoint every step), trained in this process, and a way to read what it logged."""

from __future__ import annotations

import json
from pathlib import Path

from grpoflow.config import load_config
from grpoflow.commands.run import train

ARGS = ["model.path=builtin:tiny-0.5m", "sft.steps=5", "data.prompts_per_step=2", "rollout.n=2",
        "rollout.max_new_tokens=3", "trainer.save_every=1", "trainer.keep_last=2", "trainer.val_every=0",
        "trainer.log_every=100"]


def run(out: Path, *extra: str, steps: int = 3) -> dict:
    """`grpoflow train` of the tiny run into `out`, in this process."""
    return train(load_config(None, [f"trainer.output_dir={out}", f"trainer.total_steps={steps}", *ARGS, *extra]))


def metrics(out: Path) -> list[dict]:
    """metrics.jsonl's records without their timings (which differ from run to run)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in records]


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("step_*"))
