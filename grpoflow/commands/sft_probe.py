"""The warm start's stop rule: greedy exact-match accuracy on rows it does not train on.

A warm start that runs a fixed number of steps ends wherever that count lands on the model's learning curve; on
the built-in task that curve jumps (carries are learned in one go after 300-500 steps, and where depends on the
seed and the CPU's float kernels), so GRPO started from anywhere on it (docs/performance-log.md, "`make train`: where
the warm start ends decides the gain"). With `sft.until_accuracy` the
warm start stops at the first check (every `sft.check_every` steps) where the model answers at least that share of
`sft.probe_rows` held-back rows right, greedily: the start no longer depends on the draw.
"""

from __future__ import annotations

from typing import Any

import torch

Probe = list[tuple[list[int], list[int]]]   # (prompt ids, target ids without EOS) per held-back row


@torch.no_grad()
def greedy_accuracy(model: Any, probe: Probe, *, pad_token_id: int, eos_token_id: int,
                    batch_size: int = 256) -> float:
    """Share of `probe` rows whose greedy completion, up to its first EOS, is exactly the target ids.
    Prompts are left-padded; at most len(target) + 1 new tokens each (a longer completion is wrong anyway)."""
    was_training = model.training
    model.eval()
    right = 0
    try:
        for start in range(0, len(probe), batch_size):
            chunk = probe[start:start + batch_size]
            width = max(len(p) for p, _ in chunk)
            ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, (p, _) in enumerate(chunk):
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            new = max(len(t) for _, t in chunk) + 1
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                 pad_token_id=pad_token_id, eos_token_id=eos_token_id)[:, width:].tolist()
            for (_, target), completion in zip(chunk, out):
                if eos_token_id in completion:
                    completion = completion[:completion.index(eos_token_id)]
                right += completion == target
    finally:
        model.train(was_training)
    return right / len(probe)
