"""Whole-batch generation over a stepping engine, and the adapter that makes a whole-batch engine step.

Every engine samples through a `StepEngine` (engines/protocol.py): `stepper(engine)` is the engine itself where it
declares `abilities.stepping` (the HF engine, vLLM), else `BatchCalls(engine)`, which serves the requests admitted
at one tick as one whole-batch `generate` call (SGLang, a user engine without steps).

`generate_batch(engine, prompts, params, seeds)` is the one whole-batch generation: n requests per prompt, each
with its own stream (`random_streams.row_seeds` of the prompt's seed: the streams a single-turn rollout gives
prompt i with seed `prompt_seeds(seed, [i])`), admitted together and stepped until every one has finished, packed
as a `Generation`. The judge, the Tinker sampler and the tests call it, so an engine samples the same way for them
as for rollouts (the request batcher), with one seeding scheme.
"""

from __future__ import annotations

from typing import cast

import torch

from grpoflow.engines.external import pack_samples
from grpoflow.engines.protocol import (BatchEngine, Completion, Generation, Request, RolloutEngine, SamplingParams,
                                       StepEngine, SteppingEngine, stop_ids)
from grpoflow.engines.random_streams import row_seeds


def stepper(engine: RolloutEngine) -> StepEngine:
    """The engine as a `StepEngine`, by its declaration: itself (`abilities.stepping`), else `BatchCalls` over it."""
    if engine.abilities.stepping:
        return cast(SteppingEngine, engine)
    return BatchCalls(cast(BatchEngine, engine))


def run_to_end(steps: StepEngine, requests: list[tuple[int, Request]], version: int) -> dict[int, Completion]:
    """Admit every (request id, request) at once and step until none runs: each request's completion by id."""
    done: dict[int, Completion] = {}
    steps.admit(requests)
    while steps.busy:
        done.update(steps.tick(version))
    return done


def generate_batch(engine: RolloutEngine, prompts: list[list[int]], params: SamplingParams,
                   seeds: list[int] | None = None) -> Generation:
    """`params.n` samples of each of B prompts as a `Generation` ([B*n, ...], prompt-major: sample j of prompt i is
    row i * n + j), through the engine's one sampling path.

    seeds: [B] one per prompt; sample j of prompt i draws from stream `row_seeds(seeds, n)[i * n + j]`, so a
    prompt's samples do not depend on the batch it is in. None: the B seeds come from torch's global generator.
    The samples stop at the engine's EOS ids and `params.stop_token_ids`.
    """
    if seeds is None:
        seeds = torch.randint(0, 1 << 32, (len(prompts),), dtype=torch.long).tolist()
    if len(seeds) != len(prompts):
        raise ValueError(f"generate_batch: {len(prompts)} prompts need {len(prompts)} seeds, got {len(seeds)}.")
    streams = row_seeds(torch.tensor(seeds, dtype=torch.long), params.n).tolist()
    stops = stop_ids(engine.eos_token_id, params)
    requests = [(r, Request(tuple(prompts[r // params.n]), params.max_new_tokens, streams[r],
                            tuple(params.stop_token_ids), params.temperature, params.top_p))
                for r in range(len(streams))]
    done = run_to_end(stepper(engine), requests, engine.version)
    return pack_samples(prompts, params.n, [done[r].ids for r in range(len(streams))],
                        [done[r].log_probs for r in range(len(streams))], pad_token_id=engine.pad_token_id,
                        eos_token_id=stops, floors=[done[r].floors for r in range(len(streams))])


class BatchCalls:
    """A `StepEngine` over an engine whose `generate` decodes a whole batch per call (SGLang, a user engine that
    declares no stepping): the requests admitted at one tick are one call, n=1 each, with their own seeds. It cannot
    pause (`abilities.pausing` is False for such an engine: the request batcher refuses before calling `pause`)."""

    def __init__(self, engine: BatchEngine) -> None:
        self.engine = engine
        self.admitted: list[tuple[int, Request]] = []
        self.prefilled_tokens = 0

    @property
    def busy(self) -> bool:
        return bool(self.admitted)

    def admit(self, requests: list[tuple[int, Request]]) -> None:
        self.admitted += requests

    def tick(self, version: int) -> list[tuple[int, Completion]]:
        admitted, self.admitted = self.admitted, []
        out: list[tuple[int, Completion]] = []
        eos = stop_ids(self.engine.eos_token_id, SamplingParams())
        kinds = sorted({(q.temperature, q.top_p, q.stop_token_ids) for _, q in admitted})
        for temperature, top_p, stops in kinds:
            group = [(rid, q) for rid, q in admitted if (q.temperature, q.top_p, q.stop_token_ids)
                     == (temperature, top_p, stops)]
            params = SamplingParams(n=1, max_new_tokens=max(q.max_new_tokens for _, q in group),
                                    temperature=temperature, top_p=top_p, stop_token_ids=stops)
            gen = self.engine.generate([list(q.prompt_ids) for _, q in group], params,
                                       seeds=[q.stream for _, q in group])
            for row, (rid, q) in enumerate(group):
                length = min(int(gen.response_mask[row].sum()), q.max_new_tokens)
                ids = gen.response_ids[row, :length].tolist()
                stopped = bool(ids) and ids[-1] in set(stops) | set(eos)
                self.prefilled_tokens += len(q.prompt_ids)
                out.append((rid, Completion(ids, gen.log_probs[row, :length].tolist(), [self.engine.version] * length,
                                            "stop" if stopped else "length", len(q.prompt_ids))))
        return out

    def pause(self) -> list[tuple[int, Completion]]:
        raise RuntimeError(f"{type(self.engine).__name__} decodes whole batches and cannot stop its requests at a "
                           "token boundary; rollout.partial needs an engine that declares pausing (rollout.engine=hf "
                           "or vllm).")
