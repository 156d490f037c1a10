"""Partial rollout (rollout.partial) on a task with a long-tailed response length: step time and reward, off vs on.

    .venv/bin/python bench/partial_rollout.py [--steps K] [--repeats R] [--threads T] [--sft-steps S]
                                              [--oversample X] [--max-staleness V]

The task: "c*L=" asks for the letter c written L times; L is 1-4 for most prompts and 40-100 for one in seven, so
a step's longest samples are 20-40 times its typical one. The reward is the share of the length right when the
answer is all c's (bench_reward.py, written next to the data). The tiny 0.5M model is warm-started on the answers
(S sft steps, the same seed: the same start for both runs), then `grpoflow train` runs K GRPO steps, once with
rollout.partial=false and once with rollout.partial=true (oversample X, default 1.5; staleness <= V, default 2); the
runs alternate when repeated. Prints, per setting, the medians over steps 2..K of the step time and the generation
stage, the mean score over the steps, the held-out score after the last step, and the partial-rollout metrics.
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


def run(folder: Path, out: Path, partial: bool, a: argparse.Namespace) -> None:
    steps = a.steps
    args = ["train", "model.path=builtin:tiny-0.5m", f"data.train_files=[{folder / 'train.jsonl'}]",
            f"data.val_files=[{folder / 'val.jsonl'}]", f"reward.function={folder / 'bench_reward.py'}:score",
            "data.prompts_per_step=16", "rollout.n=8", "rollout.max_new_tokens=128",
            f"trainer.total_steps={steps}", f"trainer.val_every={steps}", "trainer.save_every=0",
            "trainer.log_train_every=0", f"trainer.output_dir={out}", "trainer.resume=never",
            f"rollout.partial={str(partial).lower()}", f"rollout.partial_oversample={a.oversample}",
            f"rollout.partial_max_staleness={a.max_staleness}", f"sft.steps={a.sft_steps}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(a.threads), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run([sys.executable, "-m", "grpoflow.cli", *args], check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL)


def summary(out: Path) -> dict[str, float]:
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    steps = [r for r in records if "timing_s/step" in r]
    last = records[-1]
    row = {"step_s": statistics.median(r["timing_s/step"] for r in steps[1:]),
           "gen_s": statistics.median(r["timing_s/gen"] for r in steps[1:]),
           "score": statistics.mean(r["critic/score/mean"] for r in steps),
           "length": statistics.mean(r["response_length/mean"] for r in steps),
           "val": next((v for k, v in last.items() if k.startswith("val/") and "mean@1" in k), float("nan"))}
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
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--oversample", type=float, default=1.5, help="rollout.partial_oversample")
    p.add_argument("--max-staleness", type=int, default=2, help="rollout.partial_max_staleness")
    a = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="grpoflow-partial-bench-"))
    write_task(folder, rows=2000, seed=0)
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(a.repeats):
        for partial in (False, True):
            out = folder / f"run-{'partial' if partial else 'full'}-{r}"
            run(folder, out, partial, a)
            results[partial].append(summary(out))
    print(f"long-tailed lengths (1-4, one in seven 40-100), tiny-0.5m, 16 prompts x 8, {a.steps} steps, "
          f"{a.threads} threads, {a.repeats} run(s) each, partial: oversample {a.oversample}, max staleness "
          f"{a.max_staleness}; medians of steps 2..{a.steps}")
    for partial, rows in results.items():
        merged = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        print(f"rollout.partial={str(partial).lower():5s} " + "  ".join(f"{k} {v:.3f}" for k, v in merged.items()))
    off, on = (statistics.median(row["step_s"] for row in results[x]) for x in (False, True))
    print(f"step time: {off / on:.2f}x faster with rollout.partial")


if __name__ == "__main__":
    main()
