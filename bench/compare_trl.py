"""grpoflow vs TRL's GRPOTrainer, side by side, on one machine, with the same model, task and settings.

    .venv/bin/pip install -e '.[bench]'                  # trl (and datasets) next to the CPU torch
    .venv/bin/python bench/compare_trl.py               # the default row at KL 0 and 0.04: ≈4 min on 2 idle cores
    .venv/bin/python bench/compare_trl.py --scaling     # model size, group size, response budget: ≈8 min
    .venv/bin/python bench/compare_trl.py --real-model /tmp/grpoflow-smollm2/hf   # SmolLM2-135M-Instruct, chat task

What one row is: a tiny Llama (`--sizes`) warm-started once with grpoflow's SFT stage (cached in
bench/.cache), then `--steps` GRPO steps of `--prompts` prompts x `--group-sizes` samples, at most
`--max-new-tokens` new tokens, temperature 1, the same constant learning rate, token-mean loss
aggregation (TRL `loss_type="dapo"`), group-std advantage scaling, clip 0.2, grad-norm clip 1,
one optimizer step per generation, and a k3 KL term of weight `--kl` (TRL `beta`). The reward is
grpoflow's `exact_match` for both (TRL calls it through a batch wrapper). Both keep float32
weights and optimizer state; grpoflow computes in `--compute-dtype` (its `model.compute_dtype`),
TRL in float32 (on CPU it runs only with `bf16=False`).

Each run is its own subprocess (`--child`, see bench/children.py), so peak RSS is per framework
and imports do not leak; runs alternate grpoflow, trl, grpoflow, trl ... (`--repeats` pairs per
row) so slow drift of a shared machine hits both. Every child writes one record per step in the
same schema (seconds, generation seconds, prompt / completion tokens, mean reward) and
`summarize` turns both into the same figures:

- s/step: median step seconds, the first `WARMUP_STEPS` (figures.py) steps left out;
- tok/s: prompt + response tokens (no padding) per second of step time (verl's perf/throughput),
  per step, then the median;
- MFU: (6 P x trained tokens + 2 P x generated tokens [+ 2 P x trained tokens for the
  reference forward when KL > 0]) / step seconds / measured peak, P = parameters without the
  input embedding; the peak is `torch.mm` on 2048x2048 at `--threads` threads in the dtype the
  run computes in (fp32 for TRL, fp32 or bf16 for grpoflow). These are the FLOPs of the
  trajectories, not the ones executed: work that grpoflow skips (prompts it runs once per
  group) still counts, so MFU is proportional to tok/s for a given row and dtype;
- gen s: seconds of sampling (grpoflow: the rollout worker's `generate`; TRL: step start to the
  reward call, which for KL > 0 also holds its reference forward); rest s is the remainder;
- reward first/last: mean reward of the first / last 3 steps;
- held-out: greedy exact match on 200 held-out prompts, evaluated by `heldout_accuracy` on the
  final weights in the child (grpoflow: its last checkpoint; TRL: `trainer.model`).

A second table splits grpoflow's step into its stages (`timing_s/*` of metrics.jsonl) and into model math (generate,
forward, backward, optimizer: the engines' and the actor's own `timing_s/*` metrics) and dataflow, the rest of the
step. The arithmetic of every figure is bench/figures.py. `--scaling` adds how each framework's step time grows with
each factor.

Two more columns of the first table, and its ratio rows:

- limit s / x limit: the step's physical limit at the rates measured at start (`limits.py`: the `torch.mm`
  peak of the run's dtype for the update's and generation's FLOPs, the copy bandwidth for reading every
  weight once per decode step), and the step's seconds over it; min limit s / x min: the same with each
  prompt counted once per group (the least work a GRPO step needs: its samples share their prompt);
- ratios (`.../trl...` rows) are against the fastest TRL run of the row (`--trl-dtype float32,bfloat16`
  runs TRL with `bf16=False` and `bf16=True`).

`--microbatch step,default` runs grpoflow twice per dtype: with one micro-batch holding the step (as
TRL's batch; the default) and with its configured budget (`actor.max_tokens_per_microbatch`, by default chosen
from memory, `grpoflow/training/budget.py`: what a user gets), labelled `-mbdefault` (`-mb4096` in figures from
before the budget came from memory).

`--real-model FOLDER` replaces the tiny rows by one real-model row: SmolLM2-135M-Instruct (the HF folder
that .ci/real_model_stage converts from the PyPI wheel's GGUF file) on the chat version of the task
(`builtin:chat_addition`: chat messages through the model's template, ~45-token prompts), reward
`gsm8k_flexible` for both, 10 steps, at most 24 new tokens, lr 1e-5, KL 0, one repeat; held-out is the
mean greedy reward on the task's 100 held-out questions; TRL runs in float32 and bf16, grpoflow with both
micro-batch budgets.

Figures per framework are medians over the repeats; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import WARMUP_STEPS, median_figures, over_best_trl, summarize
from limits import PEAK_KEY, measure_bandwidth, measure_peak

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CACHE = BENCH_DIR / ".cache"
REAL_MODEL_LABEL = "smollm2"  # the row label of --real-model
# Defaults that differ between the tiny rows and the real-model row: (tiny, --real-model).
MODE_DEFAULTS = {"steps": (30, 10), "repeats": (3, 1), "max_new_tokens": ([16], [24]), "kl": ([0.0, 0.04], [0.0]),
                 "lr": (5e-5, 1e-5), "trl_dtype": (["float32"], ["float32", "bfloat16"]),
                 "microbatch": (["step"], ["step", "default"])}


# ---------------------------------------------------------------- children (bench/children.py)

def run_child_main(kind: str, spec_json: str) -> None:
    from children import CHILDREN, emit, peak_rss_mb  # this script's folder is on sys.path in a child
    spec = json.loads(spec_json)
    start = time.perf_counter()
    result = CHILDREN[kind](spec)
    emit({**result, "peak_rss_mb": peak_rss_mb(), "child_s": time.perf_counter() - start})


# ---------------------------------------------------------------- parent

def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all cores that were busy over `seconds` (Linux /proc/stat; 0 where it is missing).

    Measured between runs, when no child of ours runs, it is other processes' load: a run that
    starts on a busy machine is slower for reasons that are neither framework's."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)  # idle + iowait, all

    if not Path("/proc/stat").exists():
        return 0.0
    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return 1 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_until_idle(limit_s: float, progress) -> float:
    """Wait (at most `limit_s`) for other processes to leave the cores below 10 % busy; returns the last reading."""
    deadline, busy = time.perf_counter() + limit_s, cpu_busy()
    while busy > 0.10 and time.perf_counter() < deadline:
        progress(f"  machine {busy:.0%} busy with other processes; waiting (--wait-idle {limit_s:g})")
        time.sleep(10)
        busy = cpu_busy()
    return busy


def spawn(kind: str, spec: dict, log: Path, threads: int, script: Path = Path(__file__).resolve()) -> dict:
    """Run one child (`script --child kind spec`); its console output goes to `log`, its result comes back."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, str(script), "--child", kind, json.dumps(spec)],
                              stdout=subprocess.PIPE, stderr=f, text=True, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    if proc.returncode or not lines:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{kind} child failed (exit {proc.returncode}); last output from {log}:\n{tail}")
    return {**json.loads(lines[-1].removeprefix("BENCH_RESULT ")), "run_wall_s": time.perf_counter() - start}


def grid(args) -> list[dict]:
    """The rows to run: the cross product of the list options, with `--scaling` the scaling rows, with
    `--real-model` the real model on the chat task."""
    if args.scaling:
        return scaling_rows()
    if args.real_model:
        rows = itertools.product(args.group_sizes, args.max_new_tokens, args.kl)
        return [{"size": REAL_MODEL_LABEL, "group_size": g, "max_new_tokens": t, "kl": k, "init": "real",
                 "task": "chat_addition"} for g, t, k in rows]
    rows = itertools.product(args.sizes, args.group_sizes, args.max_new_tokens, args.kl)
    return [{"size": s, "group_size": g, "max_new_tokens": t, "kl": k, "init": "sft"} for s, g, t, k in rows]


def scaling_rows() -> list[dict]:
    """One factor at a time around the default row (4m, 8 samples, 16 new tokens, KL 0).

    Model size 0.5m / 4m / 30m and group size 4 / 8 / 16 use the warm-started model. The
    response-budget rows (16 / 64 / 256 new tokens) use the untrained base model: the warm-started
    one answers in 3-4 tokens whatever the budget, while the base model rarely emits EOS (1 token
    in 102), so its responses fill the budget and the rows measure long generation.
    """
    axes = {"size": [("0.5m", 8, 16, "sft"), ("4m", 8, 16, "sft"), ("30m", 8, 16, "sft")],
            "group": [("4m", 4, 16, "sft"), ("4m", 8, 16, "sft"), ("4m", 16, 16, "sft")],
            "budget": [("4m", 8, 16, "base"), ("4m", 8, 64, "base"), ("4m", 8, 256, "base")]}
    rows: list[dict] = []
    for points in axes.values():
        for size, group, budget, init in points:
            row = {"size": size, "group_size": group, "max_new_tokens": budget, "kl": 0.0, "init": init}
            if row not in rows:
                rows.append(row)
    return rows


def row_label(row: dict) -> str:
    base = "-base" if row.get("init", "sft") == "base" else ""
    return f"{row['size']}{base} g{row['group_size']} t{row['max_new_tokens']} kl{row['kl']:g}"


def frameworks(args) -> list[tuple[str, str, str, dict]]:
    """(label, child kind, compute dtype, extra spec) of every run of a repeat: grpoflow in each dtype (with the
    step-sized micro-batch, then with its default budget when `--microbatch` has `default`), then TRL in each
    `--trl-dtype` (bf16: TRL's `bf16=True`, fp32 weights under autocast); only the `--frameworks` named."""
    runs = []
    for dtype in args.compute_dtype if "grpoflow" in args.frameworks else []:
        name = "grpoflow" if dtype == "float32" else f"grpoflow-{PEAK_KEY[dtype]}"
        for budget in args.microbatch:
            label = name if budget == "step" else f"{name}-mbdefault"
            runs.append((label, "grpoflow", dtype, {"microbatch": budget}))
    return runs + [("trl" if dtype == "float32" else f"trl-{PEAK_KEY[dtype]}", "trl", dtype, {})
                   for dtype in (args.trl_dtype if "trl" in args.frameworks else [])]


def run_row(row: dict, args, prepared: dict, peak: dict, bandwidth: float, logs: Path, progress) -> dict:
    """`repeats` alternating runs of each framework on one row; median figures and ratios to the fastest TRL run."""
    sft = row.get("init", "sft") != "base"  # the warm-started (or real) model, with a before-RL accuracy
    spec = {**row, "model_path": prepared["model_path" if sft else "base_model_path"], "prompts": args.prompts,
            "lr": args.lr, "steps": args.steps, "seed": args.seed, "threads": args.threads}
    runs = frameworks(args)
    figures: dict[str, list[dict]] = {label: [] for label, _, _, _ in runs}
    for rep in range(args.repeats):
        for label, kind, dtype, extra in runs:
            with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as tmp:
                log = logs / f"{row_label(row).replace(' ', '_')}_{label}_{rep}.log"
                busy = wait_until_idle(args.wait_idle, progress)
                start = time.perf_counter()
                run = spawn(kind, {**spec, **extra, "compute_dtype": dtype, "tmp": tmp}, log, args.threads)
                f = {**summarize(run, kl=row["kl"], peak_gflops=peak, bandwidth_gbs=bandwidth,
                                 group_size=row["group_size"]), "busy_before": busy}
            figures[label].append(f)
            progress(f"  {row_label(row)} | repeat {rep + 1}/{args.repeats} | {label:18s} | {f['s_per_step']:.3f} "
                     f"s/step ({f['x_limit']:.1f}x its limit) | {f['tokens_per_s']:.0f} tok/s | MFU {f['mfu']:.1%} | "
                     f"reward {f['reward_first']:.2f}->{f['reward_last']:.2f} | held-out {f['accuracy']:.1%} | "
                     f"{f['peak_rss_mb']:.0f} MB | {time.perf_counter() - start:.0f}s | others {busy:.0%} busy before")
    return with_medians({**row, "accuracy_before": prepared["accuracy"] if sft else None, "runs": figures})


def with_medians(result: dict) -> dict:
    """A row's result with the median figures of each framework and the ratios to the fastest TRL run (none
    without a TRL run) added to its `runs`."""
    med = {label: median_figures(runs) for label, runs in result["runs"].items()}
    best, ratios = over_best_trl(med) if any(label.startswith("trl") for label in med) else (None, {})
    return {**result, "median": med, "trl_best": best, "over_trl": ratios}


def merge(paths: list[Path]) -> dict:
    """One summary from the `--json-out` files of several invocations (e.g. TRL and grpoflow run in separate
    commands): the runs of equal rows side by side, medians and ratios recomputed. Each run's limit and MFU keep
    the peak and bandwidth measured at the start of its own invocation (all are listed in `peak_gflops`)."""
    summaries = [json.loads(p.read_text()) for p in paths]
    rows: dict[str, dict] = {}
    for summary in summaries:
        for r in summary["rows"]:
            key = row_label(r)
            if key not in rows:
                rows[key] = {k: v for k, v in r.items() if k not in ("median", "trl_best", "over_trl")}
                rows[key]["runs"] = {}
            for label, runs in r["runs"].items():
                rows[key]["runs"].setdefault(label, []).extend(runs)
    return {"merged": [str(p) for p in paths], "peak_gflops": [s["peak_gflops"] for s in summaries],
            "bandwidth_gbs": [s["bandwidth_gbs"] for s in summaries], "args": summaries[0]["args"],
            "rows": [with_medians(r) for r in rows.values()], "wall_s": sum(s["wall_s"] for s in summaries)}


COLUMNS = [("s/step", "s_per_step", "{:.3f}"), ("gen s", "gen_s", "{:.3f}"), ("rest s", "rest_s", "{:.3f}"),
           ("tok/s", "tokens_per_s", "{:.0f}"), ("MFU", "mfu", "{:.1%}"), ("limit s", "limit_s", "{:.3f}"),
           ("x limit", "x_limit", "{:.1f}x"), ("min limit s", "limit_min_s", "{:.3f}"),
           ("x min", "x_limit_min", "{:.1f}x"), ("peak MB", "peak_rss_mb", "{:.0f}"),
           ("reward first", "reward_first", "{:.3f}"), ("reward last", "reward_last", "{:.3f}"),
           ("held-out", "accuracy", "{:.1%}"), ("run s", "run_wall_s", "{:.0f}")]


def table(results: list[dict]) -> str:
    head = "| row | framework | " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for r in results:
        for label, figures in r["median"].items():
            cells = [fmt.format(figures[k]) if k in figures else "-" for _, k, fmt in COLUMNS]  # older files: fewer
            lines.append(f"| {row_label(r)} | {label} | " + " | ".join(cells) + " |")
        before = "untrained" if r["accuracy_before"] is None else f"before RL {r['accuracy_before']:.1%}"
        for label, x in r["over_trl"].items():
            lines.append(f"| {row_label(r)} | {label}/{r['trl_best']} | {x['s_per_step']:.2f}x | | | "
                         f"{x['tokens_per_s']:.2f}x | {x['mfu']:.2f}x | | | | | {x['peak_rss_mb']:.2f}x | | | "
                         f"{before} | |")
    return "\n".join(lines)


# grpoflow's stages (metrics.jsonl timing_s/*) and the model-math split of `model_math`, in step order
PROFILE = ("generate", "reward", "old_log_prob", "ref", "adv", "update_actor", "sync", "forward", "backward",
           "optimizer", "dataflow")


def profile_table(results: list[dict]) -> str:
    """grpoflow's median seconds per stage, and the share of the step outside model math (dataflow)."""
    lines = ["| row | framework | step s | " + " | ".join(PROFILE) + " | dataflow share |",
             "|" + "---|" * (len(PROFILE) + 4)]
    for r in results:
        for label in (k for k in r["median"] if k.startswith("grpoflow")):
            stages = r["median"][label]["stages"]
            cells = [f"{stages[k]:.4f}" if k in stages else "-" for k in PROFILE]
            lines.append(f"| {row_label(r)} | {label} | {stages['step']:.3f} | " + " | ".join(cells) +
                         f" | {stages['dataflow'] / stages['step']:.1%} |")
    return "\n".join(lines)


def scaling_table(results: list[dict]) -> str:
    """Per scaling axis and framework: s/step, how it grows from the axis's first point, MFU, tok/s vs TRL."""
    axes = {"model size": ("size", {"group_size": 8, "max_new_tokens": 16, "init": "sft"}),
            "group size": ("group_size", {"size": "4m", "max_new_tokens": 16, "init": "sft"}),
            "new tokens (untrained model)": ("max_new_tokens", {"size": "4m", "group_size": 8, "init": "base"})}
    lines = ["| axis | point | framework | s/step | growth | MFU | tok/s | tok/s vs TRL |", "|" + "---|" * 8]
    for name, (key, fixed) in axes.items():
        points = [r for r in results if all(r.get(k, "sft") == v for k, v in fixed.items())]
        if len(points) < 2:
            continue
        first = points[0]["median"]
        for r in points:
            for label, f in r["median"].items():
                vs_trl = f"{r['over_trl'][label]['tokens_per_s']:.2f}x" if label in r["over_trl"] else ""
                lines.append(f"| {name} | {r[key]} | {label} | {f['s_per_step']:.3f} | "
                             f"{f['s_per_step'] / first[label]['s_per_step']:.1f}x | {f['mfu']:.1%} | "
                             f"{f['tokens_per_s']:.0f} | {vs_trl} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def floats(s: str) -> list[float]:
        return [float(x) for x in s.split(",")]

    def ints(s: str) -> list[int]:
        return [int(x) for x in s.split(",")]

    def dtypes(s: str) -> list[str]:
        values = s.split(",")
        if not set(values) <= set(PEAK_KEY):
            raise argparse.ArgumentTypeError(f"{s!r}: use float32 and/or bfloat16")
        return values

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=None,
                   help="GRPO steps per run (default 30; 10 with --scaling or --real-model)")
    p.add_argument("--repeats", type=int, default=None,
                   help="alternating grpoflow/trl pairs per row (default 3; 1 with --scaling or --real-model)")
    p.add_argument("--sizes", type=lambda s: s.split(","), default=["4m"],
                   help="model sizes, from 0.5m,4m,30m (default 4m)")
    p.add_argument("--group-sizes", type=ints, default=[8], help="samples per prompt, e.g. 4,8,16 (default 8)")
    p.add_argument("--max-new-tokens", type=ints, default=None,
                   help="response budgets, e.g. 16,64,256 (default 16; 24 with --real-model)")
    p.add_argument("--kl", type=floats, default=None,
                   help="KL weights (TRL beta; grpoflow actor.kl_coef, k3) (default 0,0.04; 0 with --real-model)")
    p.add_argument("--scaling", action="store_true", help="instead of the grid: model size 0.5m/4m/30m, group size "
                   "4/8/16 and response budget 16/64/256, one at a time around the default row, KL 0")
    p.add_argument("--compute-dtype", type=dtypes, default=["float32", "bfloat16"],
                   help="grpoflow's model.compute_dtype, one grpoflow run per value (default float32,bfloat16)")
    p.add_argument("--trl-dtype", type=dtypes, default=None,
                   help="TRL runs: float32 and/or bfloat16 (bf16=True) (default float32; both with --real-model)")
    p.add_argument("--microbatch", type=lambda v: v.split(","), default=None,
                   help="grpoflow's micro-batch budget: step (one micro-batch holds the step, as TRL's batch) and/or "
                        "default (actor.max_tokens_per_microbatch as configured) (default step; both with "
                        "--real-model)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--lr", type=float, default=None,
                   help="constant learning rate of both (default 5e-5; 1e-5 with --real-model)")
    p.add_argument("--real-model", type=str, default=None, metavar="FOLDER",
                   help="instead of the tiny rows: this HF folder (SmolLM2-135M-Instruct, see .ci/real_model_stage) "
                        "on the chat addition task")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="torch/OMP threads of every run (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of both frameworks (default 0)")
    p.add_argument("--wait-idle", type=float, default=0, metavar="S", help="before each run, wait up to S seconds "
                   "for other processes to leave the CPU (default 0: only measure and report their load)")
    p.add_argument("--frameworks", type=lambda v: v.split(","), default=["grpoflow", "trl"],
                   help="which frameworks' runs to make: grpoflow and/or trl (default both; run them in separate "
                        "commands with --json-out, then --merge)")
    p.add_argument("--json-out", type=Path, default=None, help="also write the JSON result here")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: print the tables of these --json-out files as one (rows matched by label)")
    p.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not set(args.frameworks) <= {"grpoflow", "trl"}:
        p.error(f"--frameworks {','.join(args.frameworks)}: use grpoflow and/or trl")
    if args.real_model:
        args.real_model = str(Path(args.real_model).resolve())  # the children run in the repository root
    for key, (tiny, real) in MODE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, real if args.real_model or (args.scaling and key in ("steps", "repeats")) else tiny)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        return run_child_main(*args.child)
    if args.merge:
        return report(merge(args.merge), args)
    began = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f}s] {msg}", flush=True)

    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    busy = wait_until_idle(args.wait_idle, progress)
    peak, bandwidth = measure_peak(args.threads), measure_bandwidth(args.threads)
    progress(f"peak torch.mm (bench/limits.py) on {args.threads} threads: fp32 {peak['fp32']:.0f} GFLOP/s, "
             f"bf16 {peak['bf16']:.0f} GFLOP/s; copy bandwidth {bandwidth:.1f} GB/s (others {busy:.0%} busy); "
             f"grpoflow computes in {'/'.join(args.compute_dtype)}, TRL in {'/'.join(args.trl_dtype)}; MFU and the "
             f"limit use the peak of each")
    rows = grid(args)
    progress(f"{len(rows)} row(s) x {args.repeats} repeat(s) x {len(frameworks(args))} runs; "
             f"child logs in {logs}")
    prepared = {}
    for size in dict.fromkeys(r["size"] for r in rows):
        prepared[size] = spawn("prepare", {"size": size, "threads": args.threads, "real_model": args.real_model},
                               logs / f"prepare_{size}.log", args.threads)
        progress(f"{'model' if args.real_model else 'warm start'} {size}: {prepared[size]['model_path']} "
                 f"(held-out {prepared[size]['accuracy']:.1%})")
    results = [run_row(row, args, prepared[row["size"]], peak, bandwidth, logs, progress) for row in rows]
    summary = {"peak_gflops": peak, "bandwidth_gbs": bandwidth,
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "child"},
               "rows": results, "wall_s": time.perf_counter() - began}
    report(summary, args)


def report(summary: dict, args) -> None:
    """Print the tables of a summary (and its JSON, last); write it to `--json-out`."""
    results, a = summary["rows"], summary["args"]
    print()
    print(f"{a['prompts']} prompts/step, {a['steps']} steps (first {WARMUP_STEPS} left out of speed figures), "
          f"lr {a['lr']:g} constant, {a['threads']} threads, medians of {a['repeats']} run(s) each; "
          f"grpoflow-bf16: model.compute_dtype=bfloat16")
    print(table(results))
    print()
    print("grpoflow per-stage median seconds (dataflow: step time outside generation, forward, backward and optimizer)")
    print(profile_table(results))
    if a.get("scaling"):
        print()
        print(scaling_table(results))
    busiest = max(f["busy_before"] for r in results for runs in r["runs"].values() for f in runs)
    if busiest > 0.2:
        print(f"WARNING: other processes kept the machine up to {busiest:.0%} busy before a run; speed figures are "
              f"unreliable (rerun on a quiet machine, or with --wait-idle 300)")
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
