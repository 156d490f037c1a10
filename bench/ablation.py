"""What each speed-up of grpoflow's step buys, measured in one process on one step's worth of data.

    .venv/bin/python bench/ablation.py [--size 4m] [--group-size 8] [--max-new-tokens 16] [--repeats 10]
    .venv/bin/python bench/ablation.py --real-model /tmp/grpoflow-smollm2/hf --max-new-tokens 24 --repeats 3
    .venv/bin/python bench/ablation.py --model FOLDER    # any saved model (tests/integration/test_bench_scripts.py)

Uses the warm-started model that compare_trl.py caches in bench/.cache/tiny-<size>/ (run that
first), 8 prompts of the built-in task and `--group-size` samples each, and times:

- sampling: transformers `generate` (the engine before) against grpoflow's KV-cached loop
  (`engines.sampling`) with float32 weights (sdpa, and grouped attention as a CPU engine decodes now) and
  with bfloat16 weights, and with finished rows kept in the decode batch;
- the actor's update pass (log-probs, entropy, backward of a token-mean loss) on those samples:
  the full forward against shared prompts, each in float32 and under bf16 autocast, and packed
  (grouped attention) in float32;
- the optimizer step (grad-norm clip + AdamW on the model's parameters): torch's default
  (single-tensor on CPU), foreach and fused implementations.

With `--real-model FOLDER` (SmolLM2-135M-Instruct, see .ci/real_model_stage) it times, on 8 chat
prompts of `builtin:chat_addition` x `--group-size` samples, the update pass with the log-probs taken
from the full logits or from the fused head (`models/head_logprobs.py`), with torch's sdpa attention
or grouped attention (`models/attention.py`), in float32 and under bf16 autocast, with head chunks of
1,024 or 128 rows, in one micro-batch or in those of the default token budget, in float32 padded with
either attention and packed; sampling from the bf16
rollout copy and from float32 weights with either attention, and with finished rows dropped at every finish, at a
quarter of the batch (now) or never; and the optimizer implementations.

Variants alternate within each repeat, so load from other processes hits all of them; the
table shows each variant's fastest and median time (ms). The fastest is the better estimate of
what the code costs on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

CACHE = Path(__file__).resolve().parent / ".cache"


def generation_variants(path: Path, size_n: int, max_new_tokens: int):
    """name -> a function that samples one step's rollouts (8 prompts x n) with a fresh seed."""
    from grpoflow.engines.hf import HFRolloutEngine
    from grpoflow.engines.protocol import Generation, SamplingParams, eos_response_mask, left_pad
    from grpoflow.engines.whole_batch import generate_batch
    from grpoflow.models import attention
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    from grpoflow.tasks.addition import addition_splits

    tok = load_tokenizer(path)
    kw = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    rows = addition_splits()[0]
    params = SamplingParams(n=size_n, max_new_tokens=max_new_tokens)

    def hf_generate(model):
        @torch.no_grad()
        def run(prompts):
            ids, mask = left_pad(prompts, tok.pad_token_id)
            ids, mask = ids.repeat_interleave(size_n, 0), mask.repeat_interleave(size_n, 0)
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, temperature=1.0,
                                 max_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            response = out.sequences[:, ids.shape[1]:]
            mask_r = eos_response_mask(response, tok.eos_token_id)
            lp = torch.log_softmax(torch.stack(out.logits, 1).float(), -1).gather(-1, response[..., None])[..., 0]
            return Generation(ids, mask, response, mask_r, lp * mask_r, mask_r.all(-1))
        return run

    fp32 = HFRolloutEngine(load_causal_lm(path), **kw)
    grouped = HFRolloutEngine(attention.use_grouped_attention(load_causal_lm(path)), **kw)  # as hf_engine on a CPU
    bf16 = HFRolloutEngine(load_causal_lm(path, dtype=torch.bfloat16), **kw)
    kept = HFRolloutEngine(load_causal_lm(path), **kw, compact_fraction=10**6)  # finished rows' slots stay

    def keep_finished_rows(prompts):
        return generate_batch(kept, prompts, params)

    samplers = {"sampling: HF generate, fp32": hf_generate(load_causal_lm(path).eval()),
                "sampling: continuous batching, fp32, finished rows kept": keep_finished_rows,
                "sampling: continuous batching, fp32, sdpa": lambda prompts: generate_batch(fp32, prompts, params),
                "sampling: continuous batching, fp32, grouped attention (now on a CPU)":
                    lambda prompts: generate_batch(grouped, prompts, params),
                "sampling: continuous batching, bf16 weights": lambda prompts: generate_batch(bf16, prompts, params)}
    counter = iter(range(10**9))

    def with_fresh_prompts(sampler):
        def run():
            i = next(counter) % 50
            torch.manual_seed(i)
            return sampler([tok.encode(r["prompt"], add_special_tokens=False) for r in rows[8 * i:8 * i + 8]])
        return run

    return {name: with_fresh_prompts(fn) for name, fn in samplers.items()}, fp32


def update_variants(path: Path, sample, size_n: int, max_new_tokens: int):
    """name -> a function running the actor's forward + backward on one step's samples."""
    from grpoflow.data.batch import Batch
    from grpoflow.engines.protocol import SamplingParams
    from grpoflow.models import attention, logprobs
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    from grpoflow.tasks.addition import addition_splits

    tok = load_tokenizer(path)
    rows = addition_splits()[0]
    batches = []
    for i in range(4):
        torch.manual_seed(i)
        gen = sample([tok.encode(r["prompt"], add_special_tokens=False) for r in rows[8 * i:8 * i + 8]],
                     SamplingParams(n=size_n, max_new_tokens=max_new_tokens))
        batch = Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                      response_mask=gen.response_mask, group_ids=torch.arange(len(gen.response_ids)) // size_n)
        batches.append(batch.select(list(range(len(batch)))).trimmed())
    model = load_causal_lm(path).train()
    counter = iter(range(10**9))
    grouped = attention.register()

    def variant(share: bool, dtype: str | None, attn: str = "sdpa"):
        def run():
            model.set_attn_implementation(grouped if attn == "grouped" else "sdpa")
            b = batches[next(counter) % len(batches)]
            lp, _ = logprobs.response_log_probs(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                                with_entropy=True, compute_dtype=dtype, share_prompts=share)
            ((lp * b.response_mask).sum() / b.response_mask.sum()).backward()
            model.zero_grad(set_to_none=True)
        return run

    return {"update: full forward, fp32": variant(False, None),
            "update: shared prompts, fp32": variant(True, None),
            "update: packed (grouped attention), fp32": variant(True, None, "grouped"),
            "update: full forward, bf16 autocast": variant(False, "bfloat16"),
            "update: shared prompts, bf16 autocast": variant(True, "bfloat16")}


def real_model_variants(path: Path, size_n: int, max_new_tokens: int):
    """name -> a function: the update pass and sampling on SmolLM2 with each real-model speed-up on or off."""
    from grpoflow.data.dataset import prepare_prompts
    from grpoflow.models import attention, logprobs
    from grpoflow.models.loading import load_causal_lm, load_tokenizer
    from grpoflow.engines.hf import HFRolloutEngine
    from grpoflow.engines.protocol import SamplingParams
    from grpoflow.engines.whole_batch import generate_batch
    from grpoflow.tasks.chat_addition import chat_addition_splits
    from grpoflow.training.microbatch import plan_microbatches
    from grpoflow.training.bf16_units import cpu_has_bf16_units
    from grpoflow.training.mixed_precision import ComputeCopy

    tok = load_tokenizer(path)
    prompts = [item.prompt_ids for item in prepare_prompts(chat_addition_splits()[0][:8], tok)[0]]
    params = SamplingParams(n=size_n, max_new_tokens=max_new_tokens)
    engine = HFRolloutEngine(load_causal_lm(path, dtype=torch.bfloat16), pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
    fp32_engine = HFRolloutEngine(load_causal_lm(path), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    seeds = list(range(len(prompts)))
    # the step's samples, from the bf16 rollout copy as a bf16 run samples; from float32 weights where the CPU has
    # no bf16 units (a run there samples in float32, and emulated bf16 products run at about 1 GFLOP/s: minutes)
    gen = generate_batch(fp32_engine if cpu_has_bf16_units() is False else engine, prompts, params, seeds=seeds)
    model = load_causal_lm(path).train()
    grouped = attention.register()
    # the micro-batches that the default token budget (4,096 padded tokens) makes of this step
    two = plan_microbatches(gen.prompt_mask.sum(-1).tolist(), gen.response_mask.sum(-1).tolist(), 4096)

    def update(fused: bool, attn: str, dtype: str | None, chunk: int = 128, plans=None, packed: bool = True):
        def run():
            model.set_attn_implementation(grouped if attn == "grouped" else "sdpa")
            for rows in plans or [list(range(len(gen.response_ids)))]:
                idx = torch.tensor(rows)
                mask = gen.response_mask[idx]
                lp, _ = logprobs.response_log_probs(model, gen.prompt_ids[idx], gen.prompt_mask[idx],
                                                    gen.response_ids[idx], mask, with_entropy=True,
                                                    compute_dtype=dtype, chunk_size=chunk, fused=fused, packed=packed)
                ((lp * mask).sum() / gen.response_mask.sum()).backward()
            model.zero_grad(set_to_none=True)
        return run

    copy = ComputeCopy(model, torch.bfloat16)
    copy.compute.set_attn_implementation(grouped)

    def update_on_copy(packed: bool = True, keep_probs: bool = True):
        """The update pass on the bf16 compute copy (training.mixed_precision): the masters cast into it (as after
        every optimizer step), forward and backward in bf16, gradients added into the float32 masters, the head in
        the actor's 128-row chunks; `packed` (models/packed.py) and `keep_probs` (the head's kept probabilities)
        on or off."""
        def run():
            copy.mark_stale()
            m = copy.refresh()
            lp, _ = logprobs.response_log_probs(m, gen.prompt_ids, gen.prompt_mask, gen.response_ids,
                                                gen.response_mask, with_entropy=True, compute_dtype="bfloat16",
                                                chunk_size=128, packed=packed, keep_probs=keep_probs)
            ((lp * gen.response_mask).sum() / gen.response_mask.sum()).backward()
            model.zero_grad(set_to_none=True)
        return run

    def sampling(attn: str, on=engine):
        def run():
            on.model.set_attn_implementation(grouped if attn == "grouped" else "sdpa")
            generate_batch(on, prompts, params, seeds=seeds)
            on.model.set_attn_implementation("sdpa")
        return run

    def sampling_compacting(fraction: int):
        """Continuous batching with finished rows' slots compacted away at every finish (1), at a quarter (4, now)
        or never (10**6): an engine of its own over the same bf16 weights."""
        other = HFRolloutEngine(engine.model, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                compact_fraction=fraction)

        def run():
            generate_batch(other, prompts, params, seeds=seeds)
        return run

    return {"update: logits path, sdpa, fp32": update(False, "sdpa", None, chunk=1024),
            "update: fused head, sdpa, fp32": update(True, "sdpa", None, chunk=1024),
            "update: logits path, sdpa, bf16 autocast": update(False, "sdpa", "bfloat16", chunk=1024),
            "update: fused head, sdpa, bf16 autocast": update(True, "sdpa", "bfloat16", chunk=1024),
            "update: fused head, grouped attention, bf16 autocast, chunk 1024": update(True, "grouped", "bfloat16",
                                                                                       chunk=1024),
            "update: fused head, grouped attention, bf16 autocast, chunk 128 (now)": update(True, "grouped",
                                                                                            "bfloat16"),
            f"update: as now, in the {len(two)} micro-batches of a 4,096-token budget": update(
                True, "grouped", "bfloat16", plans=two),
            "update: fp32, padded, sdpa (before 2026-12-04 without bf16 compute)": update(True, "sdpa", None),
            "update: fp32, padded, grouped attention": update(True, "grouped", None, packed=False),
            "update: fp32, packed, grouped attention (now without bf16 compute)": update(True, "grouped", None),
            "update: bf16 compute copy, padded, head logits recomputed (before)": update_on_copy(False, False),
            "update: bf16 compute copy, packed responses": update_on_copy(True, False),
            "update: bf16 compute copy, head probabilities kept": update_on_copy(False, True),
            "update: bf16 compute copy, packed, head probabilities kept (now)": update_on_copy(),
            "sampling: bf16 weights, sdpa (now)": sampling("sdpa"),
            "sampling: bf16 weights, grouped attention": sampling("grouped"),
            "sampling: fp32 weights, sdpa": sampling("sdpa", fp32_engine),
            "sampling: fp32 weights, grouped attention (now on a CPU)": sampling("grouped", fp32_engine),
            "sampling: finished rows compacted at every finish": sampling_compacting(1),
            "sampling: finished rows kept": sampling_compacting(10**6),
            **optimizer_variants(path)}


def optimizer_variants(path: Path):
    from grpoflow.models.loading import load_causal_lm

    params = list(load_causal_lm(path).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3

    def variant(**kw):
        opt = torch.optim.AdamW(params, lr=1e-6, **kw)

        def run():
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        return run

    return {"optimizer: AdamW default (CPU: single-tensor)": variant(),
            "optimizer: AdamW foreach": variant(foreach=True), "optimizer: AdamW fused": variant(fused=True)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="4m")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--base", action="store_true",
                   help="the untrained base model (responses fill the budget) instead of the warm start")
    p.add_argument("--real-model", default=None, metavar="FOLDER",
                   help="SmolLM2-135M-Instruct's HF folder: time this work's real-model speed-ups instead")
    p.add_argument("--model", default=None, metavar="FOLDER",
                   help="a model folder to time instead of the cached tiny-<size> warm start")
    p.add_argument("--only", type=lambda v: v.split(","), default=None, metavar="TEXT,...",
                   help="time only the variants whose name contains one of these texts")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="after timing, run each variant once under torch.profiler and print its ROWS costliest ops")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.real_model:
        variants = real_model_variants(Path(args.real_model), args.group_size, args.max_new_tokens)
        return time_variants(chosen(variants, args.only),
                             f"SmolLM2-135M-Instruct, 8 chat prompts x {args.group_size} samples, <= "
                             f"{args.max_new_tokens} new tokens, {args.threads} threads, {args.repeats} repeats",
                             args.repeats, args.profile)
    warm = CACHE / f"tiny-{args.size}" / ("base_model" if args.base else "sft_model")
    path = Path(args.model) if args.model else warm
    if not path.is_dir():
        sys.exit(f"{path} is missing: run bench/compare_trl.py --sizes {args.size} once to build and warm-start it.")
    from grpoflow.engines.whole_batch import generate_batch

    gen, engine = generation_variants(path, args.group_size, args.max_new_tokens)
    variants = {**gen, **update_variants(path, partial(generate_batch, engine), args.group_size,
                                         args.max_new_tokens),
                **optimizer_variants(path)}
    title = (f"{args.size}{' base' if args.base else ''}, 8 prompts x {args.group_size} samples, <= "
             f"{args.max_new_tokens} new tokens, {args.threads} threads, {args.repeats} repeats")
    time_variants(chosen(variants, args.only), title, args.repeats, args.profile)


def chosen(variants: dict, only: list[str] | None) -> dict:
    """The variants whose name contains one of the `only` texts (all without `--only`)."""
    picked = {name: fn for name, fn in variants.items() if only is None or any(t in name for t in only)}
    if not picked:
        sys.exit(f"--only {','.join(only or [])} matches none of: {'; '.join(variants)}")
    return picked


def time_variants(variants: dict, title: str, repeats: int, profile_rows: int = 0) -> None:
    """Run every variant once (warm-up), then `repeats` rounds of all of them in turn; print fastest and median;
    with `profile_rows`, then each variant's costliest ops of one more call (torch.profiler)."""
    for fn in variants.values():  # warm-up: first-call allocations, lazy inits
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    print(title)
    print("| variant | fastest ms | median ms |\n|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {min(ts) * 1e3:.1f} | {statistics.median(ts) * 1e3:.1f} |")
    for name, fn in variants.items() if profile_rows else ():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        print(f"\n{name}: the {profile_rows} ops of most self CPU time (one call, torch.profiler)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile_rows))


if __name__ == "__main__":
    main()
