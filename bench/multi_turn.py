"""Multi-turn steps before and after the one-rollout change, side by side in one run.

    .venv/bin/python bench/multi_turn.py [--before REF] [--steps K] [--model FOLDER]
    .venv/bin/python bench/multi_turn.py --model /tmp/grpoflow-smollm2/hf --prompts 4 --n 4 --max-new-tokens 160 \
        --set model.compute_dtype=bfloat16          # SmolLM2-135M-Instruct

Warm-starts the tiny model on guess-the-number demonstrations (or takes `--model`, e.g. SmolLM2-135M-Instruct's
HF folder), then runs `grpoflow train` for K steps on an environment with skewed turn counts
(bench/skewed_env.py: most conversations end at turn 1, a group in five runs to rollout.multi_turn.max_turns), once with
this checkout and once with the code at `--before` (default: the last commit before the change, the lockstep
loop: one generate call per turn over every live trajectory, each turn prefilled from scratch), checked out in
a temporary git worktree. Same config, seed and machine; the runs alternate. Prints, per version, medians over
steps 2..K of the step time, the generation stage, the reward, turns, and the prompt tokens the engine
prefilled per step (after: `multi_turn/prefilled_tokens`; before, which does not log it, every turn's whole
context: `multi_turn/context_tokens` of the same trajectories' shape).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "6753cb0"  # the last commit with the lockstep AgentLoop
KEYS = ["timing_s/step", "timing_s/gen", "reward/env/mean", "multi_turn/turns/mean", "multi_turn/turns/max",
        "multi_turn/prefilled_tokens", "multi_turn/context_tokens", "response_length/mean"]


def grpoflow(code: Path, args: list[str], threads: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run([sys.executable, "-m", "grpoflow.cli", *args], check=True, env=env, cwd=code,
                   stdout=subprocess.DEVNULL)


def medians(run: Path) -> dict[str, float]:
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    steps = [r for r in records if "timing_s/step" in r][1:]
    return {k: statistics.median(r[k] for r in steps) for k in KEYS if all(k in r for r in steps)}


def keys_of(code: Path, overrides: list[str]) -> list[str]:
    """`overrides` as the code at `code` names them: before rollout.multi_turn was a section (no
    grpoflow/config_moved.py there, since grpoflow/config/moved.py), its keys were flat (rollout.multi_turn.env ->
    rollout.env)."""
    if (code / "grpoflow" / "config_moved.py").exists() or (code / "grpoflow" / "config" / "moved.py").exists():
        return list(overrides)
    return [o.replace("rollout.multi_turn.", "rollout.", 1) for o in overrides]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default=BEFORE)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--model", default=None, help="an HF folder to start from (default: the tiny model, warm-started)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=320, help="each trajectory's budget (default 320)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default: 16, 8 with --model)")
    p.add_argument("--n", type=int, default=None, help="trajectories per prompt (default: the recipe's, 8)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for both versions")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="grpoflow-mt-bench-"))
    old = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), a.before], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        model = a.model
        if model is None:
            grpoflow(ROOT, ["sft", "guess_number", f"trainer.output_dir={tmp / 'warm'}"], a.threads)
            model = str(tmp / "warm" / "sft_model")
        common = ["train", "guess_number", f"model.path={model}", "sft.steps=0",
                  f"rollout.multi_turn.env={ROOT / 'bench' / 'skewed_env.py'}:SkewedTurns",
                  f"rollout.multi_turn.max_turns={a.max_turns}",
                  f"rollout.max_new_tokens={a.max_new_tokens}", f"trainer.total_steps={a.steps}", "trainer.val_every=0",
                  "trainer.save_every=0", "trainer.log_every=1", "trainer.resume=never"]
        if a.model is not None:
            common += ["data.apply_chat_template=true", "actor.lr=1e-6", "data.prompts_per_step=8"]
        if a.prompts is not None:
            common.append(f"data.prompts_per_step={a.prompts}")
        if a.n is not None:
            common.append(f"rollout.n={a.n}")
        common += a.set
        results: dict[str, list[dict[str, float]]] = {"before (lockstep)": [], "after (continuous + KV reuse)": []}
        for r in range(a.repeats):
            for name, code in (("before (lockstep)", old), ("after (continuous + KV reuse)", ROOT)):
                out = tmp / f"{name.split()[0]}-{r}"
                grpoflow(code, keys_of(code, common) + [f"trainer.output_dir={out}"], a.threads)
                results[name].append(medians(out))
        table = {name: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for name, ms in results.items()}
        after = table["after (continuous + KV reuse)"]
        table["before (lockstep)"].setdefault("multi_turn/prefilled_tokens", after.get("multi_turn/context_tokens",
                                                                                       float("nan")))
        print(f"{'':32s}" + "".join(f"{k.split('/')[-2] + '/' + k.split('/')[-1]:>22s}" for k in KEYS[:6]))
        for name, m in table.items():
            print(f"{name:32s}" + "".join(f"{m.get(k, float('nan')):22.3f}" for k in KEYS[:6]))
        before = table["before (lockstep)"]
        print(f"step time: {before['timing_s/step'] / after['timing_s/step']:.2f}x faster; generation "
              f"{before['timing_s/gen'] / after['timing_s/gen']:.2f}x; prefilled tokens "
              f"{before['multi_turn/prefilled_tokens'] / max(after['multi_turn/prefilled_tokens'], 1):.1f}x fewer "
              "(before: every turn's whole context)")
        print(json.dumps(table))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)


if __name__ == "__main__":
    main()
