"""Three optimizer steps of the actor do not depend on how the work is cut (docs/numerics.md, the contract):
bitwise for the fused head's chunk size, within a stated bound for the micro-batch budget (a sum over other
micro-batches is another sum)."""

import torch

from grpoflow.config import ActorConfig
from grpoflow.data.batch import Batch
from grpoflow.workers.actor import ActorWorker


def batch(b: int = 12, p: int = 7, r: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    prompt_mask = (torch.arange(p)[None, :] >= p - torch.randint(2, p + 1, (b,), generator=g)[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < torch.randint(1, r + 1, (b,), generator=g)[:, None]).long()
    return Batch(prompt_ids=torch.randint(6, 100, (b, p), generator=g) * prompt_mask, prompt_mask=prompt_mask,
                 response_ids=torch.randint(6, 100, (b, r), generator=g) * response_mask, response_mask=response_mask,
                 group_ids=torch.arange(b) // 4, advantages=torch.randn(b, 1, generator=g).expand(b, r) * response_mask,
                 rollout_log_probs=-torch.rand(b, r, generator=g) * 3 * response_mask)


def three_steps(model_path: str, **options) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Metrics of 3 `update_policy` calls (one optimizer step each) on one batch, and the weights after them."""
    cfg = ActorConfig(lr=1e-3, entropy_coeff=0.01, **options)
    worker = ActorWorker(0, 1, model_path=model_path, cfg=cfg, temperature=0.7, horizon=6, seed=0)
    before = {n: p.detach().clone() for n, p in worker.engine.model.named_parameters()}
    metrics = [{k: v for k, v in worker.update_policy(batch()).items() if not k.startswith("timing_s/")}
               for _ in range(3)]
    after = {n: p.detach().clone() for n, p in worker.engine.model.named_parameters()}
    assert any(not torch.equal(before[n], after[n]) for n in after), "the steps should move the weights"
    return metrics, after


def test_the_fused_heads_chunk_size_changes_nothing(tiny_model_path):
    # the head's chunks split the rows of its products and softmax, each row computed alone: bit for bit
    m1, w1 = three_steps(tiny_model_path, logprob_chunk_size=5)
    m2, w2 = three_steps(tiny_model_path, logprob_chunk_size=128)
    assert m1 == m2
    assert all(torch.equal(w1[n], w2[n]) for n in w1)


def test_the_micro_batch_budget_moves_the_weights_only_by_rounding(tiny_model_path):
    # one micro-batch against one or two rows each: the gradient is another sum of the same terms; after 3 AdamW
    # steps at lr 1e-3 the weights differ by 1.2e-5 (the bound: 1e-4), while normalising each micro-batch's loss by
    # its own token count instead of the mini-batch's moves them by 6e-3
    m1, w1 = three_steps(tiny_model_path, max_tokens_per_microbatch=10_000)
    m2, w2 = three_steps(tiny_model_path, max_tokens_per_microbatch=13)
    worst = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    assert worst < 1e-4, worst
    for a, b in zip(m1, m2):
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-4 * (1 + abs(a[k])), (k, a[k], b[k])
