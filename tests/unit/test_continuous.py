"""Continuous batching (engines/continuous.py, slots.py) and the request batcher (engines/batcher.py) on a tiny model:
requests that join a running decode batch sample what they would alone, a trajectory's next turn reusing its KV
cache gives the log-probs of a fresh prefill, and the batcher's admission does not depend on the clock."""

import asyncio
import random

import pytest
import torch

from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model
from grpoflow.engines.batcher import EngineFailure, RequestBatcher
from grpoflow.engines.continuous import ContinuousSampler
from grpoflow.engines.protocol import EngineAbilities, Request
from grpoflow.engines.slots import SlotCache, attention_mask

TOK = build_char_tokenizer()
MODEL = build_tiny_model(TOK, size="0.5m").eval()


def sampler(**kw):
    return ContinuousSampler(MODEL, pad_token_id=TOK.pad_token_id, **kw)


def ids(text):
    return tuple(TOK.encode(text, add_special_tokens=False))


def run(s, schedule, version=0):
    """Admit `schedule[t]` (a list of (rid, Request)) before tick t; step until nothing is left. Returns rid ->
    completion and the live rows at each tick."""
    done, live, t = {}, [], 0
    while t < len(schedule) or s.busy:
        s.admit(schedule[t] if t < len(schedule) else [])
        live.append(sum(r is not None for r in s.rows))
        done.update(s.tick(version))
        t += 1
    return done, live


@torch.no_grad()
def forced_log_probs(prompt, sampled):
    logits = MODEL(input_ids=torch.tensor([list(prompt) + sampled])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1:-1]
    return lp.gather(-1, torch.tensor(sampled)[:, None]).squeeze(-1)


REQUESTS = [Request(ids(p), 12, stream=s) for p, s in (("12+7=", 1), ("3+4=", 2), ("100+23=", 3), ("5+55+555=", 4))]


def test_slot_cache_writes_each_row_at_its_own_column():
    cache = SlotCache(num_layers=1, slots=2, capacity=8)
    cache.prepare(None, torch.tensor([0, 3]), 2, None, width=5)
    k = torch.arange(2 * 1 * 2 * 1, dtype=torch.float32).view(2, 1, 2, 1) + 1  # [rows, heads, q, dim]
    keys, _ = cache.update(k, k, 0)
    assert keys.shape == (2, 1, 5, 1)
    assert keys[0, 0, :, 0].tolist() == [1, 2, 0, 0, 0] and keys[1, 0, :, 0].tolist() == [0, 0, 0, 3, 4]
    # query q of a row reads its columns up to its own position; a padded query reads column 0 only
    mask = attention_mask(torch.tensor([-1, 3]), 2, 5, torch.tensor([[True, False], [False, False]]))
    assert mask[0, 0].tolist() == [[True, False, False, False, False], [True, False, False, False, False]]
    assert mask[1, 0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_requests_that_join_a_running_batch_sample_what_they_would_alone():
    alone = {rid: run(sampler(), [[(rid, q)]])[0][rid] for rid, q in enumerate(REQUESTS)}
    together, _ = run(sampler(), [list(enumerate(REQUESTS))])
    staggered, live = run(sampler(), [[(0, REQUESTS[0])], [], [(1, REQUESTS[1]), (2, REQUESTS[2])], [],
                                      [(3, REQUESTS[3])]])
    assert max(live) >= 3  # they did share decode steps
    for rid, q in enumerate(REQUESTS):
        for other in (together, staggered):
            assert other[rid].ids == alone[rid].ids
            torch.testing.assert_close(torch.tensor(other[rid].log_probs), torch.tensor(alone[rid].log_probs),
                                       atol=1e-5, rtol=1e-5)
        # and what the model gives the sampled ids teacher-forced
        torch.testing.assert_close(torch.tensor(alone[rid].log_probs), forced_log_probs(q.prompt_ids, alone[rid].ids),
                                   atol=1e-5, rtol=1e-5)


def test_a_prompts_samples_share_one_prefill_and_draw_their_own_streams():
    s = sampler()
    q = REQUESTS[2]
    done, _ = run(s, [[(j, Request(q.prompt_ids, 12, stream=100 + j)) for j in range(4)]])
    assert s.prefilled_tokens == len(q.prompt_ids)  # prefilled once, copied to the other three slots
    assert len({tuple(c.ids) for c in done.values()}) > 1
    assert [c.prefilled for c in done.values()] == [len(q.prompt_ids), 0, 0, 0]


def test_a_next_turn_reusing_its_kv_gives_the_log_probs_of_a_fresh_prefill():
    first = Request(ids("Guess 1-8:"), 6, stream=7, key=0)
    reused = sampler()
    c1 = run(reused, [[(0, first)]])[0][0]
    turn2 = first.prompt_ids + tuple(c1.ids) + ids("higher:")
    c2 = run(reused, [[(1, Request(turn2, 8, stream=8, key=0))]])[0][1]
    assert c2.prefilled == len(turn2) - len(first.prompt_ids) - len(c1.ids) + 1  # the last token and the reply
    fresh = run(sampler(), [[(1, Request(turn2, 8, stream=8))]])[0][1]
    assert fresh.prefilled == len(turn2) and c2.ids == fresh.ids
    torch.testing.assert_close(torch.tensor(c2.log_probs), torch.tensor(fresh.log_probs), atol=1e-5, rtol=1e-5)
    # a parked cache beyond the memory bound is dropped: the next turn prefills everything
    bounded = sampler(kv_reuse_bytes=16)
    c1 = run(bounded, [[(0, first)]])[0][0]
    assert run(bounded, [[(1, Request(turn2, 8, stream=8, key=0))]])[0][1].prefilled == len(turn2)


def test_kv_reuse_and_evictions_reach_the_rollout_metrics():
    """Each completion says how many prompt tokens came from its trajectory's kept KV cache and how many other kept
    caches keeping its own pushed out; summed over a step's samples they are rollout/kv_reused_tokens and
    rollout/kv_evicted."""
    from grpoflow.trajectories.trajectory import Trajectory
    from grpoflow.trajectories.turns import Carried, count_engine_work, info_of, rollout_metrics

    firsts = [Request(ids("Guess 1-8:"), 6, stream=7, key=0), Request(ids("Guess 2-9:"), 6, stream=9, key=1)]
    unbounded = sampler()
    sizes = []
    for rid, q in enumerate(firsts):
        before = unbounded.parked.used
        run(unbounded, [[(rid, q)]])
        sizes.append(unbounded.parked.used - before)
    # room for either kept cache alone, not both: keeping trajectory 1's evicts trajectory 0's (the older)
    s = sampler(kv_reuse_bytes=sum(sizes) - 1)
    t0, t1 = Trajectory(list(firsts[0].prompt_ids), []), Trajectory(list(firsts[1].prompt_ids), [])
    c0 = run(s, [[(0, firsts[0])]])[0][0]
    c1 = run(s, [[(1, firsts[1])]])[0][1]
    assert (c0.evicted, c1.evicted) == (0, 1)
    turn2 = firsts[1].prompt_ids + tuple(c1.ids) + ids("higher:")
    c2 = run(s, [[(2, Request(turn2, 8, stream=8, key=1))]])[0][2]
    # trajectory 1 kept its prompt and what it sampled but the last token (never fed): 10 + len(c1.ids) - 1
    assert c2.reused == len(firsts[1].prompt_ids) + len(c1.ids) - 1 and c2.reused + c2.prefilled == len(turn2)
    turn2_of_0 = firsts[0].prompt_ids + tuple(c0.ids) + ids("lower:")
    c3 = run(s, [[(3, Request(turn2_of_0, 8, stream=10, key=0))]])[0][3]
    assert c3.reused == 0  # its cache was evicted: prefilled from scratch
    for t, c, prompt in ((t0, c0, firsts[0].prompt_ids), (t1, c1, firsts[1].prompt_ids), (t1, c2, turn2),
                         (t0, c3, turn2_of_0)):
        count_engine_work(t, c, len(prompt))
    metrics = rollout_metrics([info_of(t0), info_of(t1)], [Carried(), Carried()], multi_turn=True, agent=False,
                              episodes=2, env_tokens=0,
                              tokens=1, truncated=0)
    assert metrics["rollout/kv_reused_tokens"] == c2.reused
    assert metrics["rollout/kv_evicted"] == sum(c.evicted for c in (c0, c1, c2, c3)) >= 1


def test_slots_and_columns_grow_past_their_first_allocation():
    s = sampler()
    long = Request(tuple(TOK.encode("9" * 150, add_special_tokens=False)), 20, stream=5)
    many = [(k, Request(REQUESTS[k % 4].prompt_ids, 12, stream=50 + k)) for k in range(40)]
    done, _ = run(s, [many[:10], [(99, long)], many[10:]])
    assert len(done) == 41 and s.cache.capacity >= 150 + 20 + 1
    torch.testing.assert_close(torch.tensor(done[99].log_probs), forced_log_probs(long.prompt_ids, done[99].ids),
                               atol=1e-4, rtol=1e-4)


class Engine:
    """The sampler as a stepping engine that records which requests each tick admitted."""
    abilities = EngineAbilities(stepping=True)

    def __init__(self):
        self.s, self.ticks, self.version = sampler(), [], 0

    @property
    def busy(self):
        return self.s.busy

    def admit(self, requests):
        self.ticks.append([q.stream for _, q in requests])
        self.s.admit(requests)

    def tick(self, version):
        return self.s.tick(version)


async def converse(client, k, turns, think):
    """A trajectory of `turns` requests; between them it 'runs a tool' for think() seconds."""
    out, prompt = [], ids(f"{k}+{k}=")
    try:
        for t in range(turns):
            c = await client.generate(Request(prompt, 4 + 3 * (k % 3), stream=1000 * k + t, key=k))
            out.append(c.ids)
            prompt = prompt + tuple(c.ids) + ids(f"?{t}")
            await asyncio.sleep(think())
    finally:
        client.done()
    return out


def play(deterministic, think, turns=(1, 3, 1, 2, 1, 1)):
    engine = Engine()

    async def main():
        batcher = RequestBatcher(engine, version=lambda: 0, deterministic=deterministic)
        server = asyncio.ensure_future(batcher.serve())
        outs = await asyncio.gather(*(converse(batcher.client(k), k, n, think) for k, n in enumerate(turns)))
        batcher.close()
        await server
        return outs, batcher.ticks

    outs, ticks = asyncio.run(main())
    return outs, engine.ticks, ticks


def test_admission_follows_token_counts_not_the_clock():
    rng = random.Random(0)
    a = play(True, lambda: 0.0)
    b = play(True, lambda: rng.uniform(0, 0.02))  # tools that take varying wall time
    assert a[0] == b[0] and a[1] == b[1]          # the same samples, admitted at the same ticks
    # a trajectory's next turn joins at the tick after its last one ended, while others still decode: the rollout
    # takes as many ticks as its longest trajectory, where turn-by-turn lockstep waits for each round's longest turn
    outs = a[0]
    assert a[2] == max(sum(len(turn) for turn in o) for o in outs)
    lockstep = sum(max(len(o[t]) for o in outs if len(o) > t) for t in range(max(map(len, outs))))
    assert a[2] < lockstep
    c = play(False, lambda: rng.uniform(0, 0.02))  # admitted as they arrive: samples still per-stream
    assert [len(o) for o in c[0]] == [len(o) for o in a[0]]


def test_an_engine_failure_reaches_every_waiting_trajectory_and_nothing_hangs():
    class Broken(Engine):
        def tick(self, version):
            raise RuntimeError("out of memory")

    async def main():
        batcher = RequestBatcher(Broken(), version=lambda: 0)
        server = asyncio.ensure_future(batcher.serve())
        clients = [batcher.client(k) for k in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*(c.generate(REQUESTS[k]) for k, c in enumerate(clients)),
                                                        return_exceptions=True), 30)
        with pytest.raises(EngineFailure):
            await server
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, EngineFailure) and "out of memory" in str(r) for r in results)
