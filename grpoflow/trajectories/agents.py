"""Agent rollouts: unmodified agent programs, written against the OpenAI client, trained through the endpoint.

    async def run(row: dict, client: openai.AsyncOpenAI) -> float | dict:
        ...   # any number of client.chat.completions.create(model="policy", messages=..., tools=...)

given as `rollout.agent.program=path/to/file.py:run`, or a built-in agent by name with its settings in
`rollout.agent.args`: `verifiers` plays a verifiers environment's episode (verifiers_agent.py). An agent object
may have a `step_scope()` method, an async context manager entered once around each step's episodes on their
event loop (the verifiers agent serves its environment there, once per step).
`AgentEpisodes.play(batcher, items, params, seed)` plays `params.n` episodes of each prompt at once (one asyncio event
loop in a thread of its own), each with a copy of the dataset row and a client whose base URL is the endpoint and
whose `X-Episode-Id` header names the episode. Each episode is a client of the rollout's request batcher: its calls
join the running decode batch as they arrive, and a call that continues its conversation reuses the KV cache of the
one before.
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
import contextlib
import copy
import dataclasses
import inspect
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from grpoflow.errors import UserError
from grpoflow.trajectories.endpoint import Endpoint
from grpoflow.trajectories.episode import EpisodeRecord
from grpoflow.trajectories.loop import Played, RolloutItem
from grpoflow.trajectories.trajectory import EndState, Trajectory
from grpoflow.trajectories.turns import Carried, info_of
from grpoflow.plugins import load_from_file
from grpoflow.engines.batcher import Client, RequestBatcher
from grpoflow.engines.protocol import Request, SamplingParams

log = logging.getLogger("grpoflow.agents")

AgentFn = Callable[[dict, Any], Awaitable[Any]]
GRACE_S = 5.0  # how long past the timeout a blocked event loop is waited for


class EngineError(RuntimeError):
    """The rollout engine failed while agents were calling it."""


def _verifiers_agent(agent_args: dict, model_name: str, data_files: list[str]) -> AgentFn:
    from grpoflow.trajectories.verifiers_agent import build

    return build(agent_args, model_name, data_files)


# built-in agents: rollout.agent.program=<name>, built from (rollout.agent.args, rollout.agent.model, the run's data
# files: the tasks it will play); imported when chosen
BUILTIN_AGENTS: dict[str, Callable[[dict, str, list[str]], AgentFn]] = {"verifiers": _verifiers_agent}


def load_agent(spec: str, agent_args: dict | None = None, model_name: str = "policy",
               data_files: Sequence[str] = ()) -> AgentFn:
    """The agent function of `rollout.agent.program=path/to/file.py:function` (an `async def` taking (row, client)),
    or of a built-in agent's name (BUILTIN_AGENTS) with its `agent_args` (rollout.agent.args) and the run's
    `data_files` (data.train_files and data.val_files)."""
    if spec in BUILTIN_AGENTS:
        return BUILTIN_AGENTS[spec](dict(agent_args or {}), model_name, list(data_files))
    if agent_args:
        raise UserError(f"rollout.agent.args are the settings of a built-in agent ({sorted(BUILTIN_AGENTS)}); "
                        f"rollout.agent.program={spec!r} reads its own settings: leave rollout.agent.args empty.")
    fn = load_from_file(spec)
    if not inspect.iscoroutinefunction(fn):
        raise UserError(f"rollout.agent.program={spec!r} is not an async function; define it as `async def run(row, "
                        "client)` and await the client's calls (client.chat.completions.create is a coroutine).")
    try:
        inspect.signature(fn).bind({}, None)
    except TypeError:
        raise UserError(f"rollout.agent.program={spec!r} must take two arguments, (row, client): the dataset row and "
                        "an openai.AsyncOpenAI client.") from None
    return fn


@dataclass
class Outcome:
    rewards: dict[str, float] | None  # None: the agent failed (end error or timeout)
    end: EndState = EndState.RUNNING  # its samples' end: RUNNING (the program returned: each sample's own), ERROR
                                      # or TIMEOUT
    error: str = ""                   # end error: what the agent raised


class AgentFailure(UserError):
    """Every episode of a step raised the same error: the run stops with it rather than train on
    reward.error_score alone."""


def check_some_episode_ran(outcomes: list[Outcome]) -> None:
    """AgentFailure when every one of a step's episodes raised one error (episodes that time out are scored
    reward.error_score and counted: a slow step is no broken program)."""
    if not outcomes or any(o.end is not EndState.ERROR for o in outcomes):
        return
    errors = {o.error for o in outcomes}
    if len(errors) == 1:
        raise AgentFailure(f"every one of this step's {len(outcomes)} agent episodes failed: {errors.pop()}; the run "
                           "stops rather than train on reward.error_score alone (fix the agent program or what it "
                           "needs: a harness, a server, a network or an offline cache).")


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
    """Agent rollouts: `play(batcher, items, params, seed)` -> every episode's samples with their facts."""
    multi_turn = True
    agent = True
    can_pause, replays_on_resume = False, False  # an episode's state is the agent program's: no checkpoint holds it
    # A tick waits at most this long for episodes still between calls (an agent's time between calls is its own:
    # a slow or sleeping agent must not stall the others); agents that call back within it sample deterministically.
    admission_wait_s = 0.05

    def __init__(self, agent: AgentFn, endpoint: Endpoint, *, timeout_s: float, error_score: float,
                 opening: Callable[[dict], list[dict]]) -> None:
        """`endpoint`: started; `opening(row)`: the dataset prompt as messages (an empty episode's sample)."""
        self.program, self.endpoint, self.timeout_s, self.error_score = agent, endpoint, timeout_s, error_score
        self.opening = opening
        self.renderer = endpoint.renderer

    async def play(self, batcher: RequestBatcher, items: list[RolloutItem], params: SamplingParams,
                   seed: int | None, quota: int | None = None) -> Played:
        """Run `params.n` episodes of each item; every sample of every episode, prompt-major. Episodes cannot
        pause (`quota`, rollout.partial): their state is the agent program's, which a checkpoint cannot hold."""
        if quota is not None or any(item.carried is not None for item in items):
            raise UserError("rollout.partial cannot pause agent episodes (rollout.agent.program): their state is the "
                            "agent program's, which a checkpoint cannot hold; unset rollout.partial.enable or "
                            "rollout.agent.program.")
        pairs = [(item, j) for item in items for j in range(params.n)]
        clients = [batcher.client(k) for k in range(len(pairs))]
        loop = asyncio.get_running_loop()
        by_id: dict[str, Client] = {}

        def submit(episode: str, request: Request) -> Any:
            client = by_id[episode]
            keyed = dataclasses.replace(request, key=client.order)  # the episode's earlier KV is reused
            return asyncio.run_coroutine_threadsafe(client.generate(keyed), loop)

        def finish(episode: str) -> None:
            with contextlib.suppress(RuntimeError):  # an abandoned agent thread may end after the rollout
                loop.call_soon_threadsafe(by_id[episode].done)

        ids = self.endpoint.open_session(seed=seed, params=params, submit=submit, finish=finish,
                                         episodes=[(item.index, params.n, j) for item, j in pairs])
        by_id.update(zip(ids, clients))
        outcomes: dict[str, Outcome] = {}
        thread = threading.Thread(target=asyncio.run, args=(self.play_all(ids, [it.row or {} for it, _ in pairs],
                                                                          outcomes),),
                                  daemon=True, name="grpoflow-agents")
        try:
            thread.start()
            await asyncio.to_thread(thread.join, self.timeout_s + GRACE_S)
            if thread.is_alive():
                log.warning("agent episodes still run %.0f s after rollout.agent.timeout_s=%g: an agent blocks the "
                            "event loop (a synchronous sleep, request or computation), so it cannot be cancelled; its "
                            "episodes count as timeouts. Await asynchronous calls, or run blocking code with "
                            "asyncio.to_thread.", GRACE_S, self.timeout_s)
        finally:
            records = self.endpoint.close_session()
            for client in clients:
                client.done()
        if self.endpoint.failure is not None:
            failure = self.endpoint.failure
            raise EngineError(f"the rollout engine failed while serving agent calls: {type(failure).__name__}: "
                              f"{failure}") from failure
        finished = dict(outcomes)  # a blocked loop may still write to `outcomes`
        check_some_episode_ran([finished.get(e, Outcome(None, EndState.TIMEOUT)) for e in ids])
        played: Played = []
        for k, ((item, _), e) in enumerate(zip(pairs, ids)):
            outcome, record = finished.get(e, Outcome(None, EndState.TIMEOUT)), records[e]
            samples = self.samples_of(item, record, outcome)
            for s, t in enumerate(samples):
                last = record.last if record.last is not None else len(samples) - 1
                played.append((item.position, t, info_of(t), Carried(final=s == last, episode=k)))
        return played

    def close(self) -> None:
        """Stop the endpoint."""
        self.endpoint.close()

    def samples_of(self, item: RolloutItem, record: EpisodeRecord, outcome: Outcome) -> list[Trajectory]:
        """The episode's samples with its reward (an empty sample when it made no call)."""
        rewards = outcome.rewards if outcome.rewards is not None else {"agent": self.error_score}
        opening = self.opening(item.row or {})
        samples = record.samples or [Trajectory(self.renderer.prompt_ids(opening), opening)]
        for t in samples:
            t.rewards = dict(rewards)
            t.end = outcome.end if outcome.end.is_error else t.end if t.end.is_terminal else EndState.STOP
        return samples

    async def play_all(self, ids: list[str], rows: list[dict], outcomes: dict[str, Outcome]) -> None:
        import openai

        scope = getattr(self.program, "step_scope", None)
        async with scope() if scope is not None else contextlib.nullcontext(), \
                openai.AsyncOpenAI(base_url=self.endpoint.url, api_key="grpoflow", max_retries=0,
                                   timeout=self.timeout_s) as client:
            errors: list[str] = []
            await asyncio.gather(*(self.episode(client, e, row, outcomes, errors) for e, row in zip(ids, rows)))
        if len(errors) > 1:
            log.warning("%d of %d agent episodes failed (scored reward.error_score)", len(errors), len(ids))

    async def episode(self, client: Any, episode: str, row: dict, outcomes: dict[str, Outcome],
                      errors: list[str]) -> None:
        """One episode: the agent with its own client, cancelled after `timeout_s`."""
        own = client.with_options(default_headers={"X-Episode-Id": episode})
        task = asyncio.ensure_future(_without_exit(self.program(copy.deepcopy(row), own)))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
            if not done:
                task.cancel()
                outcomes[episode] = Outcome(None, EndState.TIMEOUT)
                return
            try:
                outcomes[episode] = Outcome(reward_parts(task.result()))
            except Exception as e:  # the agent raised, or returned no number
                if not errors:
                    log.warning("agent episode %s failed (scored reward.error_score): %s: %s", episode,
                                type(e).__name__, e, exc_info=e)
                errors.append(f"{type(e).__name__}: {e}")
                outcomes[episode] = Outcome(None, EndState.ERROR, f"{type(e).__name__}: {str(e)[:500]}")
        finally:
            self.endpoint.close_episode(episode)


async def _without_exit(episode: Any) -> Any:
    """Await an agent's episode with its sys.exit turned into an ordinary error (asyncio would let SystemExit end
    the event loop, and with it every episode of the step): the callback rule scores it reward.error_score."""
    try:
        return await episode
    except SystemExit as e:
        raise RuntimeError(f"the agent called sys.exit({e.code!r})") from None

