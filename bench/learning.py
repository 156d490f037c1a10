"""Learning per step, over seeds: grpoflow (its defaults) and TRL's GRPOTrainer, K steps each, several seeds.

    .venv/bin/python bench/learning.py --task addition                      # tiny warm-started model, ≈5 min
    .venv/bin/python bench/learning.py --task chat_addition --model /tmp/grpoflow-smollm2/hf --steps 10
    .venv/bin/python bench/learning.py --task rg_chain_sum --model /tmp/grpoflow-smollm2/hf --steps 10
    .venv/bin/python bench/learning.py ... --variant eps4 algorithm.epsilon=1e-4   # a grpoflow variant beside
    .venv/bin/python bench/learning.py --task rg_gcd ... --seeds 1 --out piece.json  # one piece of a study
    .venv/bin/python bench/learning.py --merge pieces/*.json                        # tasks x seeds, merged

A study across tasks runs in pieces (one task, one or more seeds, one or more frameworks; `--out` keeps each piece's
runs)
that `--merge` puts together: per task the mean ± SE over its seeds, overall the mean of the task means with
SE = sqrt(sum of the task SEs squared) / tasks, and the difference grpoflow minus TRL in held-out gain.

Each run is one child process of bench/compare_trl.py (`--child grpoflow|trl`, see bench/children.py), one
after another, seed by seed (grpoflow, TRL, then the next seed), so slow drift of a shared machine hits both.
grpoflow runs with its config defaults except the run's shape (model, task, prompts x n, response budget,
learning rate, steps, seed; `match_trl=False` in `children.grpoflow_overrides`); TRL with the settings of the
speed bench (bench/children.py `child_trl`: constant learning rate, `loss_type="dapo"`, group std scaling,
clip 0.2, grad-norm clip 1, β 0, temperature 1, no top-k / top-p), which are TRL 1.16's defaults except the
learning-rate schedule (TRL's default decays linearly to 0; grpoflow's default is constant).

What it prints, per framework, mean ± standard error over the seeds (SE = sample std / sqrt(seeds)):
- held-out: mean greedy reward on the task's held-out prompts after the last step (`children.heldout_eval`:
  one HF `generate` for every framework's final weights), and its gain over the model before RL;
- greedy length / cut: mean greedy answer tokens (EOS included) and the fraction that hit the budget;
- the sampled reward curve (mean training reward of each step's n x prompts samples) and the sampled
  response length at the first and last steps; the relative weight change ||w - w0|| / ||w0||; s/step.
Then the difference of held-out gains, grpoflow minus TRL, ± its standard error (the two SEs in quadrature).
The last line printed is one JSON object (also written to `--out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import TASKS  # noqa: E402
from compare_trl import CACHE, spawn, wait_until_idle  # noqa: E402

TINY_SIZES = ("0.5m", "4m", "30m")  # --model given as one of these: the built-in model, warm-started (cached)


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n); 0 for one value)."""
    m = statistics.mean(values)
    return m, (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)


def diff_se(a: list[float], b: list[float]) -> tuple[float, float]:
    """mean(a) - mean(b) and the standard error of that difference (independent samples)."""
    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    return ma - mb, (sa ** 2 + sb ** 2) ** 0.5


def runs_of(args) -> list[tuple[str, str, list[str]]]:
    """(label, child kind, grpoflow overrides) of every run of one seed."""
    runs = [(f, f, []) for f in args.frameworks]
    return runs + [(f"grpoflow-{label}", "grpoflow", list(overrides)) for label, *overrides in args.variant]


def start_model(args, logs: Path) -> str:
    """The model every run starts from: a folder, or the warm-started built-in model of a tiny size."""
    if args.model not in TINY_SIZES:
        return args.model
    prepared = spawn("prepare", {"size": args.model, "threads": args.threads}, logs / "prepare.log", args.threads)
    return prepared["model_path"]


def summarize(label: str, results: list[dict], before: dict) -> dict:
    """One framework's figures over its seeds."""
    def over_seeds(fn) -> tuple[float, float]:
        return mean_se([fn(r) for r in results])

    steps = len(results[0]["steps"])
    edge = min(3, steps)
    return {"label": label, "seeds": len(results),
            "accuracy": over_seeds(lambda r: r["accuracy"]),
            "gain": over_seeds(lambda r: r["accuracy"] - before["accuracy"]),
            "greedy_length": over_seeds(lambda r: r["greedy_length"]),
            "greedy_cut": over_seeds(lambda r: r["greedy_cut"]),
            "reward_curve": [statistics.mean(r["steps"][t]["reward"] for r in results) for t in range(steps)],
            "reward_first": over_seeds(lambda r: statistics.mean(s["reward"] for s in r["steps"][:edge])),
            "reward_last": over_seeds(lambda r: statistics.mean(s["reward"] for s in r["steps"][-edge:])),
            "length_first": over_seeds(lambda r: statistics.mean(s["response_length"] for s in r["steps"][:edge])),
            "length_last": over_seeds(lambda r: statistics.mean(s["response_length"] for s in r["steps"][-edge:])),
            "truncated_last": over_seeds(lambda r: statistics.mean(s["truncated"] for s in r["steps"][-edge:])),
            "weight_change": over_seeds(lambda r: r["weight_change"]),
            "s_per_step": over_seeds(lambda r: statistics.median(s["seconds"] for s in r["steps"][1:] or r["steps"])),
            "per_seed": [{"seed": r["seed"], "accuracy": r["accuracy"], "greedy_length": r["greedy_length"],
                          "greedy_cut": r["greedy_cut"]} for r in results]}


def pm(pair: tuple[float, float], fmt: str) -> str:
    """"mean ± SE" (the SE without a sign); "mean (1 seed)" where the SE is NaN (`merge`: one seed, no spread)."""
    if pair[1] != pair[1]:
        return f"{fmt.format(pair[0])} (1 seed)"
    return f"{fmt.format(pair[0])} ± {fmt.replace('+', '').format(pair[1])}"


def report(args, before: dict, figures: list[dict]) -> str:
    """The tables, as markdown."""
    lines = [f"{args.task} on {args.model}: {args.prompts} prompts x {args.group_size} samples, <= "
             f"{args.max_new_tokens} new tokens, lr {args.lr:g}, {args.steps} steps, compute {args.compute_dtype}, "
             f"seeds {' '.join(map(str, args.seeds))}; mean ± SE over seeds",
             f"before RL: held-out {before['accuracy']:.1%}, greedy length {before['greedy_length']:.1f}, "
             f"cut {before['greedy_cut']:.0%}", "",
             "| framework | held-out after | gain | greedy length | greedy cut | sampled reward first 3 → last 3 | "
             "sampled length first → last | truncated last 3 | weight change | s/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for f in figures:
        lines.append(f"| {f['label']} | {pm(f['accuracy'], '{:.1%}')} | {pm(f['gain'], '{:+.1%}')} | "
                     f"{pm(f['greedy_length'], '{:.1f}')} | {pm(f['greedy_cut'], '{:.0%}')} | "
                     f"{pm(f['reward_first'], '{:.2f}')} → {pm(f['reward_last'], '{:.2f}')} | "
                     f"{pm(f['length_first'], '{:.1f}')} → {pm(f['length_last'], '{:.1f}')} | "
                     f"{pm(f['truncated_last'], '{:.0%}')} | {pm(f['weight_change'], '{:.2e}')} | "
                     f"{pm(f['s_per_step'], '{:.1f}')} |")
    steps = len(figures[0]["reward_curve"])
    lines += ["", "sampled reward per step (mean over seeds)", "",
              "| framework | " + " | ".join(str(t + 1) for t in range(steps)) + " |", "|---|" + "---|" * steps]
    lines += [f"| {f['label']} | " + " | ".join(f"{r:.2f}" for r in f["reward_curve"]) + " |" for f in figures]
    lines += ["", "per seed: held-out (greedy length)", ""]
    for f in figures:
        lines.append(f"- {f['label']}: " + ", ".join(f"seed {s['seed']} {s['accuracy']:.1%} ({s['greedy_length']:.1f})"
                                                    for s in f["per_seed"]))
    trl = next((f for f in figures if f["label"] == "trl"), None)
    if trl is not None:
        lines.append("")
        for f in figures:
            if f is not trl:
                d = diff_se([s["accuracy"] for s in f["per_seed"]], [s["accuracy"] for s in trl["per_seed"]])
                lines.append(f"{f['label']} - trl held-out: {d[0]:+.1%} ± {d[1]:.1%}")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="addition", choices=[t for t in TASKS if t != "calculator"])
    p.add_argument("--model", default="4m", help="an HF folder, or a built-in size (0.5m, 4m, 30m; warm-started)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 16 (tiny), 24 (a folder)")
    p.add_argument("--lr", type=float, default=None, help="default: 5e-5 (tiny), 1e-5 (a folder)")
    p.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--frameworks", nargs="+", default=["grpoflow", "trl"], choices=["grpoflow", "trl"])
    p.add_argument("--variant", nargs="+", action="append", default=[], metavar=("LABEL", "KEY=VALUE"),
                   help="also run grpoflow with these overrides, labelled grpoflow-LABEL (repeatable)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--wait-idle", type=float, default=0.0, help="wait up to this many seconds for idle cores")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="PIECE",
                   help="print the study table of these pieces' JSON files (written by --out) and run nothing")
    args = p.parse_args(argv)
    tiny = args.model in TINY_SIZES
    args.max_new_tokens = args.max_new_tokens or (16 if tiny else 24)
    args.lr = args.lr or (5e-5 if tiny else 1e-5)
    return args


SHAPE = ("model", "steps", "prompts", "group_size", "max_new_tokens", "lr", "compute_dtype", "variant")


def merge(paths: list[Path]) -> str:
    """The study table of several pieces (`--out` files): per task, every framework's held-out accuracy and gain over
    all the task's seeds; then the overall gain (mean of the task means, SE from the task SEs) and grpoflow - TRL,
    over the tasks that every framework has run."""
    pieces = [json.loads(p.read_text()) for p in paths]
    tasks: dict[str, dict] = {}
    for piece, path in zip(pieces, paths):
        if "runs" not in piece:
            raise SystemExit(f"{path} has no per-seed runs: it was written before --merge existed; run it again")
        task = tasks.setdefault(piece["args"]["task"], {"shape": {k: piece["args"][k] for k in SHAPE},
                                                        "before": piece["before"], "runs": {}})
        shape = {k: piece["args"][k] for k in SHAPE}
        if piece["before"]["accuracy"] != task["before"]["accuracy"]:
            raise SystemExit(f"{path} measured {piece['args']['task']} before RL at {piece['before']['accuracy']:.1%}, "
                             f"another piece at {task['before']['accuracy']:.1%}: their held-out rows differ")
        if shape != task["shape"]:
            raise SystemExit(f"{path} ran {piece['args']['task']} with {shape}, another piece with {task['shape']}: "
                             "merge only pieces of one shape")
        for label, runs in piece["runs"].items():
            seen = {r["seed"] for r in task["runs"].get(label, [])}
            twice = seen & {r["seed"] for r in runs}
            if twice:
                raise SystemExit(f"{label} seed {sorted(twice)} of {piece['args']['task']} is in two pieces")
            task["runs"].setdefault(label, []).extend(runs)
    shape = next(iter(tasks.values()))["shape"]
    labels = list(dict.fromkeys(label for task in tasks.values() for label in task["runs"]))
    lines = [f"{shape['model']}: {shape['prompts']} prompts x {shape['group_size']} samples, <= "
             f"{shape['max_new_tokens']} new tokens, lr {shape['lr']:g}, {shape['steps']} steps, compute "
             f"{shape['compute_dtype']}; held-out greedy accuracy, mean ± SE over seeds", "",
             "| task | before | seeds | " + " | ".join(f"{label} after | {label} gain" for label in labels)
             + (" | grpoflow - trl |" if {"grpoflow", "trl"} <= set(labels) else " |"),
             "|---|---|---|" + "---|---|" * len(labels) + ("---|" if {"grpoflow", "trl"} <= set(labels) else "")]
    def spread(values: list[float]) -> tuple[float, float]:  # one seed has no standard error: NaN, not 0
        return mean_se(values) if len(values) > 1 else (values[0], float("nan"))

    gains: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    diffs = []
    for name, task in tasks.items():
        base = task["before"]["accuracy"]
        cells = []
        complete = all(task["runs"].get(label) for label in labels)  # only these count in the overall row
        for label in labels:
            accs = [r["accuracy"] for r in task["runs"].get(label, [])]
            if not accs:
                cells.append("not run | not run")
                continue
            gain = spread([a - base for a in accs])
            if complete:
                gains[label].append(gain)
            cells.append(f"{pm(spread(accs), '{:.1%}')} | {pm(gain, '{:+.1%}')}")
        seeds = sorted({r["seed"] for runs in task["runs"].values() for r in runs})
        row = f"| {name} | {base:.1%} | {' '.join(map(str, seeds))} | " + " | ".join(cells)
        if complete and {"grpoflow", "trl"} <= set(labels):
            ours, theirs = ([r["accuracy"] for r in task["runs"][label]] for label in ("grpoflow", "trl"))
            d = diff_se(ours, theirs) if min(len(ours), len(theirs)) > 1 else (
                statistics.mean(ours) - statistics.mean(theirs), float("nan"))
            diffs.append(d)
            row += f" | {pm(d, '{:+.1%}')}"
        elif {"grpoflow", "trl"} <= set(labels):
            row += " | not run"
        lines.append(row + " |")

    def overall(pairs: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.mean(m for m, _ in pairs), sum(se ** 2 for _, se in pairs) ** 0.5 / len(pairs)

    counted = len(gains[labels[0]])
    if not counted:
        return "\n".join(lines)
    row = f"| overall ({counted} of {len(tasks)} tasks) | | | " + " | ".join(
        f" | {pm(overall(gains[label]), '{:+.1%}')}" for label in labels)
    if diffs:
        row += f" | {pm(overall(diffs), '{:+.1%}')}"
    return "\n".join(lines + [row + " |"])


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.merge:
        print(merge(args.merge))
        return
    started = time.perf_counter()
    logs = CACHE / "logs" / f"learning-{args.task}"
    logs.mkdir(parents=True, exist_ok=True)

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.0f}s] {msg}", file=sys.stderr, flush=True)

    model_path = start_model(args, logs)
    before = spawn("evaluate", {"model_path": model_path, "task": args.task, "threads": args.threads},
                   logs / "evaluate.log", args.threads)
    progress(f"before RL: held-out {before['accuracy']:.1%}, greedy length {before['greedy_length']:.1f}")
    spec = {"model_path": model_path, "task": args.task, "prompts": args.prompts, "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens, "lr": args.lr, "steps": args.steps, "kl": 0.0,
            "threads": args.threads, "compute_dtype": args.compute_dtype, "match_trl": False}
    results: dict[str, list[dict]] = {label: [] for label, _, _ in runs_of(args)}
    for seed in args.seeds:
        for label, kind, overrides in runs_of(args):
            wait_until_idle(args.wait_idle, progress)
            with tempfile.TemporaryDirectory(prefix=f"learning-{kind}-") as tmp:
                log = logs / f"{label}_seed{seed}.log"
                run = spawn(kind, {**spec, "seed": seed, "overrides": overrides, "tmp": tmp}, log, args.threads)
            results[label].append({**run, "seed": seed})
            progress(f"seed {seed} | {label:18s} | held-out {run['accuracy']:.1%} | greedy length "
                     f"{run['greedy_length']:.1f} | reward {run['steps'][0]['reward']:.2f} -> "
                     f"{run['steps'][-1]['reward']:.2f} | {run['run_wall_s']:.0f}s")
    figures = [summarize(label, rs, before) for label, rs in results.items()]
    print(report(args, before, figures))
    record = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                       if k != "merge"}, "before": before, "figures": figures, "runs": results,
              "wall_s": time.perf_counter() - started}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
