"""Agent rollouts: unmodified agent programs, written against the OpenAI client, trained through the endpoint.

    async def run(row: dict, client: openai.AsyncOpenAI) -> float | dict:
        ...   # any number of client.chat.completions.create(model="policy", messages=..., tools=...)

given as `rollout.agent=path/to/file.py:run`. `AgentEpisodes.run(items, params, seed)` plays `params.n`
episodes of each prompt at once (one asyncio event loop in a thread of its own), each with a copy of the
dataset row and a client whose base URL is the endpoint and whose `X-Episode-Id` header names the episode.
The endpoint turns each episode's calls into samples (episode.py), and every sample of an episode carries
the episode's reward: a number (logged as reward/agent/mean) or a dict of parts (summed; each logged as
reward/agent/<part>/mean), added to the configured reward functions' score, as an environment's is.

Groups: all samples of the `n` episodes of a prompt form the prompt's group for the advantage estimator.
An episode that merged into one sample contributes one sample, as a trajectory of the agent loop does; an
episode split into k samples contributes k, each with the episode's reward, so it weighs k times in the
group's mean and std. That is the simplest correct choice: every sample is a sequence the policy generated
in that episode, and its advantage says how the episode went relative to the prompt's other episodes.

Failures are the agent's, counted, never the step's: an agent that raises or returns something other than a
number or a dict of numbers scores `error_score` (agent/errors); one still running after `timeout_s` is
cancelled and scores `error_score` (agent/timeouts). Their recorded calls still train, with that score. An
episode that never called the model gives one empty sample (its group's statistics see its reward; no token
trains). An agent that blocks the event loop (synchronous sleep or I/O) cannot be cancelled: after
`timeout_s` + a grace period its episodes still running count as timeouts and the loop's thread is
abandoned. A failure of the rollout engine is raised as such.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import torch

from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.multiturn.endpoint import Endpoint
from grpoflow.multiturn.episode import EpisodeRecord
from grpoflow.multiturn.loop import trajectory_metrics
from grpoflow.multiturn.trajectory import Trajectory, to_batch
from grpoflow.plugins import load_from_file
from grpoflow.rollout.protocol import SamplingParams

log = logging.getLogger("grpoflow.agents")

AgentFn = Callable[[dict, Any], Awaitable[Any]]
GRACE_S = 5.0  # how long past the timeout a blocked event loop is waited for


class EngineError(RuntimeError):
    """The rollout engine failed while agents were calling it."""


def load_agent(spec: str) -> AgentFn:
    """The agent function of `rollout.agent=path/to/file.py:function`: an `async def` taking (row, client)."""
    fn = load_from_file(spec)
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"rollout.agent={spec!r} is not an async function; define it as `async def run(row, client)` "
                         "and await the client's calls (client.chat.completions.create is a coroutine).")
    try:
        inspect.signature(fn).bind({}, None)
    except TypeError:
        raise ValueError(f"rollout.agent={spec!r} must take two arguments, (row, client): the dataset row and an "
                         "openai.AsyncOpenAI client.") from None
    return fn


@dataclass
class Outcome:
    rewards: dict[str, float] | None  # None: the agent failed (status error or timeout)
    status: str = "ok"                # ok | error | timeout


def reward_parts(value: Any) -> dict[str, float]:
    """An agent's return value as reward parts: a number is part "agent", a dict's keys are "agent/<key>"."""
    parts = {f"agent/{k}": v for k, v in value.items()} if isinstance(value, dict) else {"agent": value}
    out = {}
    for name, v in parts.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise TypeError(f"the agent returned {value!r:.80}; return a finite number or a dict of finite numbers.")
        out[name] = float(v)
    return out


class AgentEpisodes:
    """Agent rollouts: `run(items, params, seed)` -> (every episode's samples as a Batch, their metrics)."""

    def __init__(self, agent: AgentFn, endpoint: Endpoint, *, timeout_s: float, error_score: float,
                 opening: Callable[[PromptItem], list[dict]]) -> None:
        """`endpoint`: started; `opening(item)`: the dataset prompt as messages (an empty episode's sample)."""
        self.agent, self.endpoint, self.timeout_s, self.error_score = agent, endpoint, timeout_s, error_score
        self.opening = opening
        self.renderer = endpoint.renderer

    def run(self, items: list[PromptItem], params: SamplingParams, seed: int | None) -> tuple[Batch, dict[str, float]]:
        episodes = self.play(items, params, seed)
        samples, groups, rows = [], [], []
        for g, (item, record, outcome) in enumerate(episodes):
            for t in self.samples_of(item, record, outcome):
                samples.append(t)
                groups.append(g // params.n)
                rows.append(item.row)
        batch = self.to_batch(samples, rows).replace(group_ids=torch.tensor(groups, dtype=torch.long))
        count = len(episodes)
        metrics = {"agent/calls/mean": sum(sum(t.turns for t in r.samples) for _, r, _ in episodes) / count,
                   "agent/samples/mean": sum(len(r.samples) for _, r, _ in episodes) / count,
                   "agent/errors": float(sum(o.status == "error" for _, _, o in episodes)),
                   "agent/timeouts": float(sum(o.status == "timeout" for _, _, o in episodes)),
                   **trajectory_metrics(samples)}
        return batch, metrics

    def final(self, items: list[PromptItem], params: SamplingParams, seed: int | None) -> Batch:
        """One sample per episode, prompt-major: the one its latest call went to (validation scores episodes)."""
        samples, rows = [], []
        for item, record, outcome in self.play(items, params, seed):
            every = self.samples_of(item, record, outcome)
            samples.append(every[record.last] if record.last is not None else every[-1])
            rows.append(item.row)
        return self.to_batch(samples, rows)

    def close(self) -> None:
        """Stop the endpoint."""
        self.endpoint.close()

    def samples_of(self, item: PromptItem, record: EpisodeRecord, outcome: Outcome) -> list[Trajectory]:
        """The episode's samples with its reward (an empty sample when it made no call)."""
        rewards = outcome.rewards if outcome.rewards is not None else {"agent": self.error_score}
        samples = record.samples or [Trajectory(self.renderer.prompt_ids(self.opening(item)), self.opening(item))]
        for t in samples:
            t.rewards, t.done = dict(rewards), True
        return samples

    def to_batch(self, samples: list[Trajectory], rows: list[dict]) -> Batch:
        texts = [self.renderer.tokenizer.decode(t.prompt_ids, skip_special_tokens=False) for t in samples]
        batch = to_batch(samples, pad_token_id=self.renderer.tokenizer.pad_token_id, prompt_texts=texts, rows=rows)
        assert batch.policy_version is not None
        newest = max(int(batch.policy_version.max()), 0)  # an empty sample (no call): the others' policy
        return batch.replace(policy_version=torch.where(batch.policy_version < 0, newest, batch.policy_version))

    def play(self, items: list[PromptItem], params: SamplingParams, seed: int | None
             ) -> list[tuple[PromptItem, EpisodeRecord, Outcome]]:
        """Run `params.n` episodes of each item; (item, its record, its outcome) per episode, prompt-major."""
        pairs = [(item, j) for item in items for j in range(params.n)]
        ids = self.endpoint.open_session(seed=seed, params=params,
                                         episodes=[(item.index, params.n, j) for item, j in pairs])
        outcomes: dict[str, Outcome] = {}
        thread = threading.Thread(target=asyncio.run, args=(self.play_all(ids, [it.row for it, _ in pairs],
                                                                          outcomes),),
                                  daemon=True, name="grpoflow-agents")
        try:
            thread.start()
            thread.join(self.timeout_s + GRACE_S)
            if thread.is_alive():
                log.warning("agent episodes still run %.0f s after rollout.agent_timeout_s=%g: an agent blocks the "
                            "event loop (a synchronous sleep, request or computation), so it cannot be cancelled; its "
                            "episodes count as timeouts. Await asynchronous calls, or run blocking code with "
                            "asyncio.to_thread.", GRACE_S, self.timeout_s)
        finally:
            records = self.endpoint.close_session()
        if self.endpoint.failure is not None:
            failure = self.endpoint.failure
            raise EngineError(f"the rollout engine failed while serving agent calls: {type(failure).__name__}: "
                              f"{failure}") from failure
        finished = dict(outcomes)  # a blocked loop may still write to `outcomes`
        return [(item, records[e], finished.get(e, Outcome(None, "timeout"))) for (item, _), e in zip(pairs, ids)]

    async def play_all(self, ids: list[str], rows: list[dict], outcomes: dict[str, Outcome]) -> None:
        import openai

        async with openai.AsyncOpenAI(base_url=self.endpoint.url, api_key="grpoflow", max_retries=0,
                                      timeout=self.timeout_s) as client:
            errors: list[str] = []
            await asyncio.gather(*(self.episode(client, e, row, outcomes, errors) for e, row in zip(ids, rows)))
        if len(errors) > 1:
            log.warning("%d of %d agent episodes failed (scored reward.error_score)", len(errors), len(ids))

    async def episode(self, client: Any, episode: str, row: dict, outcomes: dict[str, Outcome],
                      errors: list[str]) -> None:
        """One episode: the agent with its own client, cancelled after `timeout_s`."""
        own = client.with_options(default_headers={"X-Episode-Id": episode})
        task = asyncio.ensure_future(_without_exit(self.agent(copy.deepcopy(row), own)))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
            if not done:
                task.cancel()
                outcomes[episode] = Outcome(None, "timeout")
                return
            try:
                outcomes[episode] = Outcome(reward_parts(task.result()))
            except Exception as e:  # the agent raised, or returned no number
                if not errors:
                    log.warning("agent episode %s failed (scored reward.error_score): %s: %s", episode,
                                type(e).__name__, e, exc_info=e)
                errors.append(f"{type(e).__name__}: {e}")
                outcomes[episode] = Outcome(None, "error")
        finally:
            self.endpoint.close_episode(episode)


async def _without_exit(episode: Any) -> Any:
    """Await an agent's episode with its sys.exit turned into an ordinary error (asyncio would let SystemExit end
    the event loop, and with it every episode of the step): the callback rule scores it reward.error_score."""
    try:
        return await episode
    except SystemExit as e:
        raise RuntimeError(f"the agent called sys.exit({e.code!r})") from None

