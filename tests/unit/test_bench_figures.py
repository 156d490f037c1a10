"""bench arithmetic (no timing): figures from step records, the step split, the step limit, ratios, parameter counts.

Argparse defaults and row labels are not pinned here: they change on purpose and no bug breaks them."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def figures():
    sys.path.insert(0, str(BENCH))  # figures imports its sibling `limits`
    try:
        import figures
        yield figures
    finally:
        sys.path.remove(str(BENCH))


def test_summarize_uses_the_peak_of_the_compute_dtype(figures):
    # 3 steps; the first 2 are warm-up. Step 3: 1 s, 60 prompt + 40 completion tokens, P = 1e6:
    # FLOPs = 6e6 * 100 + 2e6 * 40 = 6.8e8 per second; bf16 peak 1 GFLOP/s -> MFU 68 %
    step = {"seconds": 1.0, "gen_seconds": 0.25, "prompt_tokens": 60, "completion_tokens": 40, "max_completion": 8,
            "reward": 0.5, "stages": {"step": 1.0}}
    run = {"steps": [step] * 3, "params": 10**6, "peak_rss_mb": 1.0, "accuracy": 0.5, "threads": 2,
           "run_wall_s": 9.0, "compute_dtype": "bfloat16"}
    peak = {"fp32": 0.5, "bf16": 1.0}
    f = figures.summarize(run, kl=0.0, peak_gflops=peak, bandwidth_gbs=1.0)
    assert f["mfu"] == pytest.approx(0.68) and f["tokens_per_s"] == 100 and f["rest_s"] == 0.75
    # limit: update 6e6 * 100 / 1e9 = 0.6 s; generation max(2e6 * 40 / 1e9 = 0.08 s, 8 steps * 1e6 * 2 B / 1e9 B/s
    # = 0.016 s) = 0.08 s; 0.68 s in all, and the 1 s step is 1/0.68 = 1.47x it
    assert f["limit_s"] == pytest.approx(0.68) and f["x_limit"] == pytest.approx(1 / 0.68)
    # with KL the reference forward adds 2 P per token: 8.8e8
    assert figures.summarize(run, kl=0.1, peak_gflops=peak, bandwidth_gbs=1.0)["mfu"] == pytest.approx(0.88)
    assert figures.summarize({**run, "compute_dtype": "float32"}, kl=0.0, peak_gflops=peak,
                             bandwidth_gbs=1.0)["mfu"] == pytest.approx(1.36)


def test_model_math_leaves_the_rest_as_dataflow(figures):
    # step 1.0 = generate 0.3 + forward (0.2 train + 0.1 reference) + backward (0.5 - 0.2) + optimizer 0.05 + 0.05
    split = figures.model_math({"step": 1.0, "generate": 0.3},
                                {"train_forward": 0.2, "nograd_forward": 0.1, "forward_backward": 0.5,
                                 "optimizer": 0.05})
    assert split == pytest.approx({"forward": 0.3, "backward": 0.3, "optimizer": 0.05, "dataflow": 0.05})


def test_ratios_are_against_the_fastest_trl_run(figures):
    med = {label: {"s_per_step": s, "tokens_per_s": 100 / s, "peak_rss_mb": 1.0, "mfu": 0.1}
           for label, s in (("grpoflow-bf16", 2.0), ("trl", 40.0), ("trl-bf16", 25.0))}
    best, ratios = figures.over_best_trl(med)
    assert best == "trl-bf16" and set(ratios) == {"grpoflow-bf16", "trl"}
    assert ratios["grpoflow-bf16"]["tokens_per_s"] == pytest.approx(12.5)  # 25 / 2
    assert ratios["trl"]["s_per_step"] == pytest.approx(1.6)


def test_step_limit_bytes_bound_generation(figures):
    import limits
    # 1e8 parameters in bf16 (2 bytes), 24 decode steps at 10 GB/s: 24 * 2e8 B / 1e10 B/s = 0.48 s, above the
    # compute bound 2e8 * 100 tokens / 1e12 = 0.02 s; update 6e8 * 1100 / 1e12 = 0.66 s
    record = {"prompt_tokens": 1000, "completion_tokens": 100, "max_completion": 24}
    out = limits.step_limit(record, params=10**8, dtype="bfloat16", kl=0.0, peak_gflops={"fp32": 500, "bf16": 1000},
                            bandwidth_gbs=10.0)
    assert out == pytest.approx({"update_s": 0.66, "gen_s": 0.48, "total_s": 1.14})
    # float32 reads 4 bytes a weight and computes at the fp32 peak
    out = limits.step_limit(record, params=10**8, dtype="float32", kl=0.0, peak_gflops={"fp32": 500, "bf16": 1000},
                            bandwidth_gbs=10.0)
    assert out == pytest.approx({"update_s": 1.32, "gen_s": 0.96, "total_s": 2.28})


def test_a_tied_head_counts_as_matmul_parameters(figures):
    import torch

    class LM(torch.nn.Module):  # embedding 10 x 4 = 40, one layer 4 x 4 = 16, head 10 x 4 = 40 (tied or not)
        def __init__(self, tied):
            super().__init__()
            self.embed, self.layer, self.head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4, bias=False), \
                torch.nn.Linear(4, 10, bias=False)
            if tied:
                self.head.weight = self.embed.weight

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    assert figures.count_params(LM(tied=False)) == 16 + 40  # the lookup does not count, the head does
    assert figures.count_params(LM(tied=True)) == 16 + 40    # the tied matrix counts once, as the head


def test_a_grpoflow_step_record_comes_from_its_metrics_line(figures):
    # 2 s step at 50 tokens/s: 100 prompt + response tokens; 8 trajectories x 4.0 = 32 completion tokens, 68 prompt
    m = {"timing_s/step": 2.0, "perf/throughput": 50.0, "response_length/mean": 4.0, "response_length/max": 6,
         "response_length/clip_ratio": 0.25, "critic/score/mean": 0.5, "timing_s/gen": 0.9, "timing_s/gen_busy": 0.8,
         "timing_s/old_log_prob": 0.1, "timing_s/ref": 0.05, "timing_s/train_forward": 0.2,
         "timing_s/forward_backward": 0.5, "timing_s/optimizer": 0.1}
    r = figures.grpoflow_step(m, trajectories=8)
    assert (r["prompt_tokens"], r["completion_tokens"], r["seconds"]) == (68, 32, 2.0)
    # generation is the engines' own time (gen_busy), not the controller's wait for it (gen)
    assert r["gen_seconds"] == 0.8 and r["stages"]["generate"] == 0.8 and r["stages"]["gen"] == 0.9
    # forward 0.2 + (0.1 + 0.05) no-grad = 0.35; backward 0.5 - 0.2 = 0.3; math 0.8 + 0.35 + 0.3 + 0.1 = 1.55
    assert {k: r["stages"][k] for k in ("forward", "backward", "optimizer", "dataflow")} == pytest.approx(
        {"forward": 0.35, "backward": 0.3, "optimizer": 0.1, "dataflow": 0.45})


def test_merge_puts_separate_invocations_of_a_row_side_by_side(figures, tmp_path):
    import json

    import compare_trl  # imports figures and limits, on the path here

    def run(s):  # one run's summary figures, as run_row stores them
        return {"s_per_step": s, "tokens_per_s": 100 / s, "peak_rss_mb": 10.0 * s, "mfu": 0.1, "stages": {"step": s}}

    row = {"size": "smollm2", "group_size": 8, "max_new_tokens": 24, "kl": 0.0, "init": "real", "accuracy_before": 0.4}
    trl = {"peak_gflops": {"fp32": 1}, "bandwidth_gbs": 1, "args": {}, "wall_s": 5,
           "rows": [{**row, "runs": {"trl": [run(40.0)], "trl-bf16": [run(25.0)], "grpoflow-bf16": [run(4.0)]}}]}
    ours = {"peak_gflops": {"fp32": 2}, "bandwidth_gbs": 2, "args": {}, "wall_s": 3,
            "rows": [{**row, "runs": {"grpoflow-bf16": [run(6.0)]}}]}  # a second run of a label: a repeat
    paths = [tmp_path / "trl.json", tmp_path / "ours.json"]
    for p, summary in zip(paths, (trl, ours)):
        p.write_text(json.dumps(summary))
    merged = compare_trl.merge(paths)
    (r,) = merged["rows"]
    assert set(r["runs"]) == {"trl", "trl-bf16", "grpoflow-bf16"} and r["trl_best"] == "trl-bf16"
    assert r["median"]["grpoflow-bf16"]["s_per_step"] == 5.0            # median of 4 (first file) and 6
    # tokens/s is the median of the runs' own: (100 / 4 + 100 / 6) / 2 = 20.83, over TRL bf16's 100 / 25 = 4
    assert r["over_trl"]["grpoflow-bf16"]["tokens_per_s"] == pytest.approx((100 / 4 + 100 / 6) / 2 / 4)
    assert merged["wall_s"] == 8 and merged["peak_gflops"] == [{"fp32": 1}, {"fp32": 2}]
    # without any TRL run a row has no ratios (a grpoflow-only invocation)
    assert compare_trl.with_medians({**row, "runs": {"grpoflow": [run(4.0)]}})["over_trl"] == {}


def test_the_min_limit_counts_each_prompt_once_per_group(figures):
    import limits
    # 8 prompts x 8 samples: 3,200 prompt tokens (50 each, 8 copies of 8 prompts) + 800 completion tokens, P = 1e8,
    # bf16 peak 1 TFLOP/s: update 6e8 x (3,200 / 8 + 800) / 1e12 = 0.72 s (against 6e8 x 4,000 / 1e12 = 2.4 s);
    # generation max(2e8 x 800 / 1e12 = 0.16 s, 24 x 2e8 B / 1e10 B/s = 0.48 s) = 0.48 s
    record = {"prompt_tokens": 3200, "completion_tokens": 800, "max_completion": 24}
    kw = dict(params=10**8, dtype="bfloat16", kl=0.0, peak_gflops={"fp32": 500, "bf16": 1000}, bandwidth_gbs=10.0)
    assert limits.step_limit(record, **kw, prompt_share=8) == pytest.approx({"update_s": 0.72, "gen_s": 0.48,
                                                                             "total_s": 1.2})
    assert limits.step_limit(record, **kw)["update_s"] == pytest.approx(2.4)
    step = {**record, "seconds": 2.4, "gen_seconds": 1.0, "reward": 0.5, "stages": {"step": 2.4}}
    run = {"steps": [step] * 3, "params": 10**8, "peak_rss_mb": 1.0, "accuracy": 0.5, "threads": 2, "run_wall_s": 9.0,
           "compute_dtype": "bfloat16"}
    f = figures.summarize(run, kl=0.0, peak_gflops=kw["peak_gflops"], bandwidth_gbs=10.0, group_size=8)
    assert f["limit_min_s"] == pytest.approx(1.2) and f["x_limit_min"] == pytest.approx(2.0)
