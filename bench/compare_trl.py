"""grpoflow vs TRL's GRPOTrainer, side by side, on one machine, with the same model, task and settings.

    .venv/bin/pip install -e '.[bench]'          # trl (and datasets) next to the CPU torch
    .venv/bin/python bench/compare_trl.py       # the default row at KL 0 and 0.04: ≈3 min on 2 idle cores

What one row is: a tiny Llama (`--sizes`) warm-started once with grpoflow's SFT stage (cached in
bench/.cache), then `--steps` GRPO steps of `--prompts` prompts x `--group-sizes` samples, at most
`--max-new-tokens` new tokens, temperature 1, the same constant learning rate, token-mean loss
aggregation (TRL `loss_type="dapo"`), group-std advantage scaling, clip 0.2, grad-norm clip 1,
one optimizer step per generation, and a k3 KL term of weight `--kl` (TRL `beta`). The reward is
grpoflow's `exact_match` for both (TRL calls it through a batch wrapper).

Each run is its own subprocess (`--child`), so peak RSS is per framework and imports do not
leak; runs alternate grpoflow, trl, grpoflow, trl ... (`--repeats` pairs per row) so slow drift
of a shared machine hits both. Every child writes one record per step in the same schema
(seconds, generation seconds, prompt / completion tokens, mean reward) and `summarize` turns
both into the same figures:

- s/step: median step seconds, the first `WARMUP_STEPS` steps left out;
- tok/s: prompt + response tokens (no padding) per second of step time (verl's perf/throughput),
  per step, then the median;
- MFU: (6 P x trained tokens + 2 P x generated tokens [+ 2 P x trained tokens for the
  reference forward when KL > 0]) / step seconds / measured fp32 peak, P = parameters without
  the input embedding; the peak is `torch.mm` on 2048x2048 fp32 at `--threads` threads;
- gen s: seconds from the step's start to the reward call (tokenize + sample; for TRL with
  KL > 0 also its reference forward, which it runs before scoring); the rest of the step is
  scoring, log-probs, backward, optimizer and weight sync;
- reward first/last: mean reward of the first / last 3 steps;
- held-out: greedy exact match on 200 held-out prompts, evaluated by `heldout_accuracy` on the
  final weights in the child (grpoflow: its last checkpoint; TRL: `trainer.model`).

Figures per framework are medians over the repeats; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CACHE = BENCH_DIR / ".cache"
WARMUP_STEPS = 2      # left out of s/step, tok/s and MFU (first-call allocations, lazy inits)
EDGE_STEPS = 3        # reward "first" / "last" = mean over this many steps
HELDOUT = 200         # held-out prompts for the greedy accuracy
EVAL_NEW_TOKENS = 16  # greedy budget for held-out answers (at most 3 digits + EOS)
FRAMEWORKS = ("grpoflow", "trl")


# ---------------------------------------------------------------- shared by both children

def set_threads(threads: int) -> None:
    import torch
    torch.set_num_threads(threads)


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def count_params(model) -> int:
    """Parameters that take part in matmuls: all but the input embedding (a lookup)."""
    embed = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not embed)


def heldout_rows() -> list[dict]:
    from grpoflow.tasks.addition import addition_splits
    return addition_splits()[1][:HELDOUT]


def heldout_accuracy(model, tokenizer) -> float:
    """Greedy exact match on the held-out prompts, one left-padded `generate` call."""
    import torch
    from grpoflow.rewards.functions import exact_match
    rows = heldout_rows()
    tokenizer.padding_side = "left"
    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=EVAL_NEW_TOKENS,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return statistics.mean(exact_match(r["prompt"], t, answer=r["answer"]) for r, t in zip(rows, texts))


def emit(record: dict) -> None:
    """The child's result: one JSON line on stdout, marked so the parent finds it among other output."""
    print("BENCH_RESULT " + json.dumps(record), flush=True)


# ---------------------------------------------------------------- children

def child_prepare(spec: dict) -> dict:
    """Warm-start the built-in model of `spec["size"]` (cached) and measure its held-out accuracy."""
    from grpoflow.config import load_config
    from grpoflow.controller.run import sft_stage
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    set_threads(spec["threads"])
    run_dir = CACHE / f"tiny-{spec['size']}"
    cfg = load_config(None, [f"model.path=builtin:tiny-{spec['size']}", f"trainer.output_dir={run_dir}",
                             f"trainer.threads={spec['threads']}"])
    path = sft_stage(cfg)
    done = run_dir / "heldout_accuracy.json"  # the warm start is reused, so is its accuracy
    if not done.exists():
        acc = heldout_accuracy(load_causal_lm(path), load_tokenizer(path))
        done.write_text(json.dumps({"accuracy": acc}))
    return {"model_path": str(path), "accuracy": json.loads(done.read_text())["accuracy"]}


def child_grpoflow(spec: dict) -> dict:
    """`grpoflow.controller.run.train` with the row's settings; per-step records from metrics.jsonl."""
    from grpoflow.config import load_config
    from grpoflow.controller.metrics import read_metrics
    from grpoflow.controller.run import train
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    set_threads(spec["threads"])
    out = Path(tempfile.mkdtemp(prefix="grpoflow-", dir=spec["tmp"]))
    n, steps = spec["group_size"], spec["steps"]
    train(load_config(None, [
        f"model.path={spec['model_path']}", "sft.steps=0", f"data.prompts_per_step={spec['prompts']}",
        f"rollout.n={n}", f"rollout.max_new_tokens={spec['max_new_tokens']}", "rollout.temperature=1.0",
        f"actor.lr={spec['lr']}", "actor.lr_schedule=constant", "actor.loss_agg_mode=token-mean",
        f"actor.kl_coef={spec['kl']}", "actor.kl_estimator=k3", "reward.function=exact_match",
        "algorithm.norm_adv_by_std=true", "algorithm.epsilon=1e-4",  # TRL: (r - mean) / (std + 1e-4)
        f"trainer.total_steps={steps}", "trainer.val_every=0", f"trainer.save_every={steps}",
        f"trainer.output_dir={out}", f"trainer.threads={spec['threads']}", f"trainer.seed={spec['seed']}",
        "trainer.resume=never"]))
    records = []
    for m in read_metrics(out):
        trajectories = spec["prompts"] * n
        tokens = m["perf/throughput"] * m["timing_s/step"]  # attention_mask.sum(): prompt + response
        completion = m["response_length/mean"] * trajectories
        records.append({"seconds": m["timing_s/step"], "gen_seconds": m["timing_s/gen"],
                        "prompt_tokens": round(tokens - completion), "completion_tokens": round(completion),
                        "reward": m["critic/score/mean"],
                        "stages": {k.removeprefix("timing_s/"): v for k, v in m.items() if k.startswith("timing_s/")}})
    actor = sorted((out / "checkpoints").glob("step_*/actor"))[-1]
    model = load_causal_lm(actor)
    return {"steps": records, "params": count_params(model),
            "accuracy": heldout_accuracy(model, load_tokenizer(actor)), "threads": _torch_threads()}


def _torch_threads() -> int:
    import torch
    return torch.get_num_threads()


def child_trl(spec: dict) -> dict:
    """TRL's GRPOTrainer with the row's settings; a callback times each step, the reward records tokens."""
    import torch
    from datasets import Dataset
    from grpoflow.rewards.functions import exact_match
    from grpoflow.tasks.addition import addition_splits
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    set_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)
    train_rows = addition_splits()[0]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train_rows])
    prompts = [r["prompt"] for r in train_rows]  # tokens counted here, not inside the timed step
    lengths = dict(zip(prompts, map(len, tokenizer(prompts, add_special_tokens=False)["input_ids"])))
    records: list[dict] = []
    clock = {"begin": 0.0}

    def exact_match_reward(prompts, completions, completion_ids, answer, **_):
        """grpoflow's exact_match per completion; also records this step's tokens (the step's only call)."""
        scores = [exact_match(p, c, answer=a) for p, c, a in zip(prompts, completions, answer)]
        records.append({"gen_seconds": time.perf_counter() - clock["begin"],
                        "prompt_tokens": sum(lengths[p] for p in prompts),
                        "completion_tokens": sum(len(ids) for ids in completion_ids),
                        "reward": statistics.mean(scores)})
        return scores

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock["begin"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            record = records[-1]
            record["seconds"] = time.perf_counter() - clock["begin"]
            record["stages"] = {"gen": record["gen_seconds"], "step": record["seconds"]}

    n = spec["group_size"]
    config = GRPOConfig(
        output_dir=spec["tmp"], use_cpu=True, bf16=False, fp16=False,
        activation_checkpointing=False, gradient_checkpointing=False,
        per_device_train_batch_size=spec["prompts"] * n, gradient_accumulation_steps=1, num_generations=n,
        max_completion_length=spec["max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=spec["kl"], loss_type="dapo", scale_rewards="group", epsilon=0.2, num_iterations=1,
        max_steps=spec["steps"], seed=spec["seed"], logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_match_reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.train()
    return {"steps": records, "params": count_params(trainer.model),
            "accuracy": heldout_accuracy(trainer.model, tokenizer), "threads": _torch_threads()}


CHILDREN = {"prepare": child_prepare, "grpoflow": child_grpoflow, "trl": child_trl}


def run_child_main(kind: str, spec_json: str) -> None:
    spec = json.loads(spec_json)
    start = time.perf_counter()
    result = CHILDREN[kind](spec)
    emit({**result, "peak_rss_mb": peak_rss_mb(), "child_s": time.perf_counter() - start})


# ---------------------------------------------------------------- figures

def summarize(run: dict, *, kl: float, peak_gflops: float) -> dict:
    """One run's figures from its per-step records (the same arithmetic for both frameworks).

    Speed figures are medians over the steps after the warm-up: on a shared machine a median
    shrugs off the odd step that another process slowed down, a mean over steps does not."""
    steps = run["steps"]
    timed = steps[WARMUP_STEPS:] or steps
    p = run["params"]

    def flops(s: dict) -> float:
        tokens = s["prompt_tokens"] + s["completion_tokens"]
        return 6 * p * tokens + 2 * p * s["completion_tokens"] + (2 * p * tokens if kl > 0 else 0)

    def median(fn) -> float:
        return statistics.median(fn(s) for s in timed)

    step, gen = median(lambda s: s["seconds"]), median(lambda s: s["gen_seconds"])
    return {"s_per_step": step, "gen_s": gen, "rest_s": median(lambda s: s["seconds"] - s["gen_seconds"]),
            "tokens_per_s": median(lambda s: (s["prompt_tokens"] + s["completion_tokens"]) / s["seconds"]),
            "mfu": median(lambda s: flops(s) / s["seconds"]) / (peak_gflops * 1e9),
            "peak_rss_mb": run["peak_rss_mb"],
            "reward_first": statistics.mean(s["reward"] for s in steps[:EDGE_STEPS]),
            "reward_last": statistics.mean(s["reward"] for s in steps[-EDGE_STEPS:]),
            "accuracy": run["accuracy"],
            "tokens_per_step": median(lambda s: s["prompt_tokens"] + s["completion_tokens"]),
            "completion_tokens_per_step": median(lambda s: s["completion_tokens"]), "params": p,
            "threads": run["threads"], "run_wall_s": run["run_wall_s"],
            "stages": {k: median(lambda s: s["stages"][k]) for k in timed[0]["stages"]}}


def median_figures(runs: list[dict]) -> dict:
    """Median over repeats of every figure (and of every stage's seconds)."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "stages"}
    out["stages"] = {k: statistics.median(r["stages"][k] for r in runs) for k in runs[0]["stages"]}
    return out


def measure_peak(threads: int) -> dict[str, float]:
    """GFLOP/s of torch.mm on 2048x2048 in fp32 and bf16: the best of 10 calls after one warm-up.

    The best, not the mean: a peak is what the cores can do when nothing else runs."""
    import torch
    torch.set_num_threads(threads)
    n, out = 2048, {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        best = min(_timed(torch.mm, a, b) for _ in range(10))
        out[name] = 2 * n ** 3 / best / 1e9
    return out


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


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


def spawn(kind: str, spec: dict, log: Path, threads: int) -> dict:
    """Run one child; its console output goes to `log`, its result comes back."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(spec)],
                              stdout=subprocess.PIPE, stderr=f, text=True, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    if proc.returncode or not lines:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{kind} child failed (exit {proc.returncode}); last output from {log}:\n{tail}")
    return {**json.loads(lines[-1].removeprefix("BENCH_RESULT ")), "run_wall_s": time.perf_counter() - start}


def grid(args) -> list[dict]:
    rows = itertools.product(args.sizes, args.group_sizes, args.max_new_tokens, args.kl)
    return [{"size": s, "group_size": g, "max_new_tokens": t, "kl": k} for s, g, t, k in rows]


def row_label(row: dict) -> str:
    return f"{row['size']} g{row['group_size']} t{row['max_new_tokens']} kl{row['kl']:g}"


def run_row(row: dict, args, prepared: dict, peak: dict, logs: Path, progress) -> dict:
    """`repeats` alternating runs of each framework on one row; median figures and ratios."""
    spec = {**row, "model_path": prepared["model_path"], "prompts": args.prompts, "lr": args.lr,
            "steps": args.steps, "seed": args.seed, "threads": args.threads}
    figures: dict[str, list[dict]] = {fw: [] for fw in FRAMEWORKS}
    for rep in range(args.repeats):
        for fw in FRAMEWORKS:
            with tempfile.TemporaryDirectory(prefix=f"bench-{fw}-") as tmp:
                log = logs / f"{row_label(row).replace(' ', '_')}_{fw}_{rep}.log"
                busy = wait_until_idle(args.wait_idle, progress)
                start = time.perf_counter()
                run = spawn(fw, {**spec, "tmp": tmp}, log, args.threads)
                f = {**summarize(run, kl=row["kl"], peak_gflops=peak["fp32"]), "busy_before": busy}
            figures[fw].append(f)
            progress(f"  {row_label(row)} | repeat {rep + 1}/{args.repeats} | {fw:8s} | {f['s_per_step']:.3f} s/step"
                     f" | {f['tokens_per_s']:.0f} tok/s | reward {f['reward_first']:.2f}->{f['reward_last']:.2f} | "
                     f"held-out {f['accuracy']:.1%} | {f['peak_rss_mb']:.0f} MB | {time.perf_counter() - start:.0f}s | "
                     f"others {busy:.0%} busy before")
    med = {fw: median_figures(figures[fw]) for fw in FRAMEWORKS}
    g, t = med["grpoflow"], med["trl"]
    ratios = {"s_per_step": g["s_per_step"] / t["s_per_step"], "tokens_per_s": g["tokens_per_s"] / t["tokens_per_s"],
              "peak_rss_mb": g["peak_rss_mb"] / t["peak_rss_mb"], "mfu": g["mfu"] / t["mfu"]}
    return {**row, "accuracy_before": prepared["accuracy"], "median": med, "runs": figures,
            "grpoflow_over_trl": ratios}


COLUMNS = [("s/step", "s_per_step", "{:.3f}"), ("gen s", "gen_s", "{:.3f}"), ("rest s", "rest_s", "{:.3f}"),
           ("tok/s", "tokens_per_s", "{:.0f}"), ("MFU", "mfu", "{:.1%}"), ("peak MB", "peak_rss_mb", "{:.0f}"),
           ("reward first", "reward_first", "{:.3f}"), ("reward last", "reward_last", "{:.3f}"),
           ("held-out", "accuracy", "{:.1%}"), ("run s", "run_wall_s", "{:.0f}")]


def table(results: list[dict]) -> str:
    head = "| row | framework | " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for r in results:
        for fw in FRAMEWORKS:
            cells = [fmt.format(r["median"][fw][k]) for _, k, fmt in COLUMNS]
            lines.append(f"| {row_label(r)} | {fw} | " + " | ".join(cells) + " |")
        x = r["grpoflow_over_trl"]
        lines.append(f"| {row_label(r)} | grpoflow/TRL | {x['s_per_step']:.2f}x | | | {x['tokens_per_s']:.2f}x | "
                     f"{x['mfu']:.2f}x | {x['peak_rss_mb']:.2f}x | | | before RL {r['accuracy_before']:.1%} | |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def floats(s: str) -> list[float]:
        return [float(x) for x in s.split(",")]

    def ints(s: str) -> list[int]:
        return [int(x) for x in s.split(",")]

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="GRPO steps per run (default 30)")
    p.add_argument("--repeats", type=int, default=3, help="alternating grpoflow/trl pairs per row (default 3)")
    p.add_argument("--sizes", type=lambda s: s.split(","), default=["4m"], help="model sizes, from 0.5m,4m,30m (default 4m)")
    p.add_argument("--group-sizes", type=ints, default=[8], help="samples per prompt, e.g. 4,8,16 (default 8)")
    p.add_argument("--max-new-tokens", type=ints, default=[16], help="response budgets, e.g. 16,64,256 (default 16)")
    p.add_argument("--kl", type=floats, default=[0.0, 0.04], help="KL weights (TRL beta; grpoflow actor.kl_coef, k3) (default 0,0.04)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--lr", type=float, default=5e-5, help="constant learning rate of both (default 5e-5)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch/OMP threads of every run (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of both frameworks (default 0)")
    p.add_argument("--wait-idle", type=float, default=0, metavar="S", help="before each run, wait up to S seconds "
                   "for other processes to leave the CPU (default 0: only measure and report their load)")
    p.add_argument("--json-out", type=Path, default=None, help="also write the JSON result here")
    p.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        return run_child_main(*args.child)
    began = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f}s] {msg}", flush=True)

    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    busy = wait_until_idle(args.wait_idle, progress)
    peak = measure_peak(args.threads)
    progress(f"peak torch.mm 2048x2048 on {args.threads} threads: fp32 {peak['fp32']:.0f} GFLOP/s, "
             f"bf16 {peak['bf16']:.0f} GFLOP/s (MFU uses fp32: both frameworks train in fp32; others {busy:.0%} busy)")
    rows = grid(args)
    progress(f"{len(rows)} row(s) x {args.repeats} repeat(s) x 2 frameworks; child logs in {logs}")
    prepared = {}
    for size in args.sizes:
        prepared[size] = spawn("prepare", {"size": size, "threads": args.threads}, logs / f"prepare_{size}.log",
                               args.threads)
        progress(f"warm start {size}: {prepared[size]['model_path']} (held-out {prepared[size]['accuracy']:.1%})")
    results = [run_row(row, args, prepared[row["size"]], peak, logs, progress) for row in rows]
    print()
    print(f"{args.prompts} prompts/step, {args.steps} steps (first {WARMUP_STEPS} left out of speed figures), "
          f"lr {args.lr:g} constant, {args.threads} threads, medians of {args.repeats} run(s) each")
    print(table(results))
    busiest = max(f["busy_before"] for r in results for fw in FRAMEWORKS for f in r["runs"][fw])
    if busiest > 0.2:
        print(f"WARNING: other processes kept the machine up to {busiest:.0%} busy before a run; speed figures are "
              f"unreliable (rerun on a quiet machine, or with --wait-idle 300)")
    summary = {"peak_gflops": peak, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                             if k != "child"},
               "rows": results, "wall_s": time.perf_counter() - began}
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
