"""Engines: turning prompt token ids into sampled responses with their log-probs.

`protocol` (the `RolloutEngine` seam, the `EngineAbilities` each engine declares, `SamplingParams`,
`Generation`), `hf` (the own KV-cached loop over a transformers model, `sampling` + `random_streams`),
`vllm` and `sglang` (inference libraries behind the same protocol, sharing `external`), `batcher` and
`whole_batch` (rollouts and whole-batch generation, both through the engine's one sampling path), and
`factory` (engines by name).
Nothing here imports `grpoflow.training`: the two meet only in the workers.

    protocol.py            the engine protocols: EngineAbilities (stepping, pausing, sleeping: declared, never
                           probed), RolloutEngine, StepEngine / BatchEngine, SamplingParams, Request / Completion,
                           Generation, padding
    batcher.py             RequestBatcher: every trajectory awaits generate(request); the engine runs in ticks,
                           admission set by token counts (rollout.deterministic), not by the clock; pause()
                           (rollout.partial, engines that declare pausing)
    whole_batch.py         generate_batch: whole-batch generation stepped through an engine's one sampling path
                           (the judge, the Tinker sampler); stepper; BatchCalls (SGLang: one whole-batch call per tick)
    continuous.py          the HF engine's continuous batching: requests join and leave the decode batch, a
                           prompt's n samples prefilled once, a trajectory's KV parked for its next turn;
                           requests wait in order while their KV would not fit the budget
    slots.py               SlotCache: per-layer KV buffers whose rows write at their own columns, 4D masks
    kv_budget.py           the HF engine's KV budget (rollout.kv_cache_mb; 0: from the device's memory), bytes per token
    hf.py                  the transformers engine (steps, pauses, sleeps; weight sync one tensor at a time)
    hf_adapter.py          the transformers engine serving LoRA adapters unmerged (rollout.lora_sync=adapter)
    pushed_weights.py      feeds an engine's weight stream from buckets pushed one call at a time (split placement)
    sampling.py            drawing a token: temperature, top-p, inverse-CDF draws, the full-distribution log-prob
    random_streams.py      per-sample counter-based random streams: samples do not depend on batching or placement
    vllm.py, sglang.py     vLLM / SGLang engines in the worker's process (extras vllm, sglang; imported when chosen)
    vllm_steps.py          vLLM's per-request LLMEngine as the batcher's StepEngine: add_request per admitted request,
                           one engine step per tick, per-request seeds, prefix-cache hits across turns, pause by abort
    external.py            what the library engines share: packing their samples, bucketed weight sync with a deadline
    factory.py             engines by name (`rollout.engine`): the registry, build_engine, the check of what an
                           engine declares (checked_engine)
"""
