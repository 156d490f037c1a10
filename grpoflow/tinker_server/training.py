"""`forward`, `forward_backward` and `optim_step` on a training model, with the Tinker losses.

A datum is `model_input` (token ids [T]) and `loss_fn_inputs`, each [T] and aligned with the input: position i
of `target_tokens` is the token that input position i predicts. The model runs the datums right-padded in
micro-batches of at most `microbatch_tokens` tokens; each datum's loss (a sum over its positions,
algorithms/tinker_losses.py) is added up, so gradients accumulate exactly as the SDK's chunking expects.
`target_tokens` may also be [T, K] (several targets per position, e.g. distillation) for `cross_entropy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tinker import types
from torch import Tensor

from grpoflow.algorithms.tinker_losses import TINKER_LOSSES, check_request
from grpoflow.models.head_logprobs import head_log_probs
from grpoflow.models.logprobs import fused_head
from grpoflow.errors import UserError
from grpoflow.tinker_server.models import TrainingModel


@dataclass
class Example:
    """One datum as tensors: input ids [T], targets [T] or [T, K], the loss inputs (float32, target's shape)."""
    input_ids: Tensor
    targets: Tensor
    inputs: dict[str, Tensor]


def to_examples(data: list[types.Datum], loss_fn: str, config: dict, vocab_size: int,
                max_length: int | None = None) -> tuple[list[Example], dict]:
    """Check a request against its loss and the model's context `max_length` (UserError with the reason) and turn
    its datums into tensors."""
    if not data:
        raise UserError("forward_backward got no data; send at least one datum.")
    try:
        resolved = check_request(loss_fn, set(data[0].loss_fn_inputs), config)
    except ValueError as e:
        raise UserError(str(e)) from None
    examples = []
    for i, datum in enumerate(data):
        ids = torch.tensor(datum.model_input.to_ints(), dtype=torch.long)
        arrays = {k: v.to_numpy() for k, v in datum.loss_fn_inputs.items()}
        targets = torch.as_tensor(np.asarray(arrays.pop("target_tokens")), dtype=torch.long)
        if set(arrays) | {"target_tokens"} != set(datum.loss_fn_inputs):
            raise UserError(f"datum {i} has loss_fn_inputs {sorted(datum.loss_fn_inputs)}, datum 0 has "
                            f"{sorted(data[0].loss_fn_inputs)}; every datum of a request needs the same ones.")
        if targets.shape[0] != len(ids) or targets.dim() > 2:
            raise UserError(f"datum {i}: target_tokens has shape {list(targets.shape)} but model_input has "
                            f"{len(ids)} tokens; give one target (or one row of targets) per input position.")
        if targets.dim() == 2 and loss_fn != "cross_entropy":
            raise UserError(f"datum {i}: 2-D target_tokens work only with cross_entropy, not {loss_fn!r}.")
        if len(ids) == 0 or int(ids.max()) >= vocab_size or int(ids.min()) < 0 or int(targets.max()) >= vocab_size \
                or int(targets.min()) < 0:
            raise UserError(f"datum {i}: token ids and target_tokens must lie in [0, {vocab_size}) and model_input "
                            "must not be empty.")
        if max_length is not None and len(ids) > max_length:
            raise UserError(f"datum {i} has {len(ids)} tokens, more than the model's context of {max_length}; "
                            "shorten it.")
        inputs = {k: torch.as_tensor(np.asarray(v), dtype=torch.float32) for k, v in arrays.items()}
        for name, value in inputs.items():
            if value.shape != targets.shape:
                raise UserError(f"datum {i}: loss_fn_inputs[{name!r}] has shape {list(value.shape)}, target_tokens "
                                f"{list(targets.shape)}; they must match.")
        examples.append(Example(ids, targets, inputs))
    return examples, resolved


def microbatches(examples: list[Example], max_tokens: int) -> list[list[Example]]:
    """Consecutive groups of examples of at most `max_tokens` input tokens (a longer example is a group alone)."""
    groups: list[list[Example]] = [[]]
    used = 0
    for ex in examples:
        if groups[-1] and used + len(ex.input_ids) > max_tokens:
            groups.append([])
            used = 0
        groups[-1].append(ex)
        used += len(ex.input_ids)
    return groups


def target_logprobs(model: torch.nn.Module, group: list[Example]) -> list[Tensor]:
    """log p(target) at every position of every example of `group` ([T] or [T, K] each), one padded forward."""
    width = max(len(ex.input_ids) for ex in group)
    ids = torch.zeros(len(group), width, dtype=torch.long)
    mask = torch.zeros(len(group), width, dtype=torch.long)
    for row, ex in enumerate(group):
        ids[row, :len(ex.input_ids)] = ex.input_ids
        mask[row, :len(ex.input_ids)] = 1
    device = next(model.parameters()).device
    head = fused_head(model)
    if head is not None and all(ex.targets.dim() == 1 for ex in group):
        # the decoder's hidden states and the head in chunks (models/head_logprobs.py): no [B, T, V] logits
        decoder = model.get_decoder()  # type: ignore[operator]
        hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        return [head_log_probs(hidden[row, :len(ex.input_ids)], head.weight, ex.targets.to(device))[0]
                for row, ex in enumerate(group)]
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    out = []
    for row, ex in enumerate(group):
        z = logits[row, :len(ex.input_ids)].float()
        log_probs = z - torch.logsumexp(z, -1, keepdim=True)  # not torch.log_softmax (models/log_softmax.py)
        targets = ex.targets.to(device)
        picked = log_probs.gather(-1, targets if targets.dim() == 2 else targets[:, None])
        out.append(picked if targets.dim() == 2 else picked[:, 0])
    return out


def forward_backward(tm: TrainingModel, data: list[types.Datum], loss_fn: str, config: dict, *, forward_only: bool,
                     microbatch_tokens: int, max_length: int | None = None
                     ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Per-datum outputs ({"logprobs": [T]}) and metrics ({"loss:sum": ...}); gradients accumulate unless
    `forward_only`."""
    vocab_size = int(tm.engine.model.config.vocab_size)  # type: ignore[union-attr,arg-type]  # an HF model's config
    examples, resolved = to_examples(data, loss_fn, config, vocab_size, max_length)
    fn = TINKER_LOSSES[loss_fn].fn
    outputs: list[dict[str, np.ndarray]] = []
    total = 0.0

    def group_loss(model: torch.nn.Module, group: list[Example]) -> tuple[Tensor, dict[str, Tensor]]:
        lps = target_logprobs(model, group)
        loss = torch.stack([fn(lp, {k: v.to(lp.device) for k, v in ex.inputs.items()}, resolved)
                            for lp, ex in zip(lps, group)]).sum()
        outputs.extend({"logprobs": lp.detach().cpu().numpy().astype(np.float32)} for lp in lps)
        return loss, {"loss": loss.detach()}

    groups = microbatches(examples, microbatch_tokens)
    if forward_only:
        with torch.no_grad():
            total = sum(float(group_loss(tm.engine.model, g)[0]) for g in groups)
    else:
        total = tm.engine.forward_backward(groups, group_loss)["loss"]
    return outputs, {"loss:sum": total}


def check_adam(params: object) -> types.AdamParams:
    """`params` if it is AdamParams with finite values in range; UserError naming the bad value otherwise."""
    if not isinstance(params, types.AdamParams):
        raise UserError(f"optimizer {getattr(params, 'type', type(params).__name__)!r} is not supported; this "
                        "server runs AdamW (types.AdamParams).")
    for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
        value = getattr(params, name)
        if not math.isfinite(value) or value < 0:
            raise UserError(f"AdamParams {name}={value}: give a finite value >= 0.")
    for name in ("beta1", "beta2"):
        if getattr(params, name) >= 1:
            raise UserError(f"AdamParams {name}={getattr(params, name)}: give a value in [0, 1).")
    return params


def optim_step(tm: TrainingModel, params: types.AdamParams) -> dict[str, float]:
    """One AdamW step with this request's hyper-parameters (Tinker's AdamW: decoupled decay, clip when > 0)."""
    params = check_adam(params)
    tm.engine.set_hyperparameters(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                                  weight_decay=params.weight_decay, grad_clip=params.grad_clip_norm)
    norm = tm.engine.optimizer_step()
    return {"grad_norm:mean": norm, "learning_rate:mean": params.learning_rate}
