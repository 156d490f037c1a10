"""The supervised warm-start stage (`grpoflow sft`, and the first stage of the default job).

A model trained from scratch never samples a right answer, so GRPO has no signal: a short
supervised pass on (prompt, target) pairs gives it a starting accuracy to improve on. The loss
is the mean cross-entropy over target tokens (+ EOS); prompt tokens are not trained.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from grpoflow.atomic_folder import MANIFEST, damaged_file, write_manifest
from grpoflow.commands.sft_probe import Probe, greedy_accuracy
from grpoflow.data.dataset import render_prompt
from grpoflow.errors import UserError
from grpoflow.training.engine import TrainEngine
from grpoflow.training.precision import role_precision
from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.models.logprobs import compute_autocast
from grpoflow.models.warm_start import SFT_MARKER
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.env import with_system_prompt


def lookup(row: dict, key: str):
    """row["a"]["b"] for key "a.b"; None when absent."""
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


Example = tuple[list[int], list[int], list[int]]  # prompt ids, target ids, 1 on the target ids that are trained


def sft_examples(rows: list[dict], tokenizer, prompt_key: str, response_key: str, *, system_prompt: str | None = None,
                 tools: list[dict] | None = None) -> list[Example]:
    """(prompt ids, target ids, target mask) per row: a string prompt and a target (trained: its ids + EOS), or
    a target that is a whole conversation in chat messages (a multi-turn demonstration: rendered by the rules
    of a rollout, `trajectories.chat`, with the run's `tools` schemas and `system_prompt` first, as the rollout's
    prompts are; only the assistant turns are trained)."""
    examples: list[Example] = []
    renderer = None
    for row in rows:
        prompt, target = row.get(prompt_key), lookup(row, response_key)
        if isinstance(target, list):
            if renderer is None:
                renderer = ChatRenderer(tokenizer, tools)
            prompt_ids, segments = renderer.conversation_ids(with_system_prompt(target, system_prompt))
            examples.append((prompt_ids, [t for ids, _ in segments for t in ids],
                             [int(mine) for ids, mine in segments for _ in ids]))
        elif isinstance(prompt, (str, list)) and target is not None:  # chat messages render as the run's do
            ids = tokenizer.encode(str(target), add_special_tokens=False) + [tokenizer.eos_token_id]
            text = render_prompt(prompt, tokenizer, system_prompt)
            examples.append((tokenizer.encode(text, add_special_tokens=False), ids, [1] * len(ids)))
    if not examples:
        raise UserError(f"sft: no row has a `{prompt_key}` (a string or chat messages) and a `{response_key}` "
                        "target; set sft.response_key to the column holding the target completion (verl's rows: "
                        "sft.response_key=reward_model.ground_truth), or sft.steps=0 for no warm start.")
    return examples


def collate(examples: list[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels (-100 on prompt, untrained target tokens and padding)."""
    width = max(len(p) + len(t) for p, t, _ in examples)
    ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (p, t, trained) in enumerate(examples):
        seq = torch.tensor(p + t)
        ids[i, :len(seq)] = seq
        mask[i, :len(seq)] = 1
        target = torch.tensor(t)
        labels[i, len(p):len(seq)] = torch.where(torch.tensor(trained, dtype=torch.bool), target, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def run_sft(model_path: str, rows: list[dict], out_dir: str | Path, *, steps: int, lr: float, batch_size: int,
            prompt_key: str = "prompt", response_key: str = "answer", seed: int = 0, system_prompt: str | None = None,
            tools: list[dict] | None = None, compute_dtype: str | None = "float32", until_accuracy: float | None = None,
            probe_rows: int = 200, check_every: int = 25, tokenizer: Any = None) -> str:
    """Train `steps` supervised steps from `model_path`, save to `out_dir` (HF folder); return it.
    `system_prompt` and `tools` render conversation targets as the rollout renders its prompts (sft_examples);
    `compute_dtype` (model.compute_dtype) is the autocast of the forward, as in RL. `until_accuracy`: hold back
    `probe_rows` rows (never trained on) and stop at the first check, every `check_every` steps, where the greedy
    completions of at least that share are exactly their targets (sft_probe.py); `steps` is then the most.
    `tokenizer`: `model_path`'s, already loaded (the run's plan); None: loaded here. It is saved with the model.

    If `out_dir` already holds a warm start with the same settings (a resumed run), it is reused."""
    rows_hash = hashlib.sha1(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    settings = {"model_path": str(model_path), "rows": rows_hash, "steps": steps, "lr": lr,
                "batch_size": batch_size, "prompt_key": prompt_key, "response_key": response_key, "seed": seed}
    settings.update({k: v for k, v in (("system_prompt", system_prompt), ("tools", tools)) if v is not None})
    if compute_dtype != "float32":
        settings["compute_dtype"] = compute_dtype
    if until_accuracy is not None:
        settings.update(until_accuracy=until_accuracy, probe_rows=probe_rows, check_every=check_every)
    if finished_sft(out_dir, settings):
        tqdm.write(f"sft: reusing the warm start in {out_dir}")
        return str(out_dir)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_path)
    precision = role_precision("sft", compute_dtype=compute_dtype)  # float32 weights, autocast
    model = load_causal_lm(model_path, dtype=precision.weights)
    examples = sft_examples(rows, tokenizer, prompt_key, response_key, system_prompt=system_prompt, tools=tools)
    gen = torch.Generator().manual_seed(seed)
    probe: Probe = []
    if until_accuracy is not None:
        examples, probe = hold_back(examples, rows, response_key, probe_rows, gen)
    engine = TrainEngine(model, lr=lr, grad_clip=1.0, precision=precision)
    start, loss, done, accuracy = time.perf_counter(), float("nan"), 0, None
    bar = tqdm(total=steps, desc="sft", unit="step", leave=False)
    for done in range(1, steps + 1):
        idx = torch.randint(len(examples), (batch_size,), generator=gen).tolist()
        batch = collate([examples[i] for i in idx], tokenizer.pad_token_id)
        metrics = engine.forward_backward([batch], lambda m, b: _ce(m, b, precision.compute_dtype))
        engine.optimizer_step()
        loss = metrics["loss"]
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}")
        if probe and (done % check_every == 0 or done == steps):
            accuracy = greedy_accuracy(model, probe, pad_token_id=tokenizer.pad_token_id,
                                       eos_token_id=tokenizer.eos_token_id)
            bar.set_postfix(loss=f"{loss:.3f}", probe=f"{accuracy:.1%}")
            if until_accuracy is not None and accuracy >= until_accuracy:
                break
    bar.close()
    if accuracy is not None and until_accuracy is not None and accuracy >= until_accuracy:
        tqdm.write(f"sft: stopped after {done} steps: greedy accuracy {accuracy:.1%} on {len(probe)} held-back rows "
                   f"(sft.until_accuracy={until_accuracy})")
    elif accuracy is not None:
        tqdm.write(f"WARNING: sft: greedy accuracy {accuracy:.1%} on {len(probe)} held-back rows after all "
                   f"sft.steps={steps}, below sft.until_accuracy={until_accuracy}; RL starts from there (raise "
                   "sft.steps or sft.lr to get further).")
    # written aside and renamed, so a folder that exists is complete (a resumed run reuses it)
    tmp = Path(f"{out_dir}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / SFT_MARKER).write_text(json.dumps(settings))
    write_manifest(tmp)  # sizes and SHA-256s: a resumed run checks them before it reuses this folder
    if Path(out_dir).exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    tqdm.write(f"sft: {done} steps in {time.perf_counter() - start:.1f}s, final loss {loss:.3f} -> {out_dir}")
    return str(out_dir)


def hold_back(examples: list[Example], rows: list[dict], response_key: str, count: int, gen: torch.Generator
              ) -> tuple[list[Example], Probe]:
    """(the examples to train on, the probe): `count` examples drawn by `gen`, held back as (prompt ids, target
    ids without EOS). Only plain string targets can be probed; conversations are refused."""
    if any(isinstance(lookup(row, response_key), list) for row in rows):
        raise UserError("sft.until_accuracy checks greedy completions against string targets, and this warm start's "
                        f"`{response_key}` holds conversations: set sft.until_accuracy=null (a fixed sft.steps).")
    if not 0 < count < len(examples):
        raise UserError(f"sft.probe_rows={count} must be between 1 and the {len(examples)} warm-start rows minus "
                        "one (the rest are trained on).")
    order = torch.randperm(len(examples), generator=gen).tolist()
    probe = [(examples[i][0], examples[i][1][:-1]) for i in order[:count]]
    return [examples[i] for i in order[count:]], probe


def finished_sft(out_dir: str | Path, settings: dict) -> bool:
    """True if `out_dir` holds a warm start made with exactly these settings, whose files match their manifest (a
    damaged one is trained again, with a warning; one written before manifests were kept is taken as it is)."""
    marker = Path(out_dir) / SFT_MARKER
    if not (marker.exists() and json.loads(marker.read_text()) == settings):
        return False
    wrong = damaged_file(Path(out_dir)) if (Path(out_dir) / MANIFEST).exists() else None
    if wrong is not None:
        tqdm.write(f"sft: the warm start in {out_dir} is damaged ({wrong}); it is trained again")
    return wrong is None


def _ce(model: torch.nn.Module, batch: dict, compute_dtype: str | None) -> tuple[torch.Tensor, dict]:
    with compute_autocast(compute_dtype, batch["input_ids"].device):
        loss = model(**batch).loss
    return loss, {"loss": loss.detach()}
