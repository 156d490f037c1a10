"""The design's invariant: how a mini-batch is cut into micro-batches does not change the gradient."""

import pytest
import torch

from grpoflow.config import ActorConfig
from grpoflow.data.batch import Batch
from grpoflow.workers.actor import ActorWorker


def random_batch(b: int = 12, p: int = 7, r: int = 6, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, p + 1, (b,), generator=g)
    resp_lens = torch.randint(1, r + 1, (b,), generator=g)
    prompt_mask = (torch.arange(p)[None, :] >= p - prompt_lens[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < resp_lens[:, None]).long()
    prompt_ids = torch.randint(6, 100, (b, p), generator=g) * prompt_mask
    response_ids = torch.randint(6, 100, (b, r), generator=g) * response_mask
    adv = torch.randn(b, 1, generator=g).expand(b, r) * response_mask
    return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                 response_mask=response_mask, group_ids=torch.arange(b) // 4,
                 old_log_probs=-torch.rand(b, r, generator=g) * 3 * response_mask,
                 ref_log_probs=-torch.rand(b, r, generator=g) * 3 * response_mask, advantages=adv)


def gradient(model_path: str, batch: Batch, budget: int, mode: str) -> list[torch.Tensor]:
    cfg = ActorConfig(max_tokens_per_microbatch=budget, loss_agg_mode=mode, kl_coef=0.1)
    worker = ActorWorker(0, 1, model_path=model_path, cfg=cfg, temperature=0.7, horizon=6, seed=0)
    worker.accumulate_gradients(batch)
    return [p.grad.clone() for p in worker.engine.model.parameters()]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_microbatch_split_leaves_gradient_unchanged(tiny_model_path, mode):
    batch = random_batch()
    whole = gradient(tiny_model_path, batch, budget=10_000, mode=mode)   # one micro-batch
    split = gradient(tiny_model_path, batch, budget=13, mode=mode)       # one or two rows each
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_tiny_budget_really_splits():
    from grpoflow.training.microbatch import split_by_tokens

    parts, plans = split_by_tokens(random_batch(), 13)
    assert len(parts) >= 6 and sorted(i for p in plans for i in p) == list(range(12))


def test_gradient_checkpointing_leaves_gradient_unchanged(tiny_model_path):
    from grpoflow.config import ModelConfig

    batch = random_batch()
    grads = []
    for checkpointing in (False, True):
        worker = ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(kl_coef=0.1), temperature=1.0,
                             horizon=6, seed=0, model_cfg=ModelConfig(gradient_checkpointing=checkpointing))
        worker.accumulate_gradients(batch)
        grads.append([p.grad.clone() for p in worker.engine.model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_bfloat16_policy_trains(tiny_model_path):
    from grpoflow.config import ModelConfig

    worker = ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(), temperature=1.0, horizon=6, seed=0,
                         model_cfg=ModelConfig(dtype="bfloat16"))
    assert next(worker.engine.model.parameters()).dtype == torch.bfloat16
    metrics = worker.update_policy(random_batch())
    assert metrics["actor/grad_norm"] > 0
