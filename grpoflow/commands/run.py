"""`grpoflow train` and `grpoflow sft`: the run's plan (grpoflow/plan/: the start-up check, then rows, model,
tokenizer and prompts, each resolved once), its run folder, the warm start and the controller.

Everything that can fail on bad input (config, reward function, files, prompts) is checked
before any heavy stage starts, so a mistake costs seconds, not a training run.
"""

from __future__ import annotations

import contextlib
import time

import torch
from tqdm import tqdm

from grpoflow.commands.sft import run_sft
from grpoflow.commands.traps import RunFacts, config_traps
from grpoflow.config import Config, batch_schedule
from grpoflow.controller.checkpoint import fail_writes_past_the_file_size_limit
from grpoflow.controller.fit import RunLoop
from grpoflow.controller.run_folder import RunFolder, open_run_folder, write_config
from grpoflow.controller.trackers import check_trackers
from grpoflow.controller.trainer import Controller
from grpoflow.models.spec import is_builtin
from grpoflow.models.warm_start import is_warm_start
from grpoflow.plan.checks import check_config
from grpoflow.plan.run_plan import RunPlan, build_scorer, plan_run, with_compute_dtype, with_engine
from grpoflow.rewards.by_source import auto_scorers, scorer_name
from grpoflow.training.bf16_units import bf16_available_hint

DEFAULT_SFT_STEPS = 400


def sft_steps(cfg: Config) -> int:
    if cfg.sft.steps is not None:
        return cfg.sft.steps
    built_from_scratch = is_builtin(cfg.model.path) and not is_warm_start(cfg.model.path)
    return DEFAULT_SFT_STEPS if built_from_scratch else 0


def setup_run_dir(cfg: Config, *, auto_dtype: bool = False) -> RunFolder:
    """The locked run folder (run_folder.py: checked, earlier run moved aside or settings compared); nothing
    else is written yet. `auto_dtype`: the command asked model.compute_dtype=auto (`cfg` holds it resolved)."""
    folder = open_run_folder(cfg, auto_dtype=auto_dtype)
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.trainer.seed)
    return folder


def sft_stage(cfg: Config) -> str:
    """`grpoflow sft`: warm-start the configured model on the training rows; returns the saved folder."""
    auto_dtype = cfg.model.compute_dtype in (None, "auto")  # resolved by this machine: may differ on resume
    cfg = with_compute_dtype(cfg)  # model.compute_dtype None/auto: this machine's
    parts = check_config(cfg)
    with setup_run_dir(cfg, auto_dtype=auto_dtype) as folder:
        write_config(folder, cfg)
        return warm_start(plan_run(cfg, folder.path, parts, None))


def warm_start(plan: RunPlan, compute_dtype: str | None = None) -> str:
    """The policy's folder: model.path's, or its supervised warm start (sft.steps) on the plan's training rows, saved
    in `<run folder>/sft_model` with the plan's tokenizer. `compute_dtype`: the warm start's, when it differs from
    the run's (a run resumed on another machine kind reuses the warm start made there)."""
    cfg = plan.cfg
    steps = sft_steps(cfg)
    if steps <= 0:
        return plan.model_path
    conversations = cfg.rollout.conversational  # demonstrations render as their rollouts do
    return run_sft(plan.model_path, plan.train_rows, plan.run_dir.resolve() / "sft_model", steps=steps,
                   lr=cfg.sft.lr, batch_size=cfg.sft.batch_size, prompt_key=cfg.data.prompt_key,
                   response_key=cfg.sft.response_key, seed=cfg.trainer.seed,
                   system_prompt=cfg.data.system_prompt if conversations else None,
                   tools=plan.parts.tool_schemas if conversations else None,
                   compute_dtype=compute_dtype or cfg.model.compute_dtype, until_accuracy=cfg.sft.until_accuracy,
                   probe_rows=cfg.sft.probe_rows, check_every=cfg.sft.check_every, tokenizer=plan.tokenizer)


def train(cfg: Config) -> dict:
    """`grpoflow train`: (warm start) -> GRPO with validation; returns before/after validation metrics."""
    start = time.perf_counter()
    auto_dtype = cfg.model.compute_dtype in (None, "auto")  # resolved by this machine: may differ on resume
    setting, cfg = cfg.model.compute_dtype, with_compute_dtype(cfg)  # None/auto: this machine's, before config.yaml
    cfg, engine_line = with_engine(cfg)  # rollout.engine=auto: this machine's, named on the start-up lines
    parts = check_config(cfg)  # the one start-up check of the run (user files imported here, registries resolved)
    fail_writes_past_the_file_size_limit()  # under `ulimit -f`: an error that names the limit, not a silent kill
    schedule = batch_schedule(cfg)
    check_trackers(cfg.trainer.loggers)
    scorer = build_scorer(cfg, parts)
    with setup_run_dir(cfg, auto_dtype=auto_dtype) as folder:
        device = "cuda" if torch.cuda.is_available() or cfg.backend != "local" else "cpu"
        dtype_line = bf16_available_hint(setting, cfg.model.compute_dtype or "float32", device)  # None: nothing to say
        lines = "\n".join(filter(None, [schedule.describe(), engine_line, dtype_line]))
        return _train(plan_run(cfg, folder.path, parts, scorer), folder, lines, start)


def _train(plan: RunPlan, folder: RunFolder, schedule: str, start: float) -> dict:
    cfg, run_dir, stats = plan.cfg, plan.run_dir, plan.stats
    if "auto" in (cfg.reward.functions or [cfg.reward.function]):
        tqdm.write(auto_scorers(plan.train_rows + plan.val_rows))
    tqdm.write(f"run folder: {run_dir.resolve()}")
    tqdm.write(schedule)
    plan = plan.with_policy(warm_start(plan, folder.resumed_compute_dtype))  # made on the other machine kind
    d = cfg.data
    tqdm.write(f"data: {stats.kept} of {stats.total} training prompts kept ({stats.missing_prompt} without a prompt, "
               f"{stats.overlong} over {d.max_prompt_length} tokens); {len(plan.val_items)} validation prompts")
    if cfg.trainer.total_epochs is not None:  # verl's trainer.total_epochs, TRL's num_train_epochs
        tqdm.write(f"trainer.total_epochs={cfg.trainer.total_epochs}: {cfg.trainer.total_steps} steps of "
                   f"{d.prompts_per_step} of the {stats.kept} training prompts (trainer.total_steps)")
    facts = RunFacts(chat_template=bool(getattr(plan.tokenizer, "chat_template", None)), prompts_total=stats.total,
                     prompts_overlong=stats.overlong)
    for trap in config_traps(cfg, facts):
        tqdm.write(f"WARNING: {trap}")
    write_config(folder, cfg)
    with plan.scorer or contextlib.nullcontext():
        controller = Controller(plan)
        loop = RunLoop(controller)
        try:
            result = loop.fit(folder.resume)
        finally:
            controller.close()
    result["wall_s"] = time.perf_counter() - start
    mean_at_k = f"mean@{cfg.rollout.val_n}"   # greedy mean@1, or sampled mean@k with rollout.val_n=k
    before, after = result["before"].get(f"val/{mean_at_k}"), result["after"].get(f"val/{mean_at_k}")
    if result["stopped"]:
        tqdm.write(stopped_message(result["stopped"], cfg))
    elif before is not None and after is not None:
        if zero_one_reward(cfg, plan.val_rows):
            tqdm.write(f"held-out accuracy ({mean_at_k}): {before:.1%} before GRPO -> {after:.1%} after "
                       f"{cfg.trainer.total_steps} steps ({after - before:+.1%})")
        else:
            tqdm.write(f"held-out mean reward ({mean_at_k}): {before:.4g} before GRPO -> {after:.4g} after "
                       f"{cfg.trainer.total_steps} steps ({after - before:+.4g})")
    tqdm.write(f"done in {result['wall_s']:.0f}s; metrics: {loop.logger.path.resolve()}")
    samples = [name for name in ("samples.jsonl", "train_samples.jsonl") if (run_dir / name).exists()]
    tqdm.write(f"samples: {', '.join(str((run_dir / n).resolve()) for n in samples) or 'none written'}; "
               f"to see the curves and rollouts: grpoflow view {run_dir}")
    return result


# Built-in rewards that score 0 or 1, so that a mean over samples is an accuracy.
ZERO_ONE_REWARDS = ("exact_match", "gsm8k", "gsm8k_flexible", "math")


def zero_one_reward(cfg: Config, rows: list[dict]) -> bool:
    """Whether every sample's score is 0 or 1 by construction: one such built-in (auto: for every row's
    data_source), nothing added to it."""
    r = cfg.reward
    names = {scorer_name(row.get("data_source")) for row in rows} if r.function == "auto" else {r.function}
    return (not r.functions and names <= set(ZERO_ONE_REWARDS) and not r.routes and not r.model.path
            and not cfg.rollout.multi_turn.env and not r.overlong_buffer_len and not cfg.rollout.agent.enabled)


def stopped_message(stopped: dict, cfg: Config) -> str:
    """What a run stopped by a signal kept, and that the same command resumes it."""
    where = (f"checkpoint {stopped['checkpoint']}" if stopped["checkpoint"] else
             "no step was trained since the start, so there was nothing to save")
    return (f"stopped by {stopped['signal']} after step {stopped['step']} of {cfg.trainer.total_steps}; {where}. "
            f"Run the same command to resume from there.")
