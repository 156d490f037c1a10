"""Models: loading causal LMs and tokenizers, the tiny built-in models, LoRA, log-probs and attention for training.

    tiny.py                character tokenizer + tiny Llama factory (no download)
    warm_start.py          builtin:tiny-4m-addition, the shipped warm start `make train` begins from; `make warm-start`
    warm_starts/           its folder: the 4M model warm-started on addition, bf16 weights (8 MB) + where it was made
    loading.py             load a causal LM / value model / tokenizer from a local folder; saved_state, the one
                           checkpoint reader
    gguf.py                model.path=file.gguf: dequantize once to a plain HF folder (extra gguf)
    spec.py                a model spec (folder, .gguf, builtin:, HF cache) -> a local folder: every setting naming
                           a model
    lora.py                LoRA via peft: adapters, merged weights for the rollout, merge for export
    logprobs.py            response log-probs and entropy: each prompt run once per group, bf16 autocast, chunked
    packed.py              a batch without padding: prompts once and responses' real tokens end to end in one sequence,
                           attention within each sequence's blocks (models on grouped attention)
    head_logprobs.py       the LM head in row chunks on the real response tokens: no [B, R, V] logits; the backward
                           reads the kept probabilities (<= 512 MB) or recomputes each chunk (Llama/Mistral/Qwen2/3;
                           other models take the logits path)
    topk.py                full-vocabulary log-probs of chosen ids: the teacher's top-k and the student's at them
    log_softmax.py         the sampler's log-softmax, summed in float64: torch's float32 one runs high over a wide
                           vocabulary (issue 51); batch invariant, so the exact mode's trainer takes it too
    attention.py           grouped-query attention as two batched matmuls, for the training forward on a CPU
                           (packed: within the layout's blocks) and float32 decoding there
"""
