"""The rollout engine protocol: what an engine declares it can do, its two ways of sampling, the requests and
`Generation`s that go in and out, padding helpers.

An engine holds its own copy of the weights (possibly in another dtype or on another device), receives the
actor's weights one tensor at a time with a version, and declares its abilities (`EngineAbilities`) instead of
being probed for them. It samples in one of two ways, which its `abilities.stepping` names:

    stepping (SteppingEngine)   requests join and leave a running decode batch: `admit`, `tick`, `busy`
                                (the HF engine's continuous sampler, vLLM's per-request engine)
    whole batch (BatchEngine)   `generate` decodes a batch of prompts per call (SGLang, whose scheduler runs
                                on its own clock); `whole_batch.BatchCalls` serves it as a stepping engine

Every caller samples through a stepping engine (`whole_batch.stepper`): rollouts through the request batcher,
whole-batch work (the judge, the Tinker sampler) through `whole_batch.generate_batch`, so each engine has one
sampling path and one seeding scheme (each request's own stream, `Request.stream`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass(frozen=True)
class EngineAbilities:
    """What an engine can do, declared by the engine (callers branch on it, never on `hasattr`).

    stepping: requests join and leave a running decode batch (`SteppingEngine`: `busy`, `admit`, `tick`); False:
        the engine decodes whole batches (`BatchEngine.generate`), served one call per batcher tick.
    pausing: `pause()` stops every running request at a token boundary and hands back what each sampled
        (rollout.partial); needs stepping.
    sleeping: `sleep()` frees the engine's memory while a colocated actor trains (the controller calls it only
        then); False: `sleep` and `wake` are no-ops the controller skips.
    """
    stepping: bool
    pausing: bool = False
    sleeping: bool = False

    def __post_init__(self) -> None:
        if self.pausing and not self.stepping:
            raise ValueError("EngineAbilities(pausing=True) needs stepping=True: only requests in a running decode "
                             "batch can stop at a token boundary.")


@dataclass
class SamplingParams:
    n: int = 1
    max_new_tokens: int = 16
    temperature: float = 1.0   # 0 means greedy
    top_p: float = 1.0
    # Token ids that also end a sample, besides the tokenizer's EOS (multi-turn: the chat template's
    # end-of-turn token, e.g. <|im_end|> when EOS is <|endoftext|>). Kept in the response, like EOS.
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class Generation:
    """n samples per prompt, prompt-major (sample j of prompt i is row i * n + j)."""
    prompt_ids: Tensor        # [B*n, P] left-padded
    prompt_mask: Tensor       # [B*n, P]
    response_ids: Tensor      # [B*n, R] right-padded with pad_token_id after EOS
    response_mask: Tensor     # [B*n, R] 1 up to and including the first EOS
    log_probs: Tensor         # [B*n, R] float32 log-probs under the sampling distribution (0 on padding; top-p:
                              # the nucleus, renormalised)
    truncated: Tensor         # [B*n] bool, stopped by max_new_tokens before any EOS
    floors: Tensor | None = None  # [B*n, R] float32 each token's top-p nucleus floor (models/nucleus.py), if recorded


@dataclass(frozen=True)
class Request:
    """One sample of one prompt: what a trajectory asks of the request batcher (`engines.batcher`).

    `stream` seeds this request's random stream (`random_streams.uniforms`), so its tokens do not depend
    on the requests it shares a decode batch with; its first new token draws at stream position `position`
    (0, or a paused sample's tokens so far: continued later, it draws on where it stopped, rollout.partial).
    `key` names the trajectory it belongs to: a later request with the same key whose prompt starts with this
    one's ids reuses their KV cache (engines that keep one).
    """
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stream: int
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    key: int | None = None
    position: int = 0


@dataclass
class Completion:
    """What a `Request` sampled: the ids (up to and including a stop id), their log-probs under the sampling
    distribution (with top_p < 1: the nucleus, renormalised), the weight version that sampled each, and why it
    ended ("stop" or "length"; "paused": the rollout stopped it at a token boundary, `RequestBatcher.pause`, and a
    later request may continue it)."""
    ids: list[int]
    log_probs: list[float]
    versions: list[int]
    finish: str
    prefilled: int = 0  # prompt tokens this request computed (the rest came from a reused or shared KV cache)
    reused: int = 0     # prompt tokens whose KV came from its trajectory's earlier turn (parked by the HF engine)
    evicted: int = 0    # other trajectories' parked KV caches that parking this request's pushed out (HF engine)
    # each token's nucleus floor (models/nucleus.py), from engines that record it (HF); [] from the others
    floors: list[float] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.finish == "length"


@runtime_checkable
class RolloutEngine(Protocol):
    """What every engine has, whichever way it samples (`abilities.stepping`): the worker drives these."""
    abilities: EngineAbilities
    version: int
    pad_token_id: int
    eos_token_id: int | list[int]

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None: ...

    def sleep(self) -> None:
        """Free memory while a colocated actor trains (where `abilities.sleeping`)."""
        ...

    def wake(self) -> None: ...

    def end_rollout(self) -> None:
        """A rollout is over (finished, failed or cancelled): drop what it left (parked KV, running requests)."""
        ...


@runtime_checkable
class StepEngine(Protocol):
    """Requests that join and leave a running decode batch: what the request batcher drives (engines/batcher.py)."""

    @property
    def busy(self) -> bool: ...

    def admit(self, requests: list[tuple[int, Request]]) -> None: ...

    def tick(self, version: int) -> list[tuple[int, Completion]]:
        """One decode step of every running request; returns (request id, completion) of those that finished."""
        ...

    def pause(self) -> list[tuple[int, Completion]]:
        """Every running request stopped at a token boundary, finish "paused" (called only where the engine declares
        `abilities.pausing`)."""
        ...


@runtime_checkable
class SteppingEngine(RolloutEngine, StepEngine, Protocol):
    """An engine that declares `abilities.stepping`."""


@runtime_checkable
class BatchEngine(RolloutEngine, Protocol):
    """An engine that decodes whole batches (`abilities.stepping` False)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
                 ) -> Generation:
        """`params.n` samples per prompt, prompt-major; `seeds` one per prompt (`BatchCalls` sends n=1 prompts,
        each with its request's stream). Engines whose samples depend on the batch whatever the seed (SGLang) say
        so."""
        ...


def stop_ids(eos_token_id: int | list[int], params: SamplingParams) -> list[int]:
    """The ids that end a sample: the EOS id(s), then `params.stop_token_ids` not already among them."""
    ids = list(eos_token_id) if isinstance(eos_token_id, list) else [eos_token_id]
    return ids + [t for t in params.stop_token_ids if t not in ids]


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """[B, P] ids and mask, left-padded to the longest sequence."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def eos_response_mask(response_ids: Tensor, eos_token_id: int | list[int]) -> Tensor:
    """[B, R] 1 on tokens up to and including the first EOS of each row, 0 after."""
    eos_ids = torch.as_tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    is_eos = torch.isin(response_ids, eos_ids).long()
    seen_before = is_eos.cumsum(-1) - is_eos
    return (seen_before == 0).long()
