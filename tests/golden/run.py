"""The golden run: what it is, the numbers kept of it, and the machine that wrote them.

A shortened default job (`grpoflow train` with no arguments: the shipped 4M warm start on 2-digit addition, the
builtin recipe's learning rate, schedule, estimator and loss), 3 steps of 8 prompts x 4 samples in 2 mini-batches
(so PPO's ratio and clipping act, and the old-log-prob pass runs), float32 on one thread. Every default it does not
set (lr, clip, schedule, aggregation, sampling, the engine, the model's maths) moves its numbers.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

GOLDEN = Path(__file__).with_name("tiny_run.json")

OVERRIDES = ["data.prompts_per_step=8", "rollout.n=4", "actor.minibatches=2", "trainer.total_steps=3",
             "trainer.val_every=0", "trainer.log_every=1", "trainer.save_every=0", "trainer.threads=1",
             "model.compute_dtype=float32", "trainer.log_train_every=0"]

# per step: the losses, the gradient norm, the rewards, the lengths and the engine/trainer mismatch
KEYS = ["actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm", "actor/lr", "critic/score/mean",
        "response_length/mean", "mismatch/abs_log_ratio_mean"]


def run_golden(out_dir: Path) -> list[dict[str, float]]:
    """Train the golden run into `out_dir`; its KEYS per step (torch's thread count restored after)."""
    from grpoflow.commands.run import train
    from grpoflow.config import load_config
    from grpoflow.controller.metrics import read_metrics

    threads = torch.get_num_threads()
    try:
        train(load_config(None, [f"trainer.output_dir={out_dir}", *OVERRIDES]))
    finally:
        torch.set_num_threads(threads)
    return [{"step": r["step"], **{k: r[k] for k in KEYS}} for r in read_metrics(out_dir)]


def machine() -> dict[str, str]:
    """What decides the last bits of float32 results here: the CPU model, its matrix units, torch's version."""
    name, flags = platform.processor() or "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name in ("unknown", "x86_64", ""):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    units = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2") if f" {f}" in flags]
    return {"cpu": name, "units": " ".join(units), "torch": torch.__version__.split("+")[0]}


def read_golden() -> dict:
    return json.loads(GOLDEN.read_text())


# Across CPU kinds (another model, other matrix units or another torch) float32 products round differently:
# ~1e-6 relative per step, ~1e-5 after 3 steps. RTOL is 100x that and 20x below what a 10 % learning-rate change
# moves (grad norm 1.704 -> 1.670 at step 1, 3.59 -> 3.99 at step 2). The mismatch is ~4e-7 on every kind: it
# is held under MISMATCH_ATOL. Rewards and lengths stay exact unless a draw lands within ~1e-6 of a boundary of
# its inverse CDF, which the rounding then flips (a rare event, about 1e-3 per run by that estimate).
RTOL, ATOL, MISMATCH_ATOL = 1e-3, 1e-6, 1e-5


def differences(stored: list[dict], now: list[dict], *, exact: bool) -> list[str]:
    """One line per number of `now` that is not `stored`'s: bit for bit when `exact`, else within the bound."""
    if [r["step"] for r in stored] != [r["step"] for r in now]:
        return [f"steps {[r['step'] for r in now]} instead of {[r['step'] for r in stored]}"]
    lines = []
    for old, new in zip(stored, now):
        for k in KEYS:
            a, b = old.get(k), new.get(k)
            if a is None or b is None:
                ok = a is b
            elif exact:
                ok = a == b
            elif k.startswith("mismatch/"):
                ok = abs(b) <= MISMATCH_ATOL
            else:
                ok = abs(a - b) <= ATOL + RTOL * abs(a)
            if not ok:
                lines.append(f"step {old['step']} {k}: {b!r} instead of {a!r}")
    return lines
