"""The CUDA tier: what only a GPU shows. Skipped without CUDA; `bench/gpu_check.sh` runs it first.

One GPU: the HF engine's sampling log-probs on CUDA equal the trainer's teacher-forced ones, a colocated
weight sync on CUDA leaves the engine with the actor's weights, and a short GRPO run on CUDA learns.
Two GPUs (skipped with one): FSDP2 over NCCL gives the single-GPU gradient.

Every figure asserted here was set in float32 (exact weights, log-probs to 1e-4, a learning gain, two runs' metrics
to 1e-3), so each test pins float32: on a GPU the default compute dtype is bfloat16 (training/bf16_units.py).
"""

import os
import subprocess
import sys
from functools import partial

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_sampling_log_probs_on_cuda_match_the_trainer(tiny_model_path):
    from grpoflow.data.batch import Batch
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    from grpoflow.engines.hf import HFRolloutEngine
    from grpoflow.engines.protocol import SamplingParams
    from grpoflow.engines.whole_batch import generate_batch
    from grpoflow.training.forward import batch_log_probs

    tok = load_tokenizer(tiny_model_path)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_path).cuda(), pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
    prompts = [tok.encode(p, add_special_tokens=False) for p in ["1+2=", "10+20=", "7+55="]]
    gen = generate_batch(engine, prompts, SamplingParams(n=4, max_new_tokens=6), seeds=[1, 2, 3])
    batch = Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                  response_mask=gen.response_mask, group_ids=torch.arange(12) // 4)
    trainer_lp, _ = batch_log_probs(load_causal_lm(tiny_model_path).cuda(), batch, temperature=1.0, max_tokens=4096,
                                    chunk_size=7)
    m = gen.response_mask.bool()
    torch.testing.assert_close(trainer_lp[m], gen.log_probs[m], atol=1e-4, rtol=1e-4)


def test_colocated_weight_sync_on_cuda(tiny_model_path):
    from grpoflow.config import ActorConfig, Config, ModelConfig
    from grpoflow.controller.weight_sync import WeightSync
    from grpoflow.distributed.host import LocalPool
    from grpoflow.distributed.worker_group import WorkerGroup
    from grpoflow.workers.actor import ActorWorker
    from grpoflow.workers.rollout import RolloutWorker

    pool = LocalPool(1)
    actor = WorkerGroup("actor", partial(ActorWorker, model_path=tiny_model_path, cfg=ActorConfig(), temperature=1.0,
                                         horizon=4, seed=0, model_cfg=ModelConfig(compute_dtype="float32")), pool=pool)
    rollout = WorkerGroup("rollout", partial(RolloutWorker, model_path=tiny_model_path, cfg=Config(), dtype="float32"),
                          pool=pool)
    trained = pool.hosts[0].roles["actor"].engine.model
    assert next(trained.parameters()).is_cuda
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    WeightSync(actor, rollout, queued=False).push(2)
    engine = pool.hosts[0].roles["rollout"].engine
    assert engine.version == 2
    for (name, a), b in zip(trained.state_dict().items(), engine.model.state_dict().values()):
        torch.testing.assert_close(a.to(b.device), b, rtol=0, atol=0, msg=name)


def test_a_short_grpo_run_on_cuda_learns(tmp_path):
    from grpoflow.config import load_config
    from grpoflow.commands.run import train

    result = train(load_config(None, ["model.path=builtin:tiny-4m", "trainer.total_steps=40", "trainer.val_every=40",
                                      "data.val_max_prompts=200", f"trainer.output_dir={tmp_path}",
                                      "model.compute_dtype=float32"]))
    assert result["after"]["val/mean@1"] > result["before"]["val/mean@1"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_fsdp2_over_nccl_matches_one_gpu(tmp_path):
    # the CPU tier checks FSDP2 with gloo (tests/integration/test_fsdp.py); this runs the same GRPO job on
    # two NCCL ranks and on one, and compares the first step's metrics
    def run(out, extra):
        cmd = [sys.executable, "-m", "grpoflow.cli", "train", "model.path=builtin:tiny-0.5m", "sft.steps=20",
               "trainer.total_steps=2", "trainer.val_every=0", "data.prompts_per_step=4", "rollout.n=4",
               "model.compute_dtype=float32", f"trainer.output_dir={out}", *extra]
        subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
        from grpoflow.controller.metrics import read_metrics
        return read_metrics(out)

    one = run(tmp_path / "one", [])
    two = run(tmp_path / "two", ["backend=ray", "resources.devices_per_node=2"])
    for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-3, abs=1e-5), key
