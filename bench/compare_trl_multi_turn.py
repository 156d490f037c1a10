"""grpoflow vs TRL's GRPOTrainer on the same multi-turn tool task, side by side, same model, same settings.

    .venv/bin/python bench/compare_trl_multi_turn.py --model /tmp/grpoflow-smollm2/hf        # SmolLM2-135M-Instruct
    .venv/bin/python bench/compare_trl_multi_turn.py --model builtin:tiny-4m --recipe calculator_tool --sft-steps 400
    # the frameworks as separate commands (each writes its runs), then one table:
    .venv/bin/python bench/compare_trl_multi_turn.py --frameworks grpoflow-bf16 --json-out a.json
    .venv/bin/python bench/compare_trl_multi_turn.py --frameworks trl --json-out b.json
    .venv/bin/python bench/compare_trl_multi_turn.py --merge a.json b.json

The task is grpoflow's calculator recipe (`--recipe`, default smollm2_calculator): "347*29" -> "10063" with the
`calculator` tool, the same Python function for both (grpoflow/trajectories/builtin_tools.py); the recipe's system
prompt describes the tool; at most `rollout.multi_turn.max_turns` model turns (2: the call, then the answer; TRL
`max_tool_calling_iterations = max_turns - 1`) and `rollout.max_new_tokens` tokens after the prompt, tool results
included (TRL `max_completion_length`, which counts them too); reward: grpoflow's `exact_match` of the last
assistant turn's text against the row's answer (in TRL decoded from the completion's ids after its last assistant
header, `last_turn_ids`, so a tool call left in a last turn counts as grpoflow counts it).

Both start from one warm start (`mt_prepare`, cached in bench/.cache): grpoflow's SFT stage on the recipe's
demonstration conversations, then `hermes_tools.with_hermes_tools`: the same weights with a chat template that
renders tool calls as Hermes `<tool_call>{json}</tool_call>` and a `response_template` that parses them (TRL needs
both; every plain conversation renders as before, checked). The GRPO settings are compare_trl.py's twin settings
(children.grpoflow_overrides / children.trl_config: temperature 1, constant lr, token-mean loss = TRL "dapo",
group-std advantages, clip 0.2, grad-norm clip 1, one optimizer step per step, KL 0, the step in one micro-batch)
with `--prompts` x `--n` trajectories per step, `--steps` steps, `--lr`.

Figures (figures.summarize, as compare_trl.py): s/step and tok/s are medians over the steps after the first
WARMUP_STEPS; tok/s counts prompt + every response token (the model's and the tool's, no padding) per second of
step time; reward first/last: mean sampled reward of the first/last 3 steps; tool calls: trajectories that called
the tool, per trajectory, over the last 3 steps. Ratios are against the fastest TRL run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from compare_trl import cpu_busy, spawn
from figures import EDGE_STEPS, WARMUP_STEPS, median_figures, over_best_trl, summarize
from limits import measure_bandwidth, measure_peak

BENCH_DIR = Path(__file__).resolve().parent
CACHE = BENCH_DIR / ".cache"
SMOLLM2 = "/tmp/grpoflow-smollm2/hf"


# ---------------------------------------------------------------- arithmetic (tests/unit/test_bench_figures.py)

def last_turn_ids(ids: list[int], header: list[int]) -> list[int]:
    """The ids of a multi-turn completion's last model turn: after the last occurrence of the assistant header
    (`header`, e.g. the ids of "<|im_start|>assistant\\n"); the whole completion when it has none (one turn)."""
    for start in range(len(ids) - len(header), -1, -1):
        if ids[start:start + len(header)] == header:
            return ids[start + len(header):]
    return list(ids)


def tool_use(steps: list[dict]) -> dict:
    """Means over the last EDGE_STEPS steps of the tool calls per trajectory and of the model turns per trajectory;
    each step record has `tool_calls` (the step's calls), `trajectories` and `turns` (the step's mean)."""
    last = steps[-EDGE_STEPS:]
    return {"tool_calls": statistics.mean(s["tool_calls"] / s["trajectories"] for s in last),
            "turns": statistics.mean(s["turns"] for s in last)}


# ---------------------------------------------------------------- children

def recipe_settings(recipe: str, model: str) -> dict:
    """The multi-turn settings both frameworks take from grpoflow's recipe."""
    from grpoflow.config import load_config
    cfg = load_config(recipe, [f"model.path={model}"])
    return {"system_prompt": cfg.data.system_prompt, "max_turns": cfg.rollout.multi_turn.max_turns,
            "max_new_tokens": cfg.rollout.max_new_tokens, "tools": list(cfg.rollout.multi_turn.tools),
            "lr": cfg.actor.lr,
            "train_files": list(cfg.data.train_files), "reward": cfg.reward.function}


def child_prepare(spec: dict) -> dict:
    """The warm start (grpoflow's SFT stage of the recipe; cached), given the Hermes tool templates."""
    from grpoflow.commands.run import sft_stage
    from grpoflow.config import load_config
    from hermes_tools import with_hermes_tools
    name = f"mt-{Path(spec['model']).name.replace(':', '-')}-{spec['recipe']}-sft{spec['sft_steps']}"
    folder = CACHE / name / "model"
    if not (folder / "tokenizer_config.json").exists():
        overrides = [f"model.path={spec['model']}", f"trainer.output_dir={CACHE / name / 'warm'}",
                     f"trainer.threads={spec['threads']}", "trainer.resume=never"]
        if spec["sft_steps"] is not None:
            overrides.append(f"sft.steps={spec['sft_steps']}")
        warm = sft_stage(load_config(spec["recipe"], overrides))
        with_hermes_tools(Path(warm), folder)
    return {"model_path": str(folder), **recipe_settings(spec["recipe"], str(folder))}


def child_grpoflow(spec: dict) -> dict:
    """`grpoflow train <recipe>` from the warm start with the twin settings; per-step records from metrics.jsonl."""
    from children import grpoflow_overrides, set_threads
    from figures import count_params, grpoflow_step
    from grpoflow.commands.run import train
    from grpoflow.config import load_config
    from grpoflow.controller.metrics import read_metrics
    from grpoflow.models.loading import load_causal_lm
    set_threads(spec["threads"])
    out = Path(tempfile.mkdtemp(prefix="grpoflow-", dir=spec["tmp"]))
    row = {**spec, "group_size": spec["n"], "kl": 0.0, "task": "calculator", "max_prompt_tokens": 160,
           "overrides": ["trainer.save_every=0", "trainer.log_every=1"]}
    train(load_config(spec["recipe"], grpoflow_overrides(row, out)))
    trajectories = spec["prompts"] * spec["n"]
    records = []
    for m in read_metrics(out):
        record = grpoflow_step(m, trajectories=trajectories)
        records.append({**record, "tool_calls": m["tools/calls"], "trajectories": trajectories,
                        "turns": m["multi_turn/turns/mean"]})
    first = json.loads((out / "train_samples.jsonl").open().readline())
    return {"steps": records, "params": count_params(load_causal_lm(spec["model_path"])),
            "compute_dtype": spec["compute_dtype"], "accuracy": None, "threads": spec["threads"],
            "prompt_probe": first["prompt"]}


def child_trl(spec: dict) -> dict:
    """TRL's GRPOTrainer with `tools=[calculator]` and the twin settings; a callback times each step, the reward
    function records its tokens, tool use and turns."""
    import torch
    from children import StepRecords, set_threads, task_rows, trl_config
    from datasets import Dataset
    from figures import count_params
    from grpoflow.trajectories.builtin_tools import calculator
    from grpoflow.rewards.functions import load_reward_function
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    set_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)
    reward = load_reward_function(spec["reward"])
    system = [{"role": "system", "content": spec["system_prompt"]}] if spec["system_prompt"] else []
    rows = [{"prompt": system + [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
            for r in task_rows("calculator")[0]]
    texts = {user_of(r["prompt"]): trl_prompt_text(tokenizer, r["prompt"]) for r in rows}
    lengths = {k: len(tokenizer(t, add_special_tokens=False)["input_ids"]) for k, t in texts.items()}
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    timer = StepRecords()

    def task_reward(prompts, completions, completion_ids, answer, **_):
        """exact_match of each trajectory's last model turn; records the step's tokens, tool use and turns."""
        last = [tokenizer.decode(last_turn_ids(ids, header), skip_special_tokens=True) for ids in completion_ids]
        users = [user_of(p) for p in prompts]
        scores = [float(reward(texts[u], t, answer=a) or 0.0) for u, t, a in zip(users, last, answer)]
        tools = [sum(m["role"] == "tool" for m in c) for c in completions]  # one tool message per call
        timer.record(prompt_tokens=sum(lengths[u] for u in users),
                     completion_ids=completion_ids, eos=tokenizer.eos_token_id, scores=scores,
                     tool_calls=sum(tools), trajectories=len(completions),
                     turns=statistics.mean(sum(m["role"] == "assistant" for m in c) for c in completions))
        return scores

    config = trl_config({**spec, "group_size": spec["n"], "kl": 0.0},
                        max_tool_calling_iterations=spec["max_turns"] - 1)
    trainer = GRPOTrainer(model=model, reward_funcs=[task_reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, tools=[calculator], callbacks=[timer.callback()])
    trainer.train()
    return {"steps": timer.records, "params": count_params(trainer.model), "compute_dtype": spec["compute_dtype"],
            "accuracy": None, "threads": spec["threads"]}


def user_of(messages: list[dict]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


def trl_prompt_text(tokenizer, messages: list[dict]) -> str:
    """The prompt text TRL's trainer renders for a row (trl.data_utils.apply_chat_template, with the tools)."""
    from grpoflow.trajectories.builtin_tools import calculator
    from trl.data_utils import apply_chat_template
    return apply_chat_template({"prompt": messages}, tokenizer, tools=[calculator])["prompt"]


def child_probe(spec: dict) -> dict:
    """Whether grpoflow's prompt text of its first logged training group is the text TRL renders for one of the
    task's rows (TRL's rendering of every row: grpoflow's log keeps the prompt's text, not the row's prompt)."""
    from children import task_rows
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    system = [{"role": "system", "content": spec["system_prompt"]}] if spec["system_prompt"] else []
    texts = [trl_prompt_text(tokenizer, system + [{"role": "user", "content": r["prompt"]}])
             for r in task_rows("calculator")[0]]
    return {"equal": spec["prompt_probe"] in texts, "trl": texts[0], "grpoflow": spec["prompt_probe"]}


CHILDREN = {"mt_prepare": child_prepare, "mt_grpoflow": child_grpoflow, "mt_trl": child_trl, "mt_probe": child_probe}


# ---------------------------------------------------------------- parent

def frameworks(names: list[str]) -> list[tuple[str, str, str]]:
    """(label, child kind, compute dtype) of each `--frameworks` name: grpoflow, grpoflow-bf16, trl, trl-bf16."""
    known = {"grpoflow": ("mt_grpoflow", "float32"), "grpoflow-bf16": ("mt_grpoflow", "bfloat16"),
             "trl": ("mt_trl", "float32"), "trl-bf16": ("mt_trl", "bfloat16")}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"--frameworks: unknown {unknown}; choose from {sorted(known)}")
    return [(n, *known[n]) for n in names]


def run_all(args, progress) -> dict:
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).resolve()
    peak, bandwidth = measure_peak(args.threads), measure_bandwidth(args.threads)
    progress(f"peak torch.mm on {args.threads} threads: fp32 {peak['fp32']:.0f}, bf16 {peak['bf16']:.0f} GFLOP/s")
    prepared = spawn("mt_prepare", {"model": args.model, "recipe": args.recipe, "sft_steps": args.sft_steps,
                                    "threads": args.threads}, logs / "mt_prepare.log", args.threads, script=script)
    progress(f"warm start: {prepared['model_path']}")
    spec = {**{k: v for k, v in prepared.items() if k not in ("run_wall_s", "child_s", "peak_rss_mb")},
            "recipe": args.recipe, "prompts": args.prompts, "n": args.n, "steps": args.steps, "seed": args.seed,
            "threads": args.threads, "lr": args.lr if args.lr is not None else prepared["lr"]}
    runs: dict[str, list[dict]] = {}
    for rep in range(args.repeats):
        for label, kind, dtype in frameworks(args.frameworks):
            busy = cpu_busy()
            with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as tmp:
                run = spawn(kind, {**spec, "compute_dtype": dtype, "tmp": tmp}, logs / f"{kind}_{label}_{rep}.log",
                            args.threads, script=script)
            figures = {**summarize(run, kl=0.0, peak_gflops=peak, bandwidth_gbs=bandwidth), **tool_use(run["steps"]),
                       "busy_before": busy}
            if "prompt_probe" in run:  # the same row's prompt, as TRL renders it: the same text?
                probe = spawn("mt_probe", {**spec, "prompt_probe": run["prompt_probe"]}, logs / "mt_probe.log",
                              args.threads, script=script)
                if not probe["equal"]:
                    raise SystemExit(f"grpoflow's prompt is not one TRL renders for a row: {probe['grpoflow']!r} "
                                     f"(TRL's first row: {probe['trl']!r})")
            runs.setdefault(label, []).append(figures)
            progress(f"  {label:14s} repeat {rep + 1}: {figures['s_per_step']:.2f} s/step, "
                     f"{figures['tokens_per_s']:.0f} tok/s, reward {figures['reward_first']:.2f} -> "
                     f"{figures['reward_last']:.2f}, tool calls {figures['tool_calls']:.2f}/trajectory "
                     f"(others {busy:.0%} busy before)")
    return {"spec": spec, "peak_gflops": peak, "runs": runs}


COLUMNS = [("s/step", "s_per_step", "{:.2f}"), ("gen s", "gen_s", "{:.2f}"), ("rest s", "rest_s", "{:.2f}"),
           ("tok/s", "tokens_per_s", "{:.0f}"), ("tokens/step", "tokens_per_step", "{:.0f}"), ("MFU", "mfu", "{:.1%}"),
           ("peak MB", "peak_rss_mb", "{:.0f}"), ("reward first", "reward_first", "{:.3f}"),
           ("reward last", "reward_last", "{:.3f}"), ("tool calls", "tool_calls", "{:.2f}"),
           ("turns", "turns", "{:.2f}")]


def table(runs: dict[str, list[dict]]) -> str:
    med = {label: median_figures(fs) for label, fs in runs.items()}
    lines = ["| framework | " + " | ".join(c for c, _, _ in COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    lines += [f"| {label} | " + " | ".join(fmt.format(f[k]) for _, k, fmt in COLUMNS) + " |"
              for label, f in med.items()]
    if any(label.startswith("trl") for label in med) and len(med) > 1:
        best, ratios = over_best_trl(med)
        lines += [f"| {label}/{best} | {x['s_per_step']:.2f}x | | | {x['tokens_per_s']:.2f}x | | {x['mfu']:.2f}x | "
                  f"{x['peak_rss_mb']:.2f}x | | | | |" for label, x in ratios.items()]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=SMOLLM2, help=f"an HF folder or builtin:tiny-<size> (default {SMOLLM2})")
    p.add_argument("--recipe", default="smollm2_calculator", help="grpoflow's calculator recipe (default "
                   "smollm2_calculator; calculator_tool for the tiny model)")
    p.add_argument("--sft-steps", type=int, default=None, help="warm-start steps (default: the recipe's)")
    p.add_argument("--frameworks", type=lambda s: s.split(","), default=["grpoflow", "grpoflow-bf16", "trl"],
                   help="runs per repeat, from grpoflow, grpoflow-bf16, trl, trl-bf16 "
                        "(default grpoflow,grpoflow-bf16,trl)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (default 4)")
    p.add_argument("--n", type=int, default=4, help="trajectories per prompt (default 4)")
    p.add_argument("--steps", type=int, default=6, help="GRPO steps per run (default 6)")
    p.add_argument("--repeats", type=int, default=1, help="alternating runs of each framework (default 1)")
    p.add_argument("--lr", type=float, default=None, help="constant learning rate of both (default: the recipe's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json-out", type=Path, default=None, help="write the runs here (for --merge)")
    p.add_argument("--merge", type=Path, nargs="+", default=None, help="print one table of the runs in these files")
    p.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        from children import emit, peak_rss_mb
        began = time.perf_counter()
        emit({**CHILDREN[args.child[0]](json.loads(args.child[1])), "peak_rss_mb": peak_rss_mb(),
              "child_s": time.perf_counter() - began})
        return
    began = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f}s] {msg}", flush=True)

    if args.merge:
        parts = [json.loads(f.read_text()) for f in args.merge]
        result = {**parts[0], "runs": {k: v for part in parts for k, v in part["runs"].items()}}
    else:
        result = run_all(args, progress)
    s = result["spec"]
    print(f"\n{s['prompts']} prompts x {s['n']} trajectories, {s['steps']} steps (first {WARMUP_STEPS} left out of "
          f"speed figures), lr {s['lr']:g}, <= {s['max_turns']} turns, <= {s['max_new_tokens']} tokens after the "
          f"prompt, {s['threads']} threads; model {s['model_path']}")
    print(table(result["runs"]))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
