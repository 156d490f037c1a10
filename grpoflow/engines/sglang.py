"""The SGLang rollout engine: `sglang.Engine` (the offline API) behind the `RolloutEngine` protocol.

The engine runs its scheduler in subprocesses (one per tensor-parallel rank). Prompts go in as
token ids (`skip_tokenizer_init=True`), samples come back with the log-prob of each sampled
token; SGLang reports them after temperature scaling (the sampling distribution) unless
`SGLANG_RETURN_ORIGINAL_LOGPROB` is set, which is refused here.

Weight sync: `update_weights_from_tensor` per bucket (each TP rank receives a handle to the same
tensors and loads its shard), the radix cache flushed once at the end. Memory (GPU,
rollout.free_cache_engine, which starts the engine with `enable_memory_saver`): `sleep()`
releases weights and KV cache; a sync while asleep resumes the weights, loads, then resumes the
KV cache.

Abilities: it declares no stepping (its scheduler runs on its own clock and offers no step to call), so it is
served by whole-batch calls (`whole_batch.BatchCalls`) and cannot pause; it declares sleeping with
rollout.free_cache_engine.
"""

from __future__ import annotations

import os
from typing import Iterable

import torch
from torch import Tensor

from grpoflow.errors import UserError
from grpoflow.engines.external import import_engine, pack_samples, weight_buckets
from grpoflow.engines.protocol import EngineAbilities, Generation, SamplingParams, stop_ids

INSTALL_HINT = "rollout.engine=sglang needs SGLang and a GPU: pip install 'grpoflow[sglang]' (docs/rollout-engines.md)."


class SGLangRolloutEngine:
    """Sampling with SGLang; weights arrive from the actor one tensor at a time, versioned."""

    name = "sglang"

    def __init__(self, model_path: str, *, pad_token_id: int, eos_token_id: int | list[int], dtype: str = "float32",
                 seed: int = 0, gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                 enforce_eager: bool = True, free_cache_engine: bool = True, sync_timeout_s: float = 120.0,
                 bucket_bytes: int = 256 << 20) -> None:
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true", "yes"):
            raise UserError("SGLANG_RETURN_ORIGINAL_LOGPROB is set, so SGLang would report log-probs before "
                            "temperature, not those of the sampling distribution; unset it.")
        sglang = import_engine("sglang", INSTALL_HINT)
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.sync_timeout_s, self.bucket_bytes = sync_timeout_s, bucket_bytes
        self.version = 0
        self._memory_saver = free_cache_engine
        self.abilities = EngineAbilities(stepping=False, sleeping=free_cache_engine)
        self._asleep = False
        self._broken: str | None = None
        self._device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.engine = sglang.Engine(
            model_path=model_path, skip_tokenizer_init=True, dtype=dtype, random_seed=seed,
            mem_fraction_static=gpu_memory_utilization, tp_size=tensor_parallel_size,
            disable_cuda_graph=enforce_eager, enable_memory_saver=free_cache_engine, log_level="error")

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
                 ) -> Generation:
        """`seeds` is accepted for the protocol; SGLang samples with its own generator, so its samples
        depend on the batch (unlike the hf and vllm engines)."""
        self._check_usable()
        if self._asleep:
            self.wake()
        eos = stop_ids(self.eos_token_id, params)
        greedy = params.temperature <= 0
        sampling = {"max_new_tokens": params.max_new_tokens, "temperature": 0.0 if greedy else params.temperature,
                    "top_p": 1.0 if greedy else params.top_p, "stop_token_ids": eos}
        # n copies of each prompt, prompt-major; the radix cache computes each prompt's KV once.
        input_ids = [list(p) for p in prompts for _ in range(params.n)]
        outputs = self.engine.generate(input_ids=input_ids, sampling_params=sampling, return_logprob=True)
        responses, log_probs = samples_from_sglang(outputs)
        return pack_samples(prompts, params.n, responses, log_probs, pad_token_id=self.pad_token_id,
                            eos_token_id=eos)

    def end_rollout(self) -> None:
        """Nothing to drop: each whole-batch call is over when it returns."""

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Send the actor's weights (HF names) bucket by bucket within `sync_timeout_s`, then flush the
        radix cache, whose KV came from the old weights."""
        self._check_usable()
        if self._asleep:
            self.engine.resume_memory_occupation(tags=["weights"])
        sent = 0
        try:
            for bucket in weight_buckets(named_tensors, engine=self.name, timeout_s=self.sync_timeout_s,
                                         version=version, bucket_bytes=self.bucket_bytes):
                if self._device is not None:
                    bucket = [(name, t.to(self._device, non_blocking=True)) for name, t in bucket]
                sent += 1
                check_sglang_result(self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False),
                                    f"update_weights_from_tensor (version {version})")
        except BaseException as e:
            if sent:  # some buckets may be in: the model mixes two versions
                self._broken = f"the weight sync to version {version} failed ({type(e).__name__})"
            raise
        self.engine.flush_cache()
        if self._asleep:
            self.engine.resume_memory_occupation(tags=["kv_cache"])
            self._asleep = False
        self.version = version

    def sleep(self) -> None:
        """With rollout.free_cache_engine: release weights and KV cache until the next sync or wake()."""
        if self._memory_saver and not self._asleep:
            self.engine.release_memory_occupation(tags=["kv_cache", "weights"])
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self.engine.resume_memory_occupation(tags=["weights"])
            self.engine.resume_memory_occupation(tags=["kv_cache"])
            self._asleep = False

    def _check_usable(self) -> None:
        if self._broken:
            raise RuntimeError(f"rollout engine 'sglang' cannot be used: {self._broken}, leaving its model with a "
                               "partial update; rebuild the engine (restart the run from its last checkpoint).")


def samples_from_sglang(outputs: dict | list[dict]) -> tuple[list[list[int]], list[list[float]]]:
    """Token ids and log-probs per sample from `Engine.generate(..., return_logprob=True)`.

    Each output is a dict whose `meta_info["output_token_logprobs"]` lists one `(logprob, token_id,
    text_or_None)` per generated token, the stop token included; tokens are read from there, so that
    each comes with its own log-prob.
    """
    outputs = [outputs] if isinstance(outputs, dict) else outputs
    responses, log_probs = [], []
    for k, out in enumerate(outputs):
        entries = out.get("meta_info", {}).get("output_token_logprobs")
        if entries is None:
            raise RuntimeError(f"SGLang output {k} has no meta_info.output_token_logprobs; generate() must be "
                               "called with return_logprob=True.")
        responses.append([int(e[1]) for e in entries])
        log_probs.append([float(e[0]) for e in entries])
    return responses, log_probs


def check_sglang_result(result: object, what: str) -> None:
    """SGLang's control calls answer `(success, message)` (or an object with those fields); raise on failure."""
    if isinstance(result, tuple) and result and isinstance(result[0], bool):
        ok, message = result[0], result[1] if len(result) > 1 else ""
    else:
        ok, message = getattr(result, "success", True), getattr(result, "message", "")
    if not ok:
        raise RuntimeError(f"rollout engine 'sglang': {what} failed: {message}")
