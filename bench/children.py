"""The bench's child processes: one warm start, one grpoflow run or one TRL run each (see compare_trl.py).

Each child runs in its own interpreter (`compare_trl.py --child KIND SPEC`) and prints one
`BENCH_RESULT {json}` line: per-step records in the same schema for both frameworks (seconds,
generation seconds, prompt / completion tokens, mean reward, stage seconds), the parameter
count, the held-out accuracy of the final weights and the peak RSS.
"""

from __future__ import annotations

import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

from figures import count_params, greedy_lengths, grpoflow_step
from rg_task import RG_TASKS

CACHE = Path(__file__).resolve().parent / ".cache"
HELDOUT = 200         # held-out prompts for the greedy accuracy (at most)
MAX_PROMPT_TOKENS = 64  # the longest prompt of either task (chat_addition through SmolLM2's template: <= 50)
# Per task: grpoflow's training data, the reward both frameworks use, the greedy budget for held-out answers.
TASKS = {"addition": {"train_files": "builtin:addition/train", "reward": "exact_match", "eval_new_tokens": 16},
         "chat_addition": {"train_files": "builtin:chat_addition/train", "reward": "gsm8k_flexible",
                           "eval_new_tokens": 24},
         # reasoning-gym (bench/rg_task.py): the training file is written on first use
         **{task: {"train_files": None, "reward": "gsm8k_flexible", "eval_new_tokens": 24} for task in RG_TASKS},
         # the multi-turn tool task of compare_trl_multi_turn.py (no single-turn held-out evaluation)
         "calculator": {"train_files": "builtin:calculator/train", "reward": "exact_match", "eval_new_tokens": 0}}


# ---------------------------------------------------------------- shared by both children

def set_threads(threads: int) -> None:
    import torch
    torch.set_num_threads(threads)


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def task_rows(task: str) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of a bench task: `prompt` (a string or chat messages) and `answer`."""
    if task == "chat_addition":
        from grpoflow.tasks.chat_addition import chat_addition_splits
        train, held = chat_addition_splits()
    elif task.startswith("rg_"):
        from rg_task import rg_splits
        train, held = rg_splits(task)
    elif task == "calculator":
        from grpoflow.tasks.multi_turn import calculator_splits
        train, held = calculator_splits()
    else:
        from grpoflow.tasks.addition import addition_splits
        train, held = addition_splits()
    return train, held[:HELDOUT]


def prompt_text(tokenizer, prompt) -> str:
    """The text a model sees: chat messages through the tokenizer's chat template, a string as it is."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


def train_files(task: str) -> str:
    """grpoflow's `data.train_files` entry of a bench task (a reasoning-gym task's jsonl is written on first use)."""
    if task.startswith("rg_"):
        from rg_task import rg_train_file
        return str(rg_train_file(task, CACHE))
    return TASKS[task]["train_files"]


def heldout_accuracy(model, tokenizer, task: str = "addition") -> float:
    """Mean reward of greedy answers to the held-out prompts (the task's reward)."""
    return heldout_eval(model, tokenizer, task)["accuracy"]


def heldout_eval(model, tokenizer, task: str = "addition") -> dict:
    """Greedy answers to the held-out prompts, one left-padded `generate` call: `accuracy` (mean reward),
    `greedy_length` (mean answer tokens, the EOS counted as in training) and `greedy_cut` (fraction of answers
    that ran to the budget without EOS)."""
    import torch
    from grpoflow.rewards.functions import load_reward_function
    _, rows = task_rows(task)
    reward = load_reward_function(TASKS[task]["reward"])
    texts = [prompt_text(tokenizer, r["prompt"]) for r in rows]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=TASKS[task]["eval_new_tokens"],
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    new = out[:, enc["input_ids"].shape[1]:]
    answers = tokenizer.batch_decode(new, skip_special_tokens=True)
    lengths, cut = greedy_lengths(new, tokenizer.eos_token_id)
    return {"accuracy": statistics.mean(float(reward(t, a, answer=r["answer"]) or 0.0)
                                        for r, t, a in zip(rows, texts, answers)),
            "greedy_length": statistics.mean(lengths), "greedy_cut": statistics.mean(cut)}


def emit(record: dict) -> None:
    """The child's result: one JSON line on stdout, marked so the parent finds it among other output."""
    print("BENCH_RESULT " + json.dumps(record), flush=True)


# ---------------------------------------------------------------- children

def child_prepare(spec: dict) -> dict:
    """Warm-start the built-in model of `spec["size"]` (cached) and measure its held-out accuracy; for a real model
    (`spec["real_model"]`, a folder) only the accuracy."""
    from grpoflow.config import load_config
    from grpoflow.commands.run import sft_stage
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    set_threads(spec["threads"])
    if spec.get("real_model"):  # its accuracy is cached per folder and weights file date
        path = spec["real_model"]
        key = f"{path}@{max(f.stat().st_mtime for f in Path(path).glob('*.safetensors'))}"
        known = CACHE / "real_model_accuracy.json"
        cached = json.loads(known.read_text()) if known.exists() else {}
        if key not in cached:
            cached[key] = heldout_accuracy(load_causal_lm(path), load_tokenizer(path), "chat_addition")
            known.parent.mkdir(parents=True, exist_ok=True)
            known.write_text(json.dumps(cached, indent=1))
        return {"model_path": path, "accuracy": cached[key]}
    run_dir = CACHE / f"tiny-{spec['size']}"
    cfg = load_config(None, [f"model.path=builtin:tiny-{spec['size']}", f"trainer.output_dir={run_dir}",
                             f"trainer.threads={spec['threads']}"])
    path = sft_stage(cfg)
    done = run_dir / "heldout_accuracy.json"  # the warm start is reused, so is its accuracy
    if not done.exists():
        acc = heldout_accuracy(load_causal_lm(path), load_tokenizer(path))
        done.write_text(json.dumps({"accuracy": acc}))
    return {"model_path": str(path), "base_model_path": str(run_dir.resolve() / "base_model"),
            "accuracy": json.loads(done.read_text())["accuracy"]}


def child_grpoflow(spec: dict) -> dict:
    """`grpoflow.commands.run.train` with the row's settings; per-step records from metrics.jsonl
    (figures.grpoflow_step)."""
    from grpoflow.config import load_config
    from grpoflow.controller.metrics import read_metrics
    from grpoflow.commands.run import train
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    set_threads(spec["threads"])
    out = Path(tempfile.mkdtemp(prefix="grpoflow-", dir=spec["tmp"]))
    task = spec.get("task", "addition")
    train(load_config(None, grpoflow_overrides(spec, out)))
    # the step's stages and model math are grpoflow's own metrics (timing_s/*): nothing in the package is wrapped
    records = [grpoflow_step(m, trajectories=spec["prompts"] * spec["group_size"]) for m in read_metrics(out)]
    actor = sorted((out / "checkpoints").glob("step_*/actor"))[-1]
    model = load_causal_lm(actor)
    held = heldout_eval(model, load_tokenizer(actor), task)
    return {"steps": records, "params": count_params(model), "compute_dtype": spec["compute_dtype"],
            **held, "weight_change": relative_change(model, spec["model_path"]), "threads": _torch_threads()}


def grpoflow_overrides(spec: dict, out: Path) -> list[str]:
    """grpoflow's config overrides for a bench run: the run's shape (model, task, prompts x n, budget, lr, steps,
    seed) and, unless `spec["match_trl"]` is false, the settings that make it the twin of the TRL child; then
    `spec["overrides"]` (key=value strings) last. With `match_trl` false every other setting is grpoflow's default.
    """
    n, steps, task = spec["group_size"], spec["steps"], spec.get("task", "addition")
    shape = [
        f"data.train_files=[{train_files(task)}]", f"reward.function={TASKS[task]['reward']}",
        f"model.path={spec['model_path']}", "sft.steps=0", f"data.prompts_per_step={spec['prompts']}",
        f"model.compute_dtype={spec['compute_dtype']}", f"rollout.n={n}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        f"actor.lr={spec['lr']}", f"actor.kl_coef={spec['kl']}",
        f"trainer.total_steps={steps}", "trainer.val_every=0", f"trainer.save_every={steps}",
        f"trainer.output_dir={out}", f"trainer.threads={spec['threads']}", f"trainer.seed={spec['seed']}",
        "trainer.resume=never"]
    twin = [
        "rollout.temperature=1.0", "actor.lr_schedule=constant", "actor.loss_agg_mode=token-mean",
        "actor.kl_estimator=k3",
        "algorithm.norm_adv_by_std=true", "algorithm.epsilon=1e-4"]  # TRL: (r - mean) / (std + 1e-4)
    if spec.get("microbatch", "step") == "step":
        # TRL runs a step's prompts x n samples as one forward/backward (per_device_train_batch_size): so does grpoflow
        # here, with a token budget that holds them all (the default comes from memory: training/budget.py).
        prompt_tokens = spec.get("max_prompt_tokens", MAX_PROMPT_TOKENS)
        budget = max(4096, spec["prompts"] * n * (prompt_tokens + spec["max_new_tokens"]))
        twin.append(f"actor.max_tokens_per_microbatch={budget}")
    return shape + (twin if spec.get("match_trl", True) else []) + list(spec.get("overrides", []))


def relative_change(model, start_path: str) -> float:
    """||w - w0|| / ||w0|| over all parameters: how far training moved the weights from the model at `start_path`."""
    import torch
    from grpoflow.models.loading import load_causal_lm
    start = dict(load_causal_lm(start_path).named_parameters())
    moved = total = 0.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            w0 = start[name].float()
            moved += float((p.float() - w0).pow(2).sum())
            total += float(w0.pow(2).sum())
    return (moved / max(total, 1e-30)) ** 0.5


def _torch_threads() -> int:
    import torch
    return torch.get_num_threads()


def child_trl(spec: dict) -> dict:
    """TRL's GRPOTrainer with the row's settings; a callback times each step, the reward records tokens."""
    import torch
    from datasets import Dataset
    from grpoflow.rewards.functions import load_reward_function
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    set_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)
    task = spec.get("task", "addition")
    reward = load_reward_function(TASKS[task]["reward"])
    train_rows = task_rows(task)[0]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train_rows])
    texts = [prompt_text(tokenizer, r["prompt"]) for r in train_rows]  # tokens counted here, not in the timed step
    lengths = dict(zip(texts, map(len, tokenizer(texts, add_special_tokens=False)["input_ids"])))
    timer = StepRecords()

    def task_reward(prompts, completions, completion_ids, answer, **_):
        """grpoflow's reward of the task per completion (chat completions: the assistant message's text); also
        records this step's tokens (the step's only call)."""
        prompts = [prompt_text(tokenizer, p) for p in prompts]
        completions = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        scores = [float(reward(p, c, answer=a) or 0.0) for p, c, a in zip(prompts, completions, answer)]
        timer.record(prompt_tokens=sum(lengths[p] for p in prompts), completion_ids=completion_ids,
                     eos=tokenizer.eos_token_id, scores=scores)
        return scores

    config = trl_config(spec)
    trainer = GRPOTrainer(model=model, reward_funcs=[task_reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer.callback()])
    trainer.train()
    held = heldout_eval(trainer.model, tokenizer, task)
    return {"steps": timer.records, "params": count_params(trainer.model), "compute_dtype": spec["compute_dtype"],
            **held, "weight_change": relative_change(trainer.model, spec["model_path"]), "threads": _torch_threads()}


def trl_config(spec: dict, **extra):
    """TRL's GRPOConfig for a bench run: the twin of grpoflow_overrides (one step's prompts x n samples in one
    forward/backward, constant lr, token-mean loss, group-std advantages, clip 0.2, KL `spec["kl"]`); `extra`: more
    GRPOConfig fields (e.g. max_tool_calling_iterations)."""
    from trl import GRPOConfig
    n = spec["group_size"]
    bf16 = spec["compute_dtype"] == "bfloat16"  # TRL's bf16=True: fp32 weights, bf16 autocast (accelerate)
    return GRPOConfig(
        output_dir=spec["tmp"], use_cpu=True, bf16=bf16, fp16=False,
        activation_checkpointing=False, gradient_checkpointing=False,
        per_device_train_batch_size=spec["prompts"] * n, gradient_accumulation_steps=1, num_generations=n,
        max_completion_length=spec["max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=spec["kl"], loss_type="dapo", scale_rewards="group", epsilon=0.2, num_iterations=1,
        max_steps=spec["steps"], seed=spec["seed"], logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, **extra)


class StepRecords:
    """Per-step records of a TRL run in the bench's schema: `callback()` times each step (on_step_begin to
    on_step_end); the reward function, called once per step after generation, `record`s its tokens and scores."""

    def __init__(self):
        self.records: list[dict] = []
        self.begin = 0.0

    def record(self, *, prompt_tokens: int, completion_ids: list[list[int]], eos: int, scores: list[float],
               **extra) -> None:
        self.records.append({"gen_seconds": time.perf_counter() - self.begin, "prompt_tokens": prompt_tokens,
                             "completion_tokens": sum(len(ids) for ids in completion_ids),
                             "reward": statistics.mean(scores),
                             "response_length": statistics.mean(len(ids) for ids in completion_ids),
                             "max_completion": max(len(ids) for ids in completion_ids),
                             "truncated": statistics.mean(float(not ids or ids[-1] != eos) for ids in completion_ids),
                             **extra})

    def callback(self):
        from transformers import TrainerCallback
        steps = self

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                steps.begin = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                record = steps.records[-1]
                record["seconds"] = time.perf_counter() - steps.begin
                record["stages"] = {"gen": record["gen_seconds"], "step": record["seconds"]}

        return StepTimer()


def child_evaluate(spec: dict) -> dict:
    """`heldout_eval` of the model at `spec["model_path"]` on `spec["task"]` (the before-RL figures), cached per
    folder, weights date, task and held-out rows (a changed split is evaluated again)."""
    import hashlib
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    set_threads(spec["threads"])
    path, task = spec["model_path"], spec["task"]
    rows = hashlib.sha256(json.dumps(task_rows(task)[1], sort_keys=True).encode()).hexdigest()[:16]
    key = f"{path}@{max(f.stat().st_mtime for f in Path(path).glob('*.safetensors'))}@{task}@{rows}"
    known = CACHE / "heldout_eval.json"
    cached = json.loads(known.read_text()) if known.exists() else {}
    if key not in cached:
        cached[key] = heldout_eval(load_causal_lm(path), load_tokenizer(path), task)
        known.parent.mkdir(parents=True, exist_ok=True)
        known.write_text(json.dumps(cached, indent=1))
    return cached[key]


CHILDREN = {"prepare": child_prepare, "grpoflow": child_grpoflow, "trl": child_trl, "evaluate": child_evaluate}
