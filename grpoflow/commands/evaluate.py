"""`grpoflow eval`: the validation metrics of a model folder or a run's latest checkpoint, per data source.

Eval builds the run's plan (grpoflow/plan/: the start-up check, the held-out prompts with the chat template, system
prompt, tool schemas and max lengths) and the run's rollout role (`controller.trainer.rollout_group`), the rewards
(`controller.rewarding.reward_roles` / `build_rewards`: rule rewards, the judge, the reward model), the sampling
and its seed (`controller.held_out.val_params` / `val_seed`, at the checkpoint's step). So
`grpoflow eval RUN/config.yaml model.path=RUN` gives the run's last validation figures, exactly.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from tqdm import tqdm

from grpoflow.config import Config, ConfigError
from grpoflow.controller.checkpoint import CheckpointManager, step_of
from grpoflow.controller.rewarding import build_rewards, reward_roles
from grpoflow.controller.rollouts import Rollouts
from grpoflow.controller.trainer import rollout_group
from grpoflow.controller.held_out import evaluate_held_out, val_params, val_seed
from grpoflow.models.spec import model_folder
from grpoflow.plan.checks import check_config
from grpoflow.plan.run_plan import build_scorer, plan_run, val_files, with_compute_dtype, with_engine
from grpoflow.workers.rollout import RolloutWorker


def policy_folder(path: str, gguf_cache_dir: str | None = None) -> str:
    """A run folder -> the policy of its latest checkpoint; any other model spec as models/spec.py resolves it (an HF
    model folder as is, a .gguf file -> its folder in the conversion cache, converted on first use)."""
    checkpoint = CheckpointManager(path).latest() if Path(path).is_dir() else None
    if checkpoint is not None:
        return str(checkpoint / "actor")
    if Path(path).is_dir() and not (Path(path) / "config.json").exists():
        raise ConfigError(f"model.path={path} is neither a model folder (config.json) nor a run folder with "
                          f"checkpoints; give one of those.")
    return model_folder(path, setting="model.path", gguf_cache_dir=gguf_cache_dir, also=", or a run folder")


def trained_steps(path: str) -> int:
    """The step of a run folder's latest checkpoint; 0 for a model folder (as the run's validation before training)."""
    checkpoint = CheckpointManager(path).latest() if Path(path).is_dir() else None
    return 0 if checkpoint is None else step_of(checkpoint)


def evaluate(cfg: Config) -> dict[str, float]:
    """Generate `rollout.val_n` samples per prompt of `data.val_files` and print a table per data source."""
    files = val_files(cfg)
    if not files:
        raise ConfigError("grpoflow eval needs prompts: set data.val_files (or data.train_files=builtin:addition/train "
                          "for the built-in task's held-out split).")
    cfg = with_compute_dtype(cfg)  # model.compute_dtype None/auto: this machine's, as the run's roles see it
    cfg, engine_line = with_engine(cfg)  # rollout.engine=auto: this machine's
    parts = check_config(cfg)  # the run's start-up check (the engine fits this machine): the parts its validation used
    tqdm.write(engine_line)
    model_path = policy_folder(cfg.model.path, cfg.model.gguf_cache_dir)
    step = trained_steps(cfg.model.path)
    r = cfg.rollout
    scorer = build_scorer(cfg, parts)
    if scorer is None and not r.conversational and not cfg.reward.model.path:
        raise ConfigError("grpoflow eval scores with reward.function (or reward.functions) or reward.model.path; set "
                          "one, or an environment (rollout.multi_turn.env) or agent (rollout.agent.program) whose "
                          "reward it is.")
    run_dir = Path(cfg.model.path) if step else Path(cfg.trainer.output_dir)  # where a .gguf judge is dequantized
    plan = plan_run(cfg, run_dir, parts, scorer, model_path=model_path, held_out_only=True)
    items = plan.val_items
    rollout = rollout_group(plan)
    reward_model, judge = reward_roles(cfg, run_dir)
    rewards = build_rewards(cfg, scorer, reward_model, judge)
    rollouts = Rollouts(rollout, multi_turn=r.multi_turn.enabled, agent=r.agent.enabled)
    try:
        with scorer or contextlib.nullcontext():
            metrics = evaluate_held_out(rollouts, items, rewards.score, params=val_params(cfg),
                                        batch_size=r.val_batch_size, seed=val_seed(cfg.trainer.seed, step))
    finally:
        rollout.call(RolloutWorker.close)
    tqdm.write(f"model: {model_path}\n" + format_table(metrics, {it.data_source for it in items}, len(items)))
    return metrics


def format_table(metrics: dict[str, float], sources: set[str], total: int) -> str:
    """One row per data source (and `all`), one column per metric."""
    names = sorted({k.split("/")[-1] for k in metrics})
    rows = [("data_source", *names)]
    for source in [*sorted(sources), None]:
        prefix = f"val/{source}/" if source else "val/"
        rows.append((source or "all", *(f"{metrics[prefix + n]:.4f}" for n in names)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows) + f"\n({total} prompts)"
