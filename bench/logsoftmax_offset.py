"""The one-signed offset of a float32 log-softmax on a CPU (issue 51, docs/numerics.md "The sampler's log-softmax").

For each set of logits: the mean of log-prob minus its float64 value over every entry, for `torch.log_softmax`
in float32, `z - torch.logsumexp(z)` (a cascade sum, as the trainer's fused head) and
`models.log_softmax.accurate_log_softmax` (the sampler's). A model folder given as the first argument adds its
logits at each position of a short text (SmolLM2: /tmp/grpoflow-smollm2/hf). `--sampler` instead compares, on that
model, the Tinker server's sampler (Samplers.engine_for + generate_batch, 8 samples x 32 tokens after a 600-token
prompt) with the trainer's forward (training.forward_backward) on the same tokens, the base model and a LoRA one:
mean(sampler - trainer) is tinker-cookbook's `kl_sample_train_v1`, half the mean square its `_v2`.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/logsoftmax_offset.py [model folder] [--sampler]
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


def sampler_against_trainer(folder: str) -> None:
    """Print v1, v2, mean |diff| and the spread of the per-sample means of sampler - trainer, base and LoRA."""
    from tinker import types

    from grpoflow.engines.protocol import SamplingParams
    from grpoflow.engines.whole_batch import generate_batch
    from grpoflow.models.loading import load_tokenizer
    from grpoflow.tinker_server import training
    from grpoflow.tinker_server.futures import SeqGate
    from grpoflow.tinker_server.models import BaseModel, ModelSpec, TrainingModel
    from grpoflow.tinker_server.sampling import Samplers, Session, adapter_snapshot

    prompt = load_tokenizer(folder).encode(TEXT * 60)[:600]
    base = BaseModel(folder, folder)
    for lora in (False, True):
        tm = TrainingModel("s:train:0", base, ModelSpec(base_model=folder, lora_rank=8 if lora else None, seed=1),
                           SeqGate(lambda job: None))
        samplers, session = Samplers(keep_in_memory=1), Session("x", base, f"base:{folder}", None)
        if lora:
            with torch.no_grad():  # as if trained: adapters that move every adapted weight
                for name, p in tm.engine.model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.01, generator=torch.Generator().manual_seed(2))
            samplers.remember("mem:s:train:0:sampler:1", adapter_snapshot(tm.engine.model))  # type: ignore[arg-type]
            session = Session("x", base, "mem:s:train:0:sampler:1", None)
        engine, _ = samplers.engine_for(session)
        g = generate_batch(engine, [prompt], SamplingParams(n=8, max_new_tokens=32, temperature=1.0), seeds=[11])
        rows = [(g.response_ids[r][g.response_mask[r].bool()].tolist(), g.log_probs[r][g.response_mask[r].bool()])
                for r in range(8)]
        data = [types.Datum(model_input=types.ModelInput.from_ints((prompt + t)[:-1]),
                            loss_fn_inputs={"target_tokens": (prompt + t)[1:]}) for t, _ in rows]
        outs, _ = training.forward_backward(tm, data, "cross_entropy", {}, forward_only=True,
                                           microbatch_tokens=1 << 16)
        diffs = [lp.double() - torch.as_tensor(o["logprobs"][len(prompt) - 1:]).double()
                 for (_, lp), o in zip(rows, outs)]
        d, means = torch.cat(diffs), torch.stack([x.mean() for x in diffs])
        print(f"lora={lora}: {d.numel()} tokens, v1 {d.mean():+.2e} (+- {means.std() / len(means) ** 0.5:.1e} over "
              f"the samples), v2 {0.5 * (d ** 2).mean():.2e}, mean |diff| {d.abs().mean():.2e}, "
              f"max {d.abs().max():.1e}")


def main() -> None:
    torch.set_num_threads(1)
    if "--sampler" in sys.argv:
        sampler_against_trainer(sys.argv[1])
        return
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
