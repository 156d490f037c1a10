"""Build a run from its config: run folder, model, data, warm start, controller.

Everything that can fail on bad input (config, reward function, files, prompts) is checked
here, before any heavy stage starts, so a mistake costs seconds, not a training run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from grpoflow.commands.sft import run_sft
from grpoflow.commands.traps import RunFacts, config_traps
from grpoflow.config import Config, ConfigError, batch_schedule, resolve_total_steps
from grpoflow.controller.checkpoint import fail_writes_past_the_file_size_limit
from grpoflow.controller.checks import auto_choice, check_config
from grpoflow.controller.fit import RunLoop
from grpoflow.controller.run_folder import RunFolder, open_run_folder, write_config
from grpoflow.controller.trackers import check_trackers
from grpoflow.controller.trainer import Controller
from grpoflow.engines.choice import MachineFacts, probe_machine
from grpoflow.data.dataset import PromptItem, load_rows, prepare_prompts
from grpoflow.models.loading import load_tokenizer
from grpoflow.models.spec import is_builtin, model_folder
from grpoflow.models.warm_start import is_warm_start
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.rewards import RewardScorer, build_reward, unscored_message, unscored_sources
from grpoflow.rewards.by_source import auto_scorers, scorer_name
from grpoflow.tasks.addition import addition_splits
from grpoflow.tasks.chat_addition import chat_addition_splits
from grpoflow.tasks.multi_turn import calculator_splits, guess_number_splits
from grpoflow.tasks.reasoning_gym_tasks import default_val_spec, is_reasoning_gym, reasoning_gym_rows
from grpoflow.tasks.verifiers_tasks import is_verifiers, verifiers_rows
from grpoflow.training.bf16_units import bf16_available_hint, this_machines_compute_dtype
from grpoflow.workers.rollout_kinds import tool_schemas

# built-in data name -> (the task's splits function, index of the split)
Splits = Callable[[], tuple[list[dict], list[dict]]]
BUILTIN_DATA: dict[str, tuple[Splits, int]] = {
    "builtin:addition/train": (addition_splits, 0), "builtin:addition/val": (addition_splits, 1),
    "builtin:chat_addition/train": (chat_addition_splits, 0), "builtin:chat_addition/val": (chat_addition_splits, 1),
    "builtin:guess_number/train": (guess_number_splits, 0), "builtin:guess_number/val": (guess_number_splits, 1),
    "builtin:calculator/train": (calculator_splits, 0), "builtin:calculator/val": (calculator_splits, 1)}
DEFAULT_SFT_STEPS = 400


def build_scorer(cfg: Config) -> RewardScorer | None:
    """The rule-reward scorer (None when only a reward model scores)."""
    r = cfg.reward
    spec = r.functions or r.function
    if not spec and not r.model.path and not cfg.rollout.multi_turn.env and not cfg.rollout.agent.enabled:
        raise ConfigError("No reward: set reward.function (or reward.functions), reward.model.path, a "
                          "rewarding rollout.multi_turn.env and/or a rollout.agent.program.")
    if not spec:
        return None
    return RewardScorer(build_reward(spec, r.weights, r.routes, r.style), error_score=r.error_score,
                        timeout_s=r.timeout_s, workers=r.workers)


def resolve_model(cfg: Config, run_dir: Path) -> str:
    """A local model folder for `model.path` (models/spec.py); `builtin:tiny-<size>` is built and a `.gguf` file
    dequantized into `<run folder>/base_model`, once (a resumed run reuses it)."""
    return model_folder(cfg.model.path, setting="model.path", into=run_dir.resolve() / "base_model",
                        seed=cfg.model.seed)


def read_rows(files: list[str]) -> list[dict]:
    """Rows of every file; `builtin:addition/train|val` (and `builtin:chat_addition/...`) are the built-in
    tasks' splits; `reasoning_gym:TASK?size=..&seed=..&option=..` a reasoning-gym task's rows; `verifiers:TASKSET?..`
    a verifiers taskset's."""
    rows: list[dict] = []
    for spec in files:
        if spec in BUILTIN_DATA:
            splits, index = BUILTIN_DATA[spec]
            rows += splits()[index]
        elif is_reasoning_gym(spec):
            try:
                rows += reasoning_gym_rows(spec)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        elif is_verifiers(spec):
            try:
                rows += verifiers_rows(spec)
            except (ValueError, ImportError) as e:
                raise ConfigError(str(e)) from None
        elif spec.startswith("builtin:"):
            raise ConfigError(f"data file {spec!r} is not a built-in; use one of {list(BUILTIN_DATA)}.")
        else:
            rows += load_rows(spec)
    return rows


def val_files(cfg: Config) -> list[str]:
    if cfg.data.val_files is not None:
        return cfg.data.val_files
    train_files = list(cfg.data.train_files)
    if len(train_files) == 1 and is_reasoning_gym(train_files[0]):
        return [default_val_spec(train_files[0])]  # the same task, another seed
    return ["builtin:addition/val"] if train_files == ["builtin:addition/train"] else []


def prompt_options(cfg: Config) -> dict[str, Any]:
    """How the run tokenizes its prompts (`prepare_prompts`' options): the training prompts, the held-out ones and
    `grpoflow eval`'s alike. A multi-turn run renders every opening as chat (`workers.rollout_kinds.opening_of`),
    plain-string prompts included: they are tokenized the same way, so that their lengths are checked as rendered
    and data.system_prompt applies; the tools' schemas are rendered into templated prompts."""
    d = cfg.data
    chat = True if d.apply_chat_template is None and cfg.rollout.conversational else d.apply_chat_template
    return dict(prompt_key=d.prompt_key, max_prompt_length=d.max_prompt_length, overlong=d.overlong,
                apply_chat_template=chat, system_prompt=d.system_prompt, tools=tool_schemas(cfg))


def held_out_items(cfg: Config, rows: list[dict], tokenizer: Any) -> list[PromptItem]:
    """The validation prompts of `rows` (the first data.val_max_prompts kept), as the run validates them."""
    return prepare_prompts(rows, tokenizer, **prompt_options(cfg))[0][:cfg.data.val_max_prompts] if rows else []


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


def with_compute_dtype(cfg: Config) -> Config:
    """`cfg` with `model.compute_dtype` None (the default: bfloat16 on a CUDA GPU with native bf16, else float32) or
    auto resolved for this machine (training/bf16_units.py); unchanged otherwise. The commands that start a run call
    it, so config.yaml and every role see float32 or bfloat16. With backend=ray it refuses auto (the ranks may
    compute on machines this process cannot see) and resolves None by this machine's GPU."""
    setting = cfg.model.compute_dtype
    if setting not in (None, "auto"):
        return cfg
    if setting == "auto" and cfg.backend != "local":
        raise ConfigError("model.compute_dtype=auto looks at this machine's hardware, and with backend=ray the ranks "
                          "may compute on others: set model.compute_dtype=bfloat16 (GPUs since Ampere, CPUs with bf16 "
                          "units) or float32.")
    resolved = this_machines_compute_dtype(setting)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, compute_dtype=resolved))


def with_engine(cfg: Config, facts: MachineFacts | None = None) -> tuple[Config, str]:
    """`cfg` with rollout.engine=auto (the default) resolved by this machine's `facts` (probed when None;
    engines/choice.py: vllm on CUDA where vLLM imports at the tested release, else hf), and the start-up line that
    names the engine and why. With backend=ray this machine stands for the ranks', as for model.compute_dtype."""
    r = cfg.rollout
    if r.engine != "auto":
        return cfg, f"rollout engine: {r.engine} (rollout.engine={r.engine})"
    name, why = auto_choice(cfg, facts or probe_machine())
    return (dataclasses.replace(cfg, rollout=dataclasses.replace(r, engine=name)),
            f"rollout engine: {name} (rollout.engine=auto: {why})")


def sft_stage(cfg: Config, run_dir: Path | None = None, rows: list[dict] | None = None) -> str:
    """`grpoflow sft`: warm-start the configured model on the training rows; returns the saved folder."""
    auto_dtype = cfg.model.compute_dtype in (None, "auto")  # resolved by this machine: may differ on resume
    cfg = with_compute_dtype(cfg)  # model.compute_dtype None/auto: this machine's
    if run_dir is None:
        with setup_run_dir(cfg, auto_dtype=auto_dtype) as folder:
            write_config(folder, cfg)
            return sft_stage(cfg, folder.path, rows)
    base = resolve_model(cfg, run_dir)
    steps = sft_steps(cfg)
    if steps <= 0:
        return base
    rows = rows if rows is not None else read_rows(cfg.data.train_files)
    conversations = cfg.rollout.conversational  # demonstrations render as their rollouts do
    return run_sft(base, rows, run_dir.resolve() / "sft_model", steps=steps, lr=cfg.sft.lr,
                   batch_size=cfg.sft.batch_size, prompt_key=cfg.data.prompt_key,
                   response_key=cfg.sft.response_key, seed=cfg.trainer.seed,
                   system_prompt=cfg.data.system_prompt if conversations else None,
                   tools=tool_schemas(cfg) if conversations else None, compute_dtype=cfg.model.compute_dtype,
                   until_accuracy=cfg.sft.until_accuracy, probe_rows=cfg.sft.probe_rows,
                   check_every=cfg.sft.check_every)


def train(cfg: Config) -> dict:
    """`grpoflow train`: (warm start) -> GRPO with validation; returns before/after validation metrics."""
    start = time.perf_counter()
    auto_dtype = cfg.model.compute_dtype in (None, "auto")  # resolved by this machine: may differ on resume
    setting, cfg = cfg.model.compute_dtype, with_compute_dtype(cfg)  # None/auto: this machine's, before config.yaml
    cfg, engine_line = with_engine(cfg)  # rollout.engine=auto: this machine's, named on the start-up lines
    check_config(cfg)  # the one start-up check of the run (user files imported here); the Controller requires it
    fail_writes_past_the_file_size_limit()  # under `ulimit -f`: an error that names the limit, not a silent kill
    schedule = batch_schedule(cfg)
    check_trackers(cfg.trainer.loggers)
    scorer = build_scorer(cfg)
    with setup_run_dir(cfg, auto_dtype=auto_dtype) as folder:
        device = "cuda" if torch.cuda.is_available() or cfg.backend != "local" else "cpu"
        dtype_line = bf16_available_hint(setting, cfg.model.compute_dtype or "float32", device)  # None: nothing to say
        lines = "\n".join(filter(None, [schedule.describe(), engine_line, dtype_line]))
        return _train(cfg, folder, scorer, lines, start)


def _train(cfg: Config, folder: RunFolder, scorer: RewardScorer | None, schedule: str, start: float) -> dict:
    run_dir = folder.path
    train_rows, val_rows = read_rows(cfg.data.train_files), read_rows(val_files(cfg))
    check_scored_sources(cfg, train_rows + val_rows)
    if "auto" in (cfg.reward.functions or [cfg.reward.function]):
        tqdm.write(auto_scorers(train_rows + val_rows))
    tqdm.write(f"run folder: {run_dir.resolve()}")
    tqdm.write(schedule)
    if cfg.rollout.conversational:  # the chat template must render token-exactly: checked first
        ChatRenderer(load_tokenizer(resolve_model(cfg, run_dir)))
    warm = cfg if folder.resumed_compute_dtype is None else dataclasses.replace(  # the warm start made on the
        cfg, model=dataclasses.replace(cfg.model, compute_dtype=folder.resumed_compute_dtype))  # other machine kind
    model_path = sft_stage(warm, run_dir, train_rows)
    tokenizer = load_tokenizer(model_path)
    d = cfg.data
    train_items, stats = prepare_prompts(train_rows, tokenizer, **prompt_options(cfg))
    val_items = held_out_items(cfg, val_rows, tokenizer)
    tqdm.write(f"data: {stats.kept} of {stats.total} training prompts kept ({stats.missing_prompt} without a prompt, "
               f"{stats.overlong} over {d.max_prompt_length} tokens); {len(val_items)} validation prompts")
    if cfg.trainer.total_epochs is not None:  # verl's trainer.total_epochs, TRL's num_train_epochs
        cfg = resolve_total_steps(cfg, stats.kept)  # the checked config, with total_steps from the epochs
        tqdm.write(f"trainer.total_epochs={cfg.trainer.total_epochs}: {cfg.trainer.total_steps} steps of "
                   f"{d.prompts_per_step} of the {stats.kept} training prompts (trainer.total_steps)")
    facts = RunFacts(chat_template=bool(getattr(tokenizer, "chat_template", None)), prompts_total=stats.total,
                     prompts_overlong=stats.overlong)
    for trap in config_traps(cfg, facts):
        tqdm.write(f"WARNING: {trap}")
    write_config(folder, cfg)
    with scorer or contextlib.nullcontext():
        controller = Controller(cfg, model_path=model_path, train_items=train_items, val_items=val_items,
                                scorer=scorer, run_dir=run_dir)
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
        if zero_one_reward(cfg, val_rows):
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


def check_scored_sources(cfg: Config, rows: list[dict]) -> None:
    """reward.function=auto scores rows by data_source: a source it has no scorer for (and no reward.routes
    entry) is refused before anything loads, naming it."""
    r = cfg.reward
    specs = r.functions or ([r.function] if r.function else [])
    if "auto" not in specs:
        return
    missing = [s for s in unscored_sources(rows) if s not in (r.routes or {})]
    if missing:
        raise ConfigError(unscored_message(missing))


def stopped_message(stopped: dict, cfg: Config) -> str:
    """What a run stopped by a signal kept, and that the same command resumes it."""
    where = (f"checkpoint {stopped['checkpoint']}" if stopped["checkpoint"] else
             "no step was trained since the start, so there was nothing to save")
    return (f"stopped by {stopped['signal']} after step {stopped['step']} of {cfg.trainer.total_steps}; {where}. "
            f"Run the same command to resume from there.")
