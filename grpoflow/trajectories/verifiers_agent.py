"""`rollout.agent.program=verifiers`: a verifiers environment plays its own episode against grpoflow's endpoint, and its
rubric gives the reward (docs/environments.md).

The rows are those of `data.train_files=[verifiers:TASKSET?...]` (tasks/verifiers_tasks.py). For each episode
(an agent episode of agents.py: its own client, whose base URL is the endpoint and whose `X-Episode-Id` header
names the episode), this agent

1. builds the verifiers environment: `rollout.agent.args` is its `EnvConfig` as verifiers' own config reads it
   (`{id: my-env, agent: {harness: {id: null}}}`, the keys of `--env.*`), with the row's taskset; a seat whose
   runtime is not set runs its harness locally (`runtime: {type: subprocess}`; verifiers' own default is a
   remote Prime sandbox). One environment per taskset serves all the episodes of a step (`step_scope`, which
   agents.py enters around them): its interception server and the taskset's tool servers start once per step,
   and its episodes run concurrently, as in verifiers' own eval runner;
2. runs `env.run_episode(task, ModelContext(model, client))` with an eval client config that points at the
   episode's endpoint URL and sends its header: the harness program (verifiers' chat loop, Codex, ...) calls
   verifiers' interception server, which relays every model call to grpoflow's endpoint unchanged;
3. returns the rubric's weighted rewards (`episode_rewards`), one reward part per `@vf.reward`.

The trained tokens are the ones grpoflow's endpoint recorded as the engine sampled them (episode.py); verifiers'
text is never re-tokenized. An episode that verifiers marks failed (a harness error, a timeout, a rubric that
did not run) raises, so agents.py scores it reward.error_score with a warning naming verifiers' error.
Building the agent builds the harness of every seat that runs locally, once per process and before step 1 (the
start-up check builds it, then each rollout worker), with uv's offline settings honoured; a harness that cannot be
built stops the run there with one error (verifiers_harness.py). It needs the tasksets the agent will play (the
`verifiers:` specs of data.train_files and data.val_files): a seat that names no harness runs its taskset's.
Imports verifiers only when built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from typing import Any, AsyncIterator, Sequence

from grpoflow.errors import UserError
from grpoflow.tasks.verifiers_tasks import import_verifiers, is_verifiers, parse_spec, task_of
from grpoflow.trajectories.verifiers_harness import LOCAL_RUNTIME, prepare_harnesses

log = logging.getLogger("grpoflow.verifiers")
EPISODE_HEADER = "X-Episode-Id"


def episode_rewards(episode: Any) -> dict[str, float]:
    """A finished verifiers `Episode` as reward parts: each trace's rewards, score x weight (their sum is
    verifiers' `trace.reward`); with several traces (a multi-agent env) each part is named `<agent>/<reward>`.
    Raises RuntimeError naming verifiers' error when the episode failed or a reward was not scored."""
    errors = list(episode.errors) + [e for t in episode.traces for e in t.errors]
    if errors or not episode.ok:
        first = errors[0] if errors else None
        cause = f"{first.type}: {first.message}" if first else "an agent run did not finish"
        raise RuntimeError(f"the verifiers episode failed ({cause[:500]})")
    parts: dict[str, float] = {}
    named = len(episode.traces) > 1
    for trace in episode.traces:
        for name, reward in trace.rewards.items():
            if reward is None:
                raise RuntimeError(f"the verifiers rubric did not score {name!r} (scoring did not run).")
            key = f"{trace.agent.name}/{name}" if named else name
            parts[key] = parts.get(key, 0.0) + reward.value
    if not parts:
        raise RuntimeError("the verifiers task has no reward to train on; give its Task a @vf.reward method.")
    return parts


def env_config_dict(env_args: dict, taskset: dict | None, seats: list[str]) -> dict:
    """`rollout.agent.args` with the row's taskset (None: none), and the local runtime for every seat that names none.
    A harness id that YAML read as None (`{harness: {id: null}}` on the command line) is verifiers' `null` harness,
    the only one it can mean (verifiers itself would take None for its default, `bash`)."""
    raw = {**env_args} if taskset is None else {**env_args, "taskset": taskset}
    for seat in seats:
        given = dict(raw.get(seat) or {})
        given.setdefault("runtime", dict(LOCAL_RUNTIME))
        harness = given.get("harness")
        if isinstance(harness, dict) and "id" in harness and harness["id"] is None:
            given["harness"] = {**harness, "id": "null"}
        raw[seat] = given
    return raw


class VerifiersAgent:
    """`run(row, client)`: one verifiers episode of the row's task; `step_scope()` around a step's episodes
    (module docstring)."""

    def __init__(self, env_args: dict, model_name: str, tasksets: list[dict] | None = None) -> None:
        try:
            self.vf = import_verifiers()
        except ImportError as e:
            raise UserError(f"rollout.agent.program=verifiers: {e}") from None
        if not isinstance(env_args, dict) or "taskset" in env_args:
            raise UserError(f"rollout.agent.args={env_args!r}: give the verifiers environment's config without its "
                            "taskset (e.g. {agent: {harness: {id: null}}}); the taskset comes from "
                            "data.train_files=[verifiers:TASKSET].")
        runtimes = [v.get("runtime") for v in env_args.values() if isinstance(v, dict)]
        if all(r in (None, LOCAL_RUNTIME) for r in runtimes) and shutil.which("uv") is None:
            raise UserError("rollout.agent.program=verifiers runs verifiers' harness programs locally with uv, "
                            "which is not on PATH: pip install 'grpoflow[verifiers]' installs it into the "
                            "environment's bin folder; add that folder to PATH.")
        self.env_args, self.model_name = dict(env_args), model_name
        self.prepare(tasksets or [])
        self._stack: contextlib.AsyncExitStack | None = None  # the open step's serving environments
        self._envs: dict[str, Any] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def step_scope(self) -> AsyncIterator[None]:
        """Serve each taskset's environment once for the episodes run inside (started by the first of them), and
        stop them all at the end; a failure to stop is a warning, not the step's error."""
        self._stack, self._envs, self._locks = contextlib.AsyncExitStack(), {}, {}
        try:
            yield
        finally:
            stack, self._stack, self._envs, self._locks = self._stack, None, {}, {}
            try:
                await stack.aclose()
            except Exception as e:  # verifiers' teardown: the episodes are already scored
                log.warning("stopping the verifiers environment failed: %s: %s", type(e).__name__, e)

    async def serving_env(self, taskset: dict) -> Any:
        """The step's environment for `taskset`, serving (built and started by the first episode that asks)."""
        assert self._stack is not None
        key = json.dumps(taskset, sort_keys=True)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self._envs:
                env = self.vf.load_environment(self.env_config(taskset))
                await self._stack.enter_async_context(env.serving())
                self._envs[key] = env
        return self._envs[key]

    def env_config(self, taskset: dict | None) -> Any:
        """The verifiers EnvConfig of an episode of `taskset` (None: without one, to read the seats' settings)."""
        vf = self.vf
        plain = vf.resolve_env_config(env_config_dict(self.env_args, taskset, []))
        seats = [name for name, value in plain if isinstance(value, vf.AgentConfig)]
        return vf.resolve_env_config(env_config_dict(self.env_args, taskset, seats))

    def prepare(self, tasksets: Sequence[dict]) -> None:
        """Build the harness of each local seat of each taskset's environment now, not in step 1's episodes
        (verifiers_harness.py); without tasksets, of the seats `rollout.agent.args` names. A seat without a harness
        runs its taskset's default (verifiers' `bash` without one)."""
        vf = self.vf
        plays: list[dict | None] = [*tasksets] or [None]
        configs = [(self.env_config(t), vf.default_agent_harness(t["id"]) if t else
                    vf.harness_config_type("bash")(id="bash")) for t in plays]
        prepare_harnesses(vf, configs)

    async def run(self, row: dict, client: Any) -> dict[str, float]:
        column = row.get("verifiers")
        if not isinstance(column, dict):
            raise UserError("rollout.agent.program=verifiers plays rows of data.train_files=[verifiers:TASKSET]; "
                            "this row has no `verifiers` column.")
        vf = self.vf
        endpoint = vf.EvalClientConfig(base_url=str(client.base_url), api_key_var="GRPOFLOW_ENDPOINT_API_KEY",
                                       headers={EPISODE_HEADER: client.default_headers[EPISODE_HEADER]})
        ctx = vf.ModelContext(model=self.model_name, client=endpoint)
        if self._stack is not None:
            env = await self.serving_env(column["taskset"])
            return episode_rewards(await env.run_episode(task_of(column), ctx))
        env = vf.load_environment(self.env_config(column["taskset"]))   # outside a step scope: its own
        async with env.serving():
            episode = await env.run_episode(task_of(column), ctx)
        return episode_rewards(episode)

    __call__ = run


def build(agent_args: dict, model_name: str, data_files: list[str]) -> Any:
    """The agent of `rollout.agent.program=verifiers` for the `verifiers:` tasksets among `data_files`: called as
    `agent(row, client)`, with a `step_scope`."""
    tasksets = [parse_spec(spec)[0] for spec in data_files if is_verifiers(spec)]
    return VerifiersAgent(agent_args, model_name, tasksets)
