"""Step time of backend=ray against backend=local on one machine, and the dispatch layer's share.

    .venv/bin/python bench/ray_vs_local.py               # default task, 20 steps per layout, ~3 min
    .venv/bin/python bench/ray_vs_local.py --steps 40 --layouts local,ray
    .venv/bin/python bench/ray_vs_local.py --model FOLDER --out DIR --steps 2 --layouts local,ray k=v ...
    .venv/bin/python bench/ray_vs_local.py --recipe guess_number --model FOLDER --layouts ray-split,ray-async

Every layout trains the same warm-started model on the built-in task (or on `--recipe`, e.g. the multi-turn
guess_number) with the same seed, each in its own `grpoflow train` subprocess. Per layout it prints the median step
time (steps after the first), the ratio to local, the median time in each stage, and `timing_s/dispatch`: the time
the controller spent in worker calls beyond the ranks' own time on them (serialisation, object transfer, Ray
scheduling), as a share of the step; then whether generation overlapped training (figures.overlap_figures): the
engines' generating time, the trainer's own work, the two in a row against the step, the generation hidden, and the
trainer-wait and rollout-wait shares of the step. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from figures import overlap_figures

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / ".cache"
# On a CPU machine a rank's CPUs are its torch threads: the one-rank layout gets all of them, like
# local; the others share them out (2 cores: one each for the actor and the engine, or for 2 ranks).
LAYOUTS = {
    "local": ["backend=local"],
    "ray": ["backend=ray", f"resources.cpus_per_rank={os.cpu_count()}"],
    "ray-split": ["backend=ray", "placement=split", f"resources.cpus_per_rank={max(1, os.cpu_count() // 2)}"],
    "ray-2-ranks": ["backend=ray", "resources.devices_per_node=2",
                    f"resources.cpus_per_rank={max(1, os.cpu_count() // 2)}"],
    "ray-async": ["backend=ray", "placement=split", f"resources.cpus_per_rank={max(1, os.cpu_count() // 2)}",
                  "trainer.mode=async", "rollout.max_staleness=1"],
}
STAGES = ["gen", "trainer_wait", "reward", "old_log_prob", "ref", "adv", "update_actor", "sync", "dispatch"]


def warm_model(size: str) -> str:
    """The SFT warm start of the built-in model, cached in bench/.cache (shared with compare_trl.py)."""
    folder = CACHE / f"tiny-{size}" / "sft_model"
    if not folder.exists():
        subprocess.run([sys.executable, "-m", "grpoflow.cli", "sft", f"model.path=builtin:tiny-{size}",
                        f"trainer.output_dir={folder.parent}"], check=True, cwd=ROOT)
    return str(folder)


def run_layout(name: str, model: str, steps: int, extra: list[str], root: Path = CACHE / "ray_vs_local",
               recipe: str | None = None) -> dict:
    out = root / name
    cmd = [sys.executable, "-m", "grpoflow.cli", "train", *([recipe] if recipe else []), *LAYOUTS[name],
           f"model.path={model}", "sft.steps=0",
           f"trainer.total_steps={steps}", "trainer.val_every=0", "trainer.save_every=0", "trainer.resume=never",
           f"trainer.output_dir={out}", "trainer.log_every=1000", *extra]
    began = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    records = [r for r in map(json.loads, open(out / "metrics.jsonl")) if "timing_s/step" in r][1:]
    med = {s: statistics.median(r.get(f"timing_s/{s}", 0.0) for r in records) for s in ["step", *STAGES]}
    return {"layout": name, "wall_s": wall, "s_per_step": med["step"], "stages": med,
            "dispatch_share": statistics.median(r["perf/dispatch_share"] for r in records),
            "reward_last": records[-1]["critic/score/mean"], "overlap": overlap_figures(records)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--size", default="4m")
    p.add_argument("--layouts", default="local,ray,ray-split,ray-2-ranks,ray-async")
    p.add_argument("--model", default=None, metavar="FOLDER", help="a model folder instead of the cached warm start")
    p.add_argument("--out", default=str(CACHE / "ray_vs_local"), metavar="DIR", help="the runs' folders")
    p.add_argument("--recipe", default=None, help="a recipe to train (default: the built-in task)")
    p.add_argument("overrides", nargs="*", help="extra key=value config overrides for every layout")
    args = p.parse_args(argv)
    model = args.model or warm_model(args.size)
    rows = [run_layout(name, model, args.steps, args.overrides, Path(args.out), args.recipe)
            for name in args.layouts.split(",")]
    local = next((r["s_per_step"] for r in rows if r["layout"] == "local"), None)
    print(f"\n{'layout':<12} {'s/step':>7} {'vs local':>8} {'dispatch':>9} " + " ".join(f"{s:>12}" for s in STAGES))
    for r in rows:
        ratio = f"{r['s_per_step'] / local:.2f}x" if local else "-"
        print(f"{r['layout']:<12} {r['s_per_step']:7.3f} {ratio:>8} {r['dispatch_share']:8.1%} "
              + " ".join(f"{r['stages'][s]:12.4f}" for s in STAGES))
    print(f"\n{'layout':<12} {'s/step':>7} {'gen_busy':>9} {'train':>7} {'in a row':>9} {'hidden':>7} "
          f"{'trainer-wait':>13} {'rollout-wait':>13}")
    for r in rows:
        o = r["overlap"]
        print(f"{r['layout']:<12} {o['step_s']:7.3f} {o['gen_busy_s']:9.3f} {o['train_s']:7.3f} {o['in_a_row_s']:9.3f} "
              f"{o['hidden_s']:7.3f} {o['trainer_wait_share']:13.1%} {o['rollout_wait_share']:13.1%}")
    print(json.dumps({"size": args.size, "steps": args.steps, "recipe": args.recipe, "rows": rows}))


if __name__ == "__main__":
    main()
