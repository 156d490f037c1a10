"""A scripted model for rollout tests: a StepEngine whose reply is a function of the conversation so far, and
helpers that play a rollout over it as a rollout worker does."""

import asyncio
import contextlib
import dataclasses
import threading

from grpoflow.controller.rollouts import metrics_of
from grpoflow.trajectories.loop import RolloutItem
from grpoflow.trajectories.rollout import run_rollout
from grpoflow.engines.batcher import RequestBatcher
from grpoflow.engines.protocol import Completion, EngineAbilities, SamplingParams


class ScriptedEngine:
    """Replies `policy(conversation text)` + `end_id` (the end-of-turn token, or EOS), cut at the request's
    max_new_tokens; the log-prob of the t-th sampled token is -(t + 1) / 100. Every request is served in the tick
    it is admitted; `calls` holds the requests admitted at each tick."""
    abilities = EngineAbilities(stepping=True)

    def __init__(self, tok, policy, end_id, version=3):
        self.tok, self.policy, self.end_id, self.version = tok, policy, end_id, version
        self.calls, self.admitted = [], []

    @property
    def busy(self):
        return bool(self.admitted)

    def admit(self, requests):
        self.admitted += requests
        if requests:
            self.calls.append([q for _, q in requests])

    def tick(self, version):
        out = []
        admitted, self.admitted = self.admitted, []
        for rid, q in admitted:
            reply = self.tok.encode(self.policy(self.tok.decode(list(q.prompt_ids))), add_special_tokens=False)
            ids = (reply + [self.end_id])[:q.max_new_tokens]
            finish = "stop" if ids[-1] in q.stop_token_ids + (self.tok.eos_token_id,) else "length"
            out.append((rid, Completion(ids, [-(t + 1) / 100 for t in range(len(ids))], [version] * len(ids), finish,
                                        len(q.prompt_ids))))
        return out

    def end_rollout(self):
        pass


def play(kind, engine, prompts, params, seed, *, agent=False):
    """`kind`'s trajectories of the PromptItems `prompts` over `engine`: (batch with rows attached, metrics)."""
    requests = [RolloutItem(it.prompt_ids, it.index, position, it.row) for position, it in enumerate(prompts)]
    batch = run_rollout(kind, engine, requests, params, seed, decode=lambda ids: engine.tok.decode(ids))
    batch = batch.replace(rows=[prompts[g].row for g in batch.group_ids.tolist()])
    return batch, metrics_of(batch, True, agent, episodes=len(prompts) * params.n)


def final(batch):
    """One sample per trajectory or episode: the one validation scores."""
    return batch.select([i for i, c in enumerate(batch.carried) if c.final])


class Sessions:
    """Endpoint sessions served by a request batcher over `engine` on an event loop in a thread of its own."""

    def __init__(self, engine):
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.batchers = []

    def open(self, endpoint, *, episodes=1, budget=500, n=1, seed=7, temperature=1.0, index=3):
        batcher = RequestBatcher(self.engine, version=lambda: self.engine.version, max_wait_s=0.05)
        self.batchers.append((batcher, asyncio.run_coroutine_threadsafe(batcher.serve(), self.loop)))

        async def clients():
            return [batcher.client(k) for k in range(episodes)]

        made = asyncio.run_coroutine_threadsafe(clients(), self.loop).result(10)
        by_id = {}

        def submit(e, q):
            return asyncio.run_coroutine_threadsafe(by_id[e].generate(dataclasses.replace(q, key=by_id[e].order)),
                                                    self.loop)

        ids = endpoint.open_session(seed=seed, params=SamplingParams(n=n, max_new_tokens=budget,
                                                                     temperature=temperature),
                                    episodes=[(index, n, j) for j in range(episodes)], submit=submit,
                                    finish=lambda e: self.loop.call_soon_threadsafe(by_id[e].done))
        by_id.update(zip(ids, made))
        return ids

    def close(self):
        for batcher, served in self.batchers:
            for order in list(batcher.open):  # clients an unfinished test left open
                self.loop.call_soon_threadsafe(batcher._done, order)
            self.loop.call_soon_threadsafe(batcher.close)
            try:
                served.result(10)
            except Exception:  # an engine failure the test provoked
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextlib.contextmanager
def serving(engine, tok, **limits):
    """A started Endpoint whose sessions (`endpoint.sessions.open(...)`) are served by `engine` (its end_id set to
    the template's end-of-turn token)."""
    from grpoflow.trajectories.endpoint import Endpoint

    endpoint = Endpoint(tok, max_calls=4, **limits)
    engine.end_id = endpoint.renderer.turn.end_token_id
    sessions = Sessions(engine)
    endpoint.sessions = sessions
    try:
        with endpoint:
            yield endpoint
    finally:
        sessions.close()
