"""bench arithmetic (no timing): figures from step records, the step split, the step limit, ratios, parameter counts.

Argparse defaults and row labels are not pinned here: they change on purpose and no bug breaks them."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # compare_trl imports its sibling `children` in a child process
    try:
        spec = importlib.util.spec_from_file_location("compare_trl", BENCH / "compare_trl.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        import children
        yield module, children
    finally:
        sys.path.remove(str(BENCH))


def test_summarize_uses_the_peak_of_the_compute_dtype(bench):
    compare, _ = bench
    # 3 steps; the first 2 are warm-up. Step 3: 1 s, 60 prompt + 40 completion tokens, P = 1e6:
    # FLOPs = 6e6 * 100 + 2e6 * 40 = 6.8e8 per second; bf16 peak 1 GFLOP/s -> MFU 68 %
    step = {"seconds": 1.0, "gen_seconds": 0.25, "prompt_tokens": 60, "completion_tokens": 40, "max_completion": 8,
            "reward": 0.5, "stages": {"step": 1.0}}
    run = {"steps": [step] * 3, "params": 10**6, "peak_rss_mb": 1.0, "accuracy": 0.5, "threads": 2,
           "run_wall_s": 9.0, "compute_dtype": "bfloat16"}
    peak = {"fp32": 0.5, "bf16": 1.0}
    f = compare.summarize(run, kl=0.0, peak_gflops=peak, bandwidth_gbs=1.0)
    assert f["mfu"] == pytest.approx(0.68) and f["tokens_per_s"] == 100 and f["rest_s"] == 0.75
    # limit: update 6e6 * 100 / 1e9 = 0.6 s; generation max(2e6 * 40 / 1e9 = 0.08 s, 8 steps * 1e6 * 2 B / 1e9 B/s
    # = 0.016 s) = 0.08 s; 0.68 s in all, and the 1 s step is 1/0.68 = 1.47x it
    assert f["limit_s"] == pytest.approx(0.68) and f["x_limit"] == pytest.approx(1 / 0.68)
    # with KL the reference forward adds 2 P per token: 8.8e8
    assert compare.summarize(run, kl=0.1, peak_gflops=peak, bandwidth_gbs=1.0)["mfu"] == pytest.approx(0.88)
    assert compare.summarize({**run, "compute_dtype": "float32"}, kl=0.0, peak_gflops=peak,
                             bandwidth_gbs=1.0)["mfu"] == pytest.approx(1.36)


def test_model_math_leaves_the_rest_as_dataflow(bench):
    _, children = bench
    # step 1.0 = generate 0.3 + forward (0.2 train + 0.1 reference) + backward (0.5 - 0.2) + optimizer 0.05 + 0.05
    split = children.model_math({"step": 1.0, "generate": 0.3},
                                {"train_forward": 0.2, "nograd_forward": 0.1, "forward_backward": 0.5, "optimizer": 0.05})
    assert split == pytest.approx({"forward": 0.3, "backward": 0.3, "optimizer": 0.05, "dataflow": 0.05})


def test_ratios_are_against_the_fastest_trl_run(bench):
    compare, _ = bench
    med = {label: {"s_per_step": s, "tokens_per_s": 100 / s, "peak_rss_mb": 1.0, "mfu": 0.1}
           for label, s in (("grpoflow-bf16", 2.0), ("trl", 40.0), ("trl-bf16", 25.0))}
    best, ratios = compare.over_best_trl(med)
    assert best == "trl-bf16" and set(ratios) == {"grpoflow-bf16", "trl"}
    assert ratios["grpoflow-bf16"]["tokens_per_s"] == pytest.approx(12.5)  # 25 / 2
    assert ratios["trl"]["s_per_step"] == pytest.approx(1.6)


def test_step_limit_bytes_bound_generation(bench):
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


def test_a_tied_head_counts_as_matmul_parameters(bench):
    import torch
    _, children = bench

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

    assert children.count_params(LM(tied=False)) == 16 + 40  # the lookup does not count, the head does
    assert children.count_params(LM(tied=True)) == 16 + 40    # the tied matrix counts once, as the head
