"""The bench's figure arithmetic: per-step records -> the figures of the tables (no timing, no models run here).

Shared by compare_trl.py (the parent, which summarises the runs) and children.py (which turns a grpoflow run's
metrics.jsonl into per-step records). Each function is plain arithmetic over dicts and lists, tested with hand
values in tests/unit/test_bench_figures.py.
"""

from __future__ import annotations

import statistics

from limits import PEAK_KEY, step_limit

WARMUP_STEPS = 2      # left out of s/step, tok/s and MFU (first-call allocations, lazy inits)
EDGE_STEPS = 3        # reward "first" / "last" = mean over this many steps


def summarize(run: dict, *, kl: float, peak_gflops: dict[str, float], bandwidth_gbs: float, group_size: int = 1
              ) -> dict:
    """One run's figures from its per-step records (the same arithmetic for both frameworks).

    Speed figures are medians over the steps after the warm-up: on a shared machine a median
    shrugs off the odd step that another process slowed down, a mean over steps does not.
    MFU divides by the `torch.mm` peak of the dtype the run computes in (fp32 or bf16); `limit_s` is the step's
    physical limit at those rates (`limits.step_limit`), `x_limit` the step's seconds over it (medians over steps);
    `limit_min_s` / `x_limit_min` the same with each prompt counted once per group of `group_size` samples."""
    steps = run["steps"]
    timed = steps[WARMUP_STEPS:] or steps
    p = run["params"]

    def flops(s: dict) -> float:
        tokens = s["prompt_tokens"] + s["completion_tokens"]
        return 6 * p * tokens + 2 * p * s["completion_tokens"] + (2 * p * tokens if kl > 0 else 0)

    def median(fn) -> float:
        return statistics.median(fn(s) for s in timed)

    def limit(s: dict, share: int = 1) -> dict:
        return step_limit(s, params=p, dtype=run["compute_dtype"], kl=kl, peak_gflops=peak_gflops,
                          bandwidth_gbs=bandwidth_gbs, prompt_share=share)

    step, gen = median(lambda s: s["seconds"]), median(lambda s: s["gen_seconds"])
    peak = peak_gflops[PEAK_KEY[run["compute_dtype"]]] * 1e9
    return {"s_per_step": step, "gen_s": gen, "rest_s": median(lambda s: s["seconds"] - s["gen_seconds"]),
            "tokens_per_s": median(lambda s: (s["prompt_tokens"] + s["completion_tokens"]) / s["seconds"]),
            "mfu": median(lambda s: flops(s) / s["seconds"]) / peak,
            "limit_s": median(lambda s: limit(s)["total_s"]), "limit_update_s": median(lambda s: limit(s)["update_s"]),
            "limit_gen_s": median(lambda s: limit(s)["gen_s"]),
            "x_limit": median(lambda s: s["seconds"] / limit(s)["total_s"]),
            "limit_min_s": median(lambda s: limit(s, group_size)["total_s"]),
            "x_limit_min": median(lambda s: s["seconds"] / limit(s, group_size)["total_s"]),
            "peak_rss_mb": run["peak_rss_mb"],
            "reward_first": statistics.mean(s["reward"] for s in steps[:EDGE_STEPS]),
            "reward_last": statistics.mean(s["reward"] for s in steps[-EDGE_STEPS:]),
            "accuracy": run["accuracy"],
            "tokens_per_step": median(lambda s: s["prompt_tokens"] + s["completion_tokens"]),
            "completion_tokens_per_step": median(lambda s: s["completion_tokens"]), "params": p,
            "threads": run["threads"], "run_wall_s": run["run_wall_s"],
            "stages": {k: median(lambda s, k=k: s["stages"][k]) for k in timed[0]["stages"]}}


def median_figures(runs: list[dict]) -> dict:
    """Median over repeats of every figure (and of every stage's seconds)."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "stages"}
    out["stages"] = {k: statistics.median(r["stages"][k] for r in runs) for k in runs[0]["stages"]}
    return out


def over_best_trl(med: dict[str, dict]) -> tuple[str, dict[str, dict]]:
    """The fastest TRL run (lowest median s/step) and every other run's ratios to it."""
    best = min((label for label in med if label.startswith("trl")), key=lambda label: med[label]["s_per_step"])
    t = med[best]
    return best, {label: {"s_per_step": g["s_per_step"] / t["s_per_step"],
                          "tokens_per_s": g["tokens_per_s"] / t["tokens_per_s"],
                          "peak_rss_mb": g["peak_rss_mb"] / t["peak_rss_mb"], "mfu": g["mfu"] / t["mfu"]}
                  for label, g in med.items() if label != best}


def grpoflow_step(m: dict, trajectories: int) -> dict:
    """One grpoflow step's record in the bench's schema (as children.child_trl writes TRL's), from its line of
    metrics.jsonl: `trajectories` = prompts x group size. Tokens: `perf/throughput` x `timing_s/step` is the
    step's prompt + response tokens (attention_mask.sum()); the completion tokens are the mean response length
    times the trajectories. Generation is the engines' own time (`timing_s/gen_busy`: the controller's
    `timing_s/gen` times its wait for them, which is not the same once generation can be submitted ahead)."""
    tokens = m["perf/throughput"] * m["timing_s/step"]
    completion = m["response_length/mean"] * trajectories
    stages = {k.removeprefix("timing_s/"): v for k, v in m.items() if k.startswith("timing_s/")}
    stages["generate"] = stages.get("gen_busy", stages.get("gen", 0.0))
    inner = {"train_forward": stages.get("train_forward", 0.0), "forward_backward": stages.get("forward_backward", 0.0),
             "optimizer": stages.get("optimizer", 0.0),
             "nograd_forward": sum(stages.get(k, 0.0) for k in ("old_log_prob", "ref", "teacher"))}
    return {"seconds": m["timing_s/step"], "gen_seconds": stages["generate"],
            "prompt_tokens": round(tokens - completion), "completion_tokens": round(completion),
            "reward": m["critic/score/mean"], "response_length": m["response_length/mean"],
            "max_completion": m["response_length/max"], "truncated": m["response_length/clip_ratio"],
            "stages": {**stages, **model_math(stages, inner)}}


def model_math(stages: dict, timed: dict) -> dict:
    """One grpoflow step split into model math (generation, forward, backward, optimizer) and the rest.

    `stages` holds the step's stages and `generate` (the engines' own time); `timed` the model math of the
    update as the actor times it (`timing_s/train_forward`, `forward_backward`, `optimizer`) and
    `nograd_forward`, the old-log-prob, reference and teacher passes (their stages' seconds).

    `dataflow` is what the step spends outside model math: scoring, advantages, weight sync,
    micro-batch building, moving batches between roles, metrics. `backward` also holds the
    loss arithmetic between the forward and `loss.backward()` (a few element-wise ops).
    """
    forward = timed.get("train_forward", 0.0) + timed.get("nograd_forward", 0.0)
    backward = timed.get("forward_backward", 0.0) - timed.get("train_forward", 0.0)
    optimizer = timed.get("optimizer", 0.0)
    math = stages["generate"] + forward + backward + optimizer
    return {"forward": forward, "backward": backward, "optimizer": optimizer,
            "dataflow": max(stages["step"] - math, 0.0)}


def count_params(model) -> int:
    """Parameters that take part in matmuls: all but the input embedding (a lookup), which counts when it is also
    the output head (tied weights, e.g. SmolLM2)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    return sum(p.numel() for p in model.parameters() if p is not embed or tied)


def greedy_lengths(new_tokens, eos_token_id: int) -> tuple[list[int], list[bool]]:
    """Per row of `generate`'s new tokens [B, T]: the answer's length up to and including the first EOS
    (T when there is none), and whether it has no EOS (cut at the budget). `generate` pads finished rows with
    the pad id, which for many chat models is the EOS id too: only the first one counts."""
    lengths, cut = [], []
    for row in new_tokens.tolist():
        end = row.index(eos_token_id) + 1 if eos_token_id in row else len(row)
        lengths.append(end)
        cut.append(eos_token_id not in row)
    return lengths, cut


def overlap_figures(records: list[dict]) -> dict:
    """Whether generation overlapped training, from a run's metrics.jsonl lines (medians over them).

    Per step, the trainer waits `wait` for its samples (`timing_s/trainer_wait` in async mode; in sync mode the
    whole generation stage, `timing_s/gen`) and works `train = step - wait`; the engines generate `gen_busy`.
    Run one after the other, the two stages take `in_a_row = gen_busy + train`; `hidden = in_a_row - step`
    (= gen_busy - wait) is the generation time the overlap hid (about 0 in sync mode). The shares are the waits
    over the step: the trainer's (`wait`) and the engines' (`timing_s/rollout_wait`, async mode only: 0 otherwise).
    """
    def wait(r: dict) -> float:
        return r["timing_s/trainer_wait"] if "timing_s/trainer_wait" in r else r["timing_s/gen"]

    def median(key) -> float:
        return statistics.median(key(r) for r in records)

    return {"step_s": median(lambda r: r["timing_s/step"]), "gen_busy_s": median(lambda r: r["timing_s/gen_busy"]),
            "train_s": median(lambda r: r["timing_s/step"] - wait(r)),
            "in_a_row_s": median(lambda r: r["timing_s/gen_busy"] + r["timing_s/step"] - wait(r)),
            "hidden_s": median(lambda r: r["timing_s/gen_busy"] - wait(r)),
            "trainer_wait_share": median(lambda r: wait(r) / r["timing_s/step"]),
            "rollout_wait_share": median(lambda r: r.get("timing_s/rollout_wait", 0.0) / r["timing_s/step"])}
