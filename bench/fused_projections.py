"""Would wider products help the update pass? Fused q/k/v and gate/up against the stock HF modules.

Issue 35 item 1 names fusing each decoder layer's q/k/v projections (576 -> 576 + 192 + 192 on SmolLM2-135M) and
gate/up (576 -> 2 x 1,536) into one matrix product each as the next step for the real-model update. This script
measures what that buys before any of it is built into grpoflow: it loads an HF Llama-family folder, swaps the
modules for fused stand-ins (weights concatenated, the same arithmetic), checks that the response log-probs are
unchanged, and times one forward + backward of a token-mean loss over the last `--response` positions of a
`--batch` x `--tokens` batch, the variants alternating, `--repeats` rounds. Prints the median seconds per variant.

`--dtype bfloat16` runs each variant as grpoflow's actor computes with `model.compute_dtype=bfloat16` on a CPU
(training/precision.py: the policy's `copy` with grouped attention): float32 master weights, a bf16 compute copy
(`training.mixed_precision.ComputeCopy`: forward and backward in bf16, each gradient added into its master's float32
`.grad`), `models.attention`'s grouped-query attention kernel, and the head's log-probs from `head_log_probs` in row
chunks (`actor.logprob_chunk_size` 128). The fused modules are built on the masters, so the copy is fused as well.
The log-prob check (float32: within 1e-4 of the first variant's) then allows bf16 rounding: every variant's response
log-probs must lie within the difference that bf16 itself makes (the first variant's bf16 log-probs against its
float32 ones, max |difference|).

    .venv/bin/python bench/fused_projections.py --model /tmp/grpoflow-smollm2/hf --threads 2
    .venv/bin/python bench/fused_projections.py --model /tmp/grpoflow-smollm2/hf --threads 2 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.models.llama import modeling_llama

from grpoflow.models.attention import use_grouped_attention
from grpoflow.models.head_logprobs import head_log_probs
from grpoflow.training.mixed_precision import ComputeCopy

HEAD_CHUNK = 128  # actor.logprob_chunk_size's default
FLOAT32_TOLERANCE = 1e-4  # float32: the same products, at most summed in another order (measured: 0, bit-identical)


class FusedMLP(nn.Module):
    """gate_proj and up_proj as one [2I, D] product; down_proj and the activation as given."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_up = nn.Parameter(torch.cat([mlp.gate_proj.weight.data, mlp.up_proj.weight.data], 0))
        self.down_proj, self.act_fn = mlp.down_proj, mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class FusedAttention(nn.Module):
    """q/k/v as one [(H + 2 Hk) d, D] product; the rest as transformers' LlamaAttention (no KV cache: training)."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.config, self.layer_idx, self.head_dim = attn.config, attn.layer_idx, attn.head_dim
        self.scaling, self.attention_dropout, self.is_causal = attn.scaling, attn.attention_dropout, True
        self.num_key_value_groups = attn.num_key_value_groups
        self.split = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        self.qkv = nn.Parameter(torch.cat([attn.q_proj.weight.data, attn.k_proj.weight.data,
                                           attn.v_proj.weight.data], 0))
        self.o_proj = attn.o_proj

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in F.linear(hidden_states, self.qkv).split(self.split, -1))
        q, k = modeling_llama.apply_rotary_pos_emb(q, k, *position_embeddings)
        attend = modeling_llama.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                      modeling_llama.eager_attention_forward)
        out, weights = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


def load(path: str, variant: str) -> nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for layer in model.model.layers:
        if variant in ("mlp", "both"):
            layer.mlp = FusedMLP(layer.mlp)
        if variant in ("attention", "both"):
            layer.self_attn = FusedAttention(layer.self_attn)
    return model


def response_log_probs(model: nn.Module, ids: torch.Tensor, response: int) -> torch.Tensor:
    """[B, response] log-probs of the last `response` ids, the head run on those positions only. A bf16 model (the
    compute copy) takes them as grpoflow's actor does: `head_log_probs`, products in bf16, softmax in float32."""
    hidden = model.model(ids[:, :-1]).last_hidden_state[:, -response:]
    labels = ids[:, -response:]
    if model.lm_head.weight.dtype == torch.bfloat16:
        log_probs, _ = head_log_probs(hidden.reshape(-1, hidden.shape[-1]), model.lm_head.weight, labels.reshape(-1),
                                      chunk_size=HEAD_CHUNK, compute_dtype=torch.bfloat16)
        return log_probs.view(labels.shape)
    return model.lm_head(hidden).float().log_softmax(-1).gather(-1, labels[..., None]).squeeze(-1)


def compute_copy(master: nn.Module) -> ComputeCopy:
    """grpoflow's bf16 compute (precision.role_precision("policy", compute_dtype="bfloat16") on a CPU: how="copy",
    grouped attention): the masters stay float32, forward and backward run on the bf16 copy."""
    use_grouped_attention(master)  # before the copy: the copy's config is a deepcopy of the master's
    return ComputeCopy(master, torch.bfloat16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="an HF Llama-family folder (SmolLM2-135M-Instruct: NOTES.md)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=94, help="tokens per row, prompt and response")
    p.add_argument("--response", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default="none,mlp,attention,both")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype: float32 (the module as loaded) or bfloat16 (grpoflow's bf16 compute copy of "
                        "float32 masters, grouped attention; default float32)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ids = torch.randint(0, 49_000, (args.batch, args.tokens + 1), generator=torch.Generator().manual_seed(0))
    variants = args.variants.split(",")
    masters = {v: load(args.model, v) for v in variants}
    # what runs forward and backward; with bf16 its gradients land in the masters' float32 .grad (ComputeCopy)
    models = masters if args.dtype == "float32" else {v: compute_copy(m).compute for v, m in masters.items()}
    with torch.no_grad():
        ref = response_log_probs(models[variants[0]], ids, args.response)
        tol = FLOAT32_TOLERANCE
        if args.dtype == "bfloat16":  # what bf16 itself changes: the first variant's bf16 copy against its masters
            tol = (ref - response_log_probs(load(args.model, variants[0]), ids, args.response)).abs().max().item()
            print(f"{variants[0]} bf16 vs float32: max |log-prob difference| = {tol:.2e} (the tolerance below)")
        for v in variants[1:]:
            diff = (response_log_probs(models[v], ids, args.response) - ref).abs().max().item()
            print(f"{v}: max |log-prob - {variants[0]}| = {diff:.2e}")
            if diff > tol:
                raise SystemExit(f"{v}: its log-probs differ from {variants[0]}'s by {diff:.2e} > {tol:.2e} "
                                 f"({args.dtype}): not the same arithmetic")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.repeats + 1):           # round 0 warms up and is not counted
        for v in variants:
            masters[v].zero_grad(set_to_none=True)
            models[v].zero_grad(set_to_none=True)
            start = time.perf_counter()
            response_log_probs(models[v], ids, args.response).mean().backward()
            if r:
                times[v].append(time.perf_counter() - start)
    print(f"forward + backward, {args.dtype}, {args.batch} x {args.tokens} tokens, {args.threads} threads, median "
          f"of {args.repeats}:")
    for v in variants:
        print(f"  {v:10s} {statistics.median(times[v]):7.2f} s   ({', '.join(f'{t:.2f}' for t in times[v])})")


if __name__ == "__main__":
    main()
