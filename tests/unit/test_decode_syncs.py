"""A decode step of the HF engine's continuous sampler waits on the host at most once (engines/decode_state.py).

On a GPU every point where the host needs a tensor's value, or hands the device a tensor built from Python values,
makes the host wait for the device (a pageable host-to-device copy synchronises the stream too). The profiler names
each such point whatever the device, so counting them on a CPU counts what would stall a GPU:

    aten::_local_scalar_dense   a tensor read as a Python number: .item(), int(t), bool(t), `if t.any():`
    aten::lift_fresh            a tensor built from Python values: torch.tensor(list), t[list]
    aten::resolve_neg           a tensor read as a Python list: .tolist(), .numpy()

A decode step may have one: the ids (and log-probs, in the same copy) that tell the host which rows ended.
"""

from collections import Counter

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from grpoflow.engines.continuous import ContinuousSampler
from grpoflow.engines.protocol import Request
from grpoflow.models.attention import use_grouped_attention
from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model

HOST_WAITS = ("aten::_local_scalar_dense", "aten::lift_fresh", "aten::resolve_neg")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOK = build_char_tokenizer()


def host_waits(fn):
    """(what `fn()` returned, the count of each host wait it made)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, Counter(e.name for e in prof.events() if e.name in HOST_WAITS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attention", ["sdpa", "grouped"])
def test_a_decode_step_waits_on_the_host_at_most_once(device, attention):
    model = build_tiny_model(TOK, size="0.5m").eval().to(device)
    if attention == "grouped":
        use_grouped_attention(model)
    # compact_fraction 0: finished rows' slots stay (compacting is an event like admission, with its own copy)
    sampler = ContinuousSampler(model, pad_token_id=TOK.pad_token_id, compact_fraction=0)
    kinds = [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)]  # rows of three sampling kinds share the steps
    digits = tuple(TOK.encode("0123456789", add_special_tokens=False))
    sampler.admit([(i, Request(tuple(TOK.encode(f"{i}+{7 * i}=", add_special_tokens=False)), 3 + i, stream=i,
                               temperature=kinds[i % 3][0], top_p=kinds[i % 3][1],
                               stop_token_ids=digits if i % 2 else ()))
                   for i in range(9)])
    per_step, ended = [], []
    while sampler.busy:
        finished, waits = host_waits(lambda: sampler.tick(0))
        per_step.append(waits)
        ended.append(len(finished))
    assert sum(ended) == 9 and sum(1 for n in ended if n) >= 3  # rows ended at several steps, not all at once
    for step, waits in enumerate(per_step):  # exactly one: the ids' copy, seen (so the count is not blind)
        assert sum(waits.values()) == 1, f"decode step {step} waits on the host {sum(waits.values())} times: {waits}"
