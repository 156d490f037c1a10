"""Engines: turning prompt token ids into sampled responses with their log-probs.

`protocol` (the `RolloutEngine` seam, the `EngineAbilities` each engine declares, `SamplingParams`,
`Generation`), `hf` (the own KV-cached loop over a transformers model, `sampling` + `random_streams`),
`vllm` and `sglang` (inference libraries behind the same protocol, sharing `external`), `batcher` and
`whole_batch` (rollouts and whole-batch generation, both through the engine's one sampling path), and
`factory` (engines by name).
Nothing here imports `grpoflow.training`: the two meet only in the workers.
"""
