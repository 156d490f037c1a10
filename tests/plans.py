"""A test's way to a `RunPlan` (grpoflow/plan/) with its own prompts and model folder: what `grpoflow train` builds,
through the same start-up check, for a Controller a test drives step by step."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from grpoflow.config import Config
from grpoflow.plan.checks import check_config
from grpoflow.plan.run_plan import RunPlan, build_scorer, plan_run, with_compute_dtype

BUILD = object()  # scorer: the config's own rule rewards (build_scorer), as `grpoflow train` builds them


def plan_of(cfg: Config, *, model_path: str, train_items: Sequence, run_dir: str | Path, scorer: Any = BUILD,
            val_items: Sequence = ()) -> RunPlan:
    """The plan of `cfg` training `model_path` on `train_items` in `run_dir` (checked as `grpoflow train` checks;
    `val_items`, not the config's, are the held-out prompts)."""
    cfg = with_compute_dtype(cfg)
    parts = check_config(cfg)
    plan = plan_run(cfg, run_dir, parts, build_scorer(cfg, parts) if scorer is BUILD else scorer,
                    model_path=model_path, held_out_only=True)
    return dataclasses.replace(plan, train_items=list(train_items), val_items=list(val_items))
