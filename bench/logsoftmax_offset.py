"""The one-signed offset of a float32 log-softmax on a CPU (issue 51, docs/numerics.md "The sampler's log-softmax").

For each set of logits: the mean of log-prob minus its float64 value over every entry, for `torch.log_softmax`
in float32, `z - torch.logsumexp(z)` (a cascade sum, as the trainer's fused head) and
`models.log_softmax.accurate_log_softmax` (the sampler's). A model folder given as the first argument adds its
logits at each position of a short text (SmolLM2: /tmp/grpoflow-smollm2/hf).

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/logsoftmax_offset.py [model folder]
"""

from __future__ import annotations

import sys

import torch

from grpoflow.models.log_softmax import accurate_log_softmax

TEXT = "The history of the city begins in the early medieval period, when a small settlement grew around the river. "


def offsets(z: torch.Tensor) -> list[float]:
    """Mean (log-prob - float64 log-prob) of the three log-softmaxes of z [N, V]."""
    exact = torch.log_softmax(z.double(), -1)
    return [(v.double() - exact).mean().item() for v in
            (torch.log_softmax(z, -1), z - torch.logsumexp(z, -1, keepdim=True), accurate_log_softmax(z))]


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    if len(sys.argv) > 1:
        from grpoflow.models.loading import load_causal_lm, load_tokenizer

        model, tokenizer = load_causal_lm(sys.argv[1]), load_tokenizer(sys.argv[1])
        with torch.no_grad():
            z = model(input_ids=torch.tensor([tokenizer.encode(TEXT * 3)])).logits[0].float()
        rows.append((f"{sys.argv[1]}: {z.shape[0]} positions x {z.shape[1]} tokens", z))
    g = torch.Generator().manual_seed(0)
    for vocab, scale in ((49152, 4), (16384, 4), (102, 1)):
        rows.append((f"randn x {scale}: 256 x {vocab}", torch.randn(256, vocab, generator=g) * scale))
    print("| logits | torch.log_softmax float32 | z - logsumexp(z) | accurate_log_softmax |")
    for name, z in rows:
        print(f"| {name} | " + " | ".join(f"{v:+.1e}" for v in offsets(z)) + " |")


if __name__ == "__main__":
    main()
