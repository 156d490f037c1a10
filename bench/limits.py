"""The machine's limits, measured in the bench's own run, and a step's physical limit from them.

- `measure_peak`: GFLOP/s of `torch.mm` on 2048x2048 per dtype (fp32, bf16), the best of 10 calls (bf16 on
  512x512 where a CPU emulates it);
- `measure_bandwidth`: GB/s of a 256 MiB tensor copy (bytes read + written), the best of 10 calls;
- `step_limit`: the least time one step's work could take at those rates. The update is compute
  bound: 6 P FLOPs per trajectory token (forward + backward; + 2 P per token for a reference
  forward when KL > 0) at the run's dtype peak. Generation is bound by whichever is slower: its
  compute (2 P per response token) or reading every weight once per decode step (the longest
  response's length steps, P x bytes per weight in the run's dtype) at the copy bandwidth.

P is the bench's parameter count (matmul parameters, `children.count_params`). These are the
FLOPs of the trajectories (as the bench's MFU), so a framework that skips work (prompts run once
per group) can come closer to the limit, never below the bytes bound. With `prompt_share` n (the
group size) the prompt tokens count once per group: the least work a GRPO step needs, since the n
samples of a group share their prompt (the bench's "min limit").
"""

from __future__ import annotations

import time

PEAK_KEY = {"float32": "fp32", "bfloat16": "bf16"}
BYTES_PER_WEIGHT = {"float32": 4, "bfloat16": 2}


def _best_of(fn, *args, repeats: int = 10) -> float:
    fn(*args)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


def measure_peak(threads: int) -> dict[str, float]:
    """GFLOP/s of torch.mm on 2048x2048 in fp32 and bf16: the best of 10 calls after one warm-up.

    The best, not the mean: a peak is what the cores can do when nothing else runs. On a CPU without bf16 units
    (grpoflow/training/bf16_units.py) bf16 products are emulated, and eleven 2048x2048 calls took 11 minutes: there
    bf16 is timed on 512x512, the best of 2 calls (about 1 GFLOP/s)."""
    import torch
    from grpoflow.training.bf16_units import cpu_has_bf16_units
    torch.set_num_threads(threads)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        emulated = dtype == torch.bfloat16 and cpu_has_bf16_units() is False  # the products run on the CPU
        n, repeats = (512, 2) if emulated else (2048, 10)
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        out[name] = 2 * n ** 3 / _best_of(torch.mm, a, b, repeats=repeats) / 1e9
    return out


def measure_bandwidth(threads: int, mib: int = 256) -> float:
    """GB/s of copying a `mib` MiB float32 tensor into another (read + write bytes), the best of 10 copies."""
    import torch
    torch.set_num_threads(threads)
    src = torch.randn(mib * 2 ** 20 // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_of(dst.copy_, src) / 1e9


def step_limit(record: dict, *, params: int, dtype: str, kl: float, peak_gflops: dict[str, float],
               bandwidth_gbs: float, prompt_share: int = 1) -> dict[str, float]:
    """Seconds one step's work takes at least: `update_s` + `gen_s` = `total_s` (see the module docstring).

    record: the bench's per-step record (`prompt_tokens`, `completion_tokens`, `max_completion`); prompt_share: how
    many samples share each prompt (1: every prompt token counts)."""
    peak = peak_gflops[PEAK_KEY[dtype]] * 1e9
    tokens = record["prompt_tokens"] / prompt_share + record["completion_tokens"]
    update = (6 * params * tokens + (2 * params * tokens if kl > 0 else 0)) / peak
    gen_compute = 2 * params * record["completion_tokens"] / peak
    gen_bytes = record["max_completion"] * params * BYTES_PER_WEIGHT[dtype] / (bandwidth_gbs * 1e9)
    gen = max(gen_compute, gen_bytes)
    return {"update_s": update, "gen_s": gen, "total_s": update + gen}
