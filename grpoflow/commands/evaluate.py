"""`grpoflow eval`: the validation metrics of a model folder or a run's latest checkpoint, per data source."""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path

from tqdm import tqdm

from grpoflow.commands.run import build_scorer, read_rows, val_files, with_compute_dtype
from grpoflow.config import Config, ConfigError
from grpoflow.controller.checkpoint import CheckpointManager
from grpoflow.controller.rewarding import RewardAssembly
from grpoflow.controller.rollouts import Rollouts
from grpoflow.controller.trainer import rollout_dtype
from grpoflow.controller.validation import validate
from grpoflow.data.dataset import prepare_prompts
from grpoflow.distributed.worker_group import WorkerGroup
from grpoflow.models.loading import load_tokenizer
from grpoflow.models.spec import model_folder
from grpoflow.rollout.protocol import SamplingParams
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


def evaluate(cfg: Config) -> dict[str, float]:
    """Generate `rollout.val_n` samples per prompt of `data.val_files` and print a table per data source."""
    files = val_files(cfg)
    if not files:
        raise ConfigError("grpoflow eval needs prompts: set data.val_files (or data.train_files=builtin:addition/train "
                          "for the built-in task's held-out split).")
    model_path = policy_folder(cfg.model.path, cfg.model.gguf_cache_dir)
    d, r = cfg.data, cfg.rollout
    multi_turn = r.conversational
    scorer = build_scorer(cfg)
    if scorer is None and not multi_turn:
        raise ConfigError("grpoflow eval scores with reward.function (or reward.functions); set one, or an "
                          "environment (rollout.multi_turn.env) or agent (rollout.agent.program) whose reward it is.")
    # the controller's validation path: the same rollout kinds (environments, tools, agents) and reward assembly
    chat = True if d.apply_chat_template is None and multi_turn else d.apply_chat_template
    tokenizer = load_tokenizer(model_path)
    items, stats = prepare_prompts(read_rows(files), tokenizer, prompt_key=d.prompt_key,
                                   max_prompt_length=d.max_prompt_length, overlong=d.overlong,
                                   apply_chat_template=chat, system_prompt=d.system_prompt)
    items = items[:d.val_max_prompts]
    group = WorkerGroup("rollout", partial(RolloutWorker, model_path=model_path, cfg=cfg,
                                            dtype=rollout_dtype(with_compute_dtype(cfg))),
                        pad_token_id=tokenizer.pad_token_id or 0)
    rollouts = Rollouts(group, multi_turn=r.multi_turn.enabled, agent=r.agent.enabled)
    rewards = RewardAssembly(scorer, None, cfg.reward, max_new_tokens=r.max_new_tokens)
    params = SamplingParams(n=r.val_n, max_new_tokens=r.max_new_tokens, temperature=r.val_temperature, top_p=1.0)
    try:
        with scorer or contextlib.nullcontext():
            metrics = validate(rollouts, items, rewards.score, params=params, batch_size=r.val_batch_size,
                               seed=10**9)
    finally:
        group.call(RolloutWorker.close)
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
