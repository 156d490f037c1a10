"""Partial rollout (rollout.partial) on a long-tailed task: step time and reward, off vs on.

    .venv/bin/python bench/partial_rollout.py [--task lengths|skewed_turns] [--steps K] [--repeats R] [--threads T]
                                              [--sft-steps S] [--oversample X] [--max-staleness V] [--max-turns M]

--task lengths (single-turn, the default): "c*L=" asks for the letter c written L times; L is 1-4 for most prompts
and 40-100 for one in seven, so a step's longest samples are 20-40 times its typical one. The reward is the share of
the length right when the answer is all c's (bench_reward.py, written next to the data). The tiny 0.5M model is
warm-started on the answers (S sft steps, default 300).

--task skewed_turns (conversations): guess_number's rows and warm start (the tiny 0.5M model, S sft steps on its
demonstration conversations, default 120) against bench/skewed_env.py: most conversations end after the model's
first turn, a group in five runs to rollout.multi_turn.max_turns (M, default 8; the budget 320 tokens). Paused
conversations continue by replay (docs/partial-rollout.md).

Both: the same warm start for both runs, then `grpoflow train` runs K GRPO steps of 16 prompts x 8, once with
rollout.partial.enable=false and once with rollout.partial.enable=true (oversample X, default 1.5; staleness <= V,
default 2); the runs alternate when repeated. Prints, per setting, the medians over steps 2..K of the step time and
the generation stage, the mean score over the steps, the held-out score after the last step, and the partial-rollout
metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REWARD = '''
def score(prompt, completion, answer, **row):
    """The share of the requested length hit, when the completion is the requested letter only."""
    text = completion.strip()
    if not text or set(text) != set(answer[:1]):
        return 0.0
    return max(0.0, 1.0 - abs(len(text) - len(answer)) / len(answer))
'''


def write_task(folder: Path, rows: int, seed: int) -> None:
    """train.jsonl / val.jsonl of "c*L=" -> c * L, L long-tailed; bench_reward.py."""
    rng = random.Random(seed)
    for name, count in (("train", rows), ("val", 64)):
        with open(folder / f"{name}.jsonl", "w") as f:
            for _ in range(count):
                c = rng.choice("abcdefgh")
                length = rng.randint(40, 100) if rng.random() < 1 / 7 else rng.randint(1, 4)
                f.write(json.dumps({"prompt": f"{c}*{length}=", "answer": c * length}) + "\n")
    (folder / "bench_reward.py").write_text(REWARD)


def grpoflow(args: list[str], threads: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run([sys.executable, "-m", "grpoflow.cli", *args], check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL)


def task_args(folder: Path, a: argparse.Namespace) -> list[str]:
    """The task's part of `grpoflow train`'s arguments (the recipe first), after writing its data or warm start."""
    if a.task == "lengths":
        write_task(folder, rows=2000, seed=0)
        return ["model.path=builtin:tiny-0.5m", f"data.train_files=[{folder / 'train.jsonl'}]",
                f"data.val_files=[{folder / 'val.jsonl'}]", f"reward.function={folder / 'bench_reward.py'}:score",
                "rollout.max_new_tokens=128", f"sft.steps={a.sft_steps or 300}"]
    grpoflow(["sft", "guess_number", "model.path=builtin:tiny-0.5m", f"sft.steps={a.sft_steps or 120}",
              f"trainer.output_dir={folder / 'warm'}"], a.threads)
    return ["guess_number", f"model.path={folder / 'warm' / 'sft_model'}", "sft.steps=0",
            f"rollout.multi_turn.env={ROOT / 'bench' / 'skewed_env.py'}:SkewedTurns",
            f"rollout.multi_turn.max_turns={a.max_turns}",
            "rollout.max_new_tokens=320", "data.val_max_prompts=32"]


def run(task: list[str], out: Path, partial: bool, a: argparse.Namespace) -> None:
    steps = a.steps
    grpoflow(["train", *task, "data.prompts_per_step=16", "rollout.n=8", f"trainer.total_steps={steps}",
              f"trainer.val_every={steps}", "trainer.save_every=0", "trainer.log_train_every=0",
              f"trainer.output_dir={out}", "trainer.resume=never", f"rollout.partial.enable={str(partial).lower()}",
              f"rollout.partial.oversample={a.oversample}", f"rollout.partial.max_staleness={a.max_staleness}"],
             a.threads)


def summary(out: Path) -> dict[str, float]:
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    steps = [r for r in records if "timing_s/step" in r]
    last = records[-1]
    row = {"step_s": statistics.median(r["timing_s/step"] for r in steps[1:]),
           "gen_s": statistics.median(r["timing_s/gen"] for r in steps[1:]),
           "score": statistics.mean(r["critic/score/mean"] for r in steps),
           "length": statistics.mean(r["response_length/mean"] for r in steps),
           "val": next((v for k, v in sorted(last.items()) if k.startswith("val/") and "/mean@" in k), float("nan"))}
    if "multi_turn/turns/mean" in steps[0]:
        row["turns"] = statistics.mean(r["multi_turn/turns/mean"] for r in steps)
    for key in ("rollout/partial/staleness/mean", "rollout/partial/multi_version_frac",
                "rollout/partial/staleness/max", "rollout/partial/carried_samples", "rollout/partial/restarted_groups"):
        if key in steps[-1]:
            row[key.removeprefix("rollout/partial/")] = statistics.mean(r[key] for r in steps)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--task", choices=["lengths", "skewed_turns"], default="lengths")
    p.add_argument("--sft-steps", type=int, default=0, help="warm-start steps (0: the task's default)")
    p.add_argument("--max-turns", type=int, default=8, help="skewed_turns: rollout.multi_turn.max_turns")
    p.add_argument("--oversample", type=float, default=1.5, help="rollout.partial.oversample")
    p.add_argument("--max-staleness", type=int, default=2, help="rollout.partial.max_staleness")
    a = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="grpoflow-partial-bench-"))
    task = task_args(folder, a)
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(a.repeats):
        for partial in (False, True):
            out = folder / f"run-{'partial' if partial else 'full'}-{r}"
            run(task, out, partial, a)
            results[partial].append(summary(out))
    what = "long-tailed lengths (1-4, one in seven 40-100)" if a.task == "lengths" else \
        f"skewed turns (1, a group in five {a.max_turns})"
    print(f"{what}, tiny-0.5m, 16 prompts x 8, {a.steps} steps, "
          f"{a.threads} threads, {a.repeats} run(s) each, partial: oversample {a.oversample}, max staleness "
          f"{a.max_staleness}; medians of steps 2..{a.steps}")
    for partial, rows in results.items():
        merged = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        print(f"rollout.partial.enable={str(partial).lower():5s} "
              + "  ".join(f"{k} {v:.3f}" for k, v in merged.items()))
    off, on = (statistics.median(row["step_s"] for row in results[x]) for x in (False, True))
    print(f"step time: {off / on:.2f}x faster with rollout.partial")


if __name__ == "__main__":
    main()
