"""TrainEngine.set_hyperparameters: the Tinker server's per-request AdamW settings, through the engine's own verb."""

import pytest
import torch

from grpoflow.training.engine import TrainEngine


def one_weight_engine(**kwargs) -> TrainEngine:
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0]]))
    return TrainEngine(model, lr=1e-3, weight_decay=0.0, grad_clip=1.0, **kwargs)


def linear_loss(model, x):
    return model(x).sum(), {}


def test_the_next_step_uses_the_new_lr_decay_eps_and_clip():
    engine = one_weight_engine()
    engine.set_hyperparameters(lr=0.1, betas=(0.5, 0.6), eps=1e-3, weight_decay=0.2, grad_clip=0.5)
    engine.forward_backward([torch.tensor([[3.0, 4.0]])], linear_loss)
    norm = engine.optimizer_step()
    # loss = w . x, so the gradient is x = [3, 4], norm 5, clipped to 0.5: g = [0.3, 0.4].
    # AdamW's first step (bias-corrected moments m = g, v = g^2, whatever the betas):
    #   w <- w * (1 - lr * wd) - lr * g / (|g| + eps)
    #   w0 = [1, -1]: [1 * 0.98 - 0.1 * 0.3 / 0.301, -1 * 0.98 - 0.1 * 0.4 / 0.401] = [0.880332, -1.079751]
    assert norm == pytest.approx(5.0)
    assert engine.model.weight.detach()[0].tolist() == pytest.approx([0.880332, -1.079751], abs=1e-6)
    group = engine.optimizer.param_groups[0]
    assert group["betas"] == (0.5, 0.6) and group["eps"] == 1e-3 and group["weight_decay"] == 0.2


def test_lr_is_the_base_rate_under_a_schedule():
    engine = one_weight_engine(lr_schedule=lambda step: 0.5)
    engine.set_hyperparameters(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, grad_clip=0.0)
    assert engine.lr == pytest.approx(0.05)         # this step: 0.1 x the schedule's 0.5
    engine.forward_backward([torch.tensor([[3.0, 4.0]])], linear_loss)
    engine.optimizer_step()
    assert engine.lr == pytest.approx(0.05)         # and the schedule goes on from the new base rate
