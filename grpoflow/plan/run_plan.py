"""A run assembled from its config, once: `plan_run(cfg, run_dir, parts, scorer) -> RunPlan`.

`grpoflow train`, `grpoflow sft` and `grpoflow eval` build the same plan: the start-up check's resolved parts
(plan/checks.py), the rows read and checked, the model folder, the tokenizer (loaded once in this process: a warm
start saves the same one), the prompts tokenized as every role sees them, and the compute dtype resolved for this
machine. The controller and the commands take the plan and resolve nothing again, so `grpoflow eval` prepares its
prompts, samples and scores exactly as the run's validation did.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from grpoflow.config import Config, ConfigError, resolve_total_steps
from grpoflow.data.dataset import DataStats, PromptItem, load_rows, prepare_prompts
from grpoflow.models.loading import load_tokenizer
from grpoflow.models.spec import model_folder
from grpoflow.engines.choice import MachineFacts, probe_machine
from grpoflow.plan.checks import RunParts, auto_choice
from grpoflow.rewards import RewardScorer, unscored_message, unscored_sources
from grpoflow.tasks.addition import addition_splits
from grpoflow.tasks.chat_addition import chat_addition_splits
from grpoflow.tasks.multi_turn import calculator_splits, guess_number_splits
from grpoflow.tasks.reasoning_gym_tasks import default_val_spec, is_reasoning_gym, reasoning_gym_rows
from grpoflow.tasks.verifiers_tasks import is_verifiers, verifiers_rows
from grpoflow.training.bf16_units import this_machines_compute_dtype
from grpoflow.trajectories.chat import ChatRenderer

# built-in data name -> (the task's splits function, index of the split)
Splits = Callable[[], tuple[list[dict], list[dict]]]
BUILTIN_DATA: dict[str, tuple[Splits, int]] = {
    "builtin:addition/train": (addition_splits, 0), "builtin:addition/val": (addition_splits, 1),
    "builtin:chat_addition/train": (chat_addition_splits, 0), "builtin:chat_addition/val": (chat_addition_splits, 1),
    "builtin:guess_number/train": (guess_number_splits, 0), "builtin:guess_number/val": (guess_number_splits, 1),
    "builtin:calculator/train": (calculator_splits, 0), "builtin:calculator/val": (calculator_splits, 1)}


@dataclass(frozen=True, eq=False)
class RunPlan:
    """Everything a run is built from, resolved once (module docstring)."""
    cfg: Config                      # checked; compute dtype (and total_steps from total_epochs) resolved
    parts: RunParts                  # the registry names, resolved (plan/checks.py)
    scorer: RewardScorer | None      # the rule rewards (None: only a reward model, environment or agent scores)
    run_dir: Path
    model_path: str                  # the policy's folder: model.path's, then its warm start (`with_policy`)
    tokenizer: Any                   # the policy's tokenizer, loaded once
    train_rows: list[dict]
    val_rows: list[dict]
    train_items: list[PromptItem]
    val_items: list[PromptItem]
    stats: DataStats                 # what preparing the training prompts kept and dropped

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad id (0 if it has none): what pads token ids when batches of different widths meet."""
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else 0

    def decode(self, ids: list[int]) -> str:
        """Token ids -> text (special tokens kept: they show where turns end)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def with_policy(self, model_path: str) -> "RunPlan":
        """This plan training `model_path` (the warm start of model.path: the same tokenizer, saved with it)."""
        return dataclasses.replace(self, model_path=model_path)


def plan_run(cfg: Config, run_dir: str | Path, parts: RunParts, scorer: RewardScorer | None, *,
             model_path: str | None = None, held_out_only: bool = False) -> RunPlan:
    """The run of `cfg` (resolved by `with_compute_dtype`, checked by `check_config` into `parts`) in `run_dir`: rows
    read and their data sources checked, model.path's folder (a built-in built, a .gguf file dequantized into
    `run_dir`) or `model_path`, its tokenizer loaded (a conversation's chat template checked first), the prompts
    prepared, trainer.total_epochs turned into steps. `held_out_only` (`grpoflow eval`): no training rows."""
    if cfg.model.compute_dtype in (None, "auto"):
        raise ConfigError("model.compute_dtype is not resolved: call plan.with_compute_dtype(cfg) first, as "
                          "`grpoflow train` does.")
    run_dir = Path(run_dir)
    train_rows = [] if held_out_only else read_rows(cfg.data.train_files)
    val_rows = read_rows(val_files(cfg))
    check_scored_sources(cfg, train_rows + val_rows)
    folder = model_path or resolve_model(cfg, run_dir)
    tokenizer = load_tokenizer(folder)
    if cfg.rollout.conversational:  # the chat template must render token-exactly: checked first
        ChatRenderer(tokenizer)
    options = prompt_options(cfg, parts)
    train_items, stats = ([], DataStats()) if held_out_only else prepare_prompts(train_rows, tokenizer, **options)
    val_items = prepare_prompts(val_rows, tokenizer, **options)[0][:cfg.data.val_max_prompts] if val_rows else []
    if cfg.trainer.total_epochs is not None and not held_out_only:  # verl's trainer.total_epochs, TRL's epochs
        cfg = resolve_total_steps(cfg, stats.kept)  # the checked config, with total_steps from the epochs
    return RunPlan(cfg, parts, scorer, run_dir, folder, tokenizer, train_rows, val_rows, train_items, val_items,
                   stats)


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


def build_scorer(cfg: Config, parts: RunParts) -> RewardScorer | None:
    """The rule-reward scorer of the resolved reward (None when only a reward model scores)."""
    r = cfg.reward
    if parts.reward is None and not r.model.path and not cfg.rollout.multi_turn.env and not cfg.rollout.agent.enabled:
        raise ConfigError("No reward: set reward.function (or reward.functions), reward.model.path, a "
                          "rewarding rollout.multi_turn.env and/or a rollout.agent.program.")
    if parts.reward is None:
        return None
    return RewardScorer(parts.reward, error_score=r.error_score, timeout_s=r.timeout_s, workers=r.workers)


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


def prompt_options(cfg: Config, parts: RunParts) -> dict[str, Any]:
    """How the run tokenizes its prompts (`prepare_prompts`' options): the training prompts, the held-out ones and
    `grpoflow eval`'s alike. A multi-turn run renders every opening as chat (`workers.rollout_kinds.opening_of`),
    plain-string prompts included: they are tokenized the same way, so that their lengths are checked as rendered
    and data.system_prompt applies; the tools' schemas are rendered into templated prompts."""
    d = cfg.data
    chat = True if d.apply_chat_template is None and cfg.rollout.conversational else d.apply_chat_template
    return dict(prompt_key=d.prompt_key, max_prompt_length=d.max_prompt_length, overlong=d.overlong,
                apply_chat_template=chat, system_prompt=d.system_prompt, tools=parts.tool_schemas)


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
