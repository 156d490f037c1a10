"""Trajectories of every kind (docs/multi-turn.md): single-turn samples, and conversations where the model acts over
several turns against environments and tools; each trajectory is one training sample, token-exact.

    chat.py         ChatRenderer: token-exact rendering (continuations as chat-template suffixes, the end-of-turn
                    separator restored), the prefix-preserving template check
    env.py          the environment contract (reset / step / get_reward / close), registry, guess_number
    reasoning_gym_env.py  reasoning_gym: a reasoning-gym task the model may retry after "wrong" (extra reasoning-gym)
    openenv_env.py  openenv: one OpenEnv client session per trajectory, observations as user messages (extra openenv)
    trajectory.py   Trajectory: prompt ids + segments (sampled ids with log-probs and version | rendered ids) -> Batch;
                    a paused one's open turn, from which it goes on in a later rollout (rollout.partial)
    loop.py         trajectories as coroutines over the request batcher: SingleTurn, EnvLoop (environment, tools),
                    each resuming from its own previous output when rollout.partial paused it (a conversation's
                    environment rebuilt by replay, its replies checked); play_each, the one driver, with its pause
                    Quota
    turns.py        what every trajectory shares: random streams, budget and end-of-turn rules, tool calls, SampleInfo
    rollout.py      run_rollout: a kind's trajectories over a RequestBatcher (engines/batcher.py) -> one Batch
    tools.py        Tool, tool_from_function (typed function + docstring -> chat-template schema), the
                    tool registry, load_tools(specs); the built-ins are registered from builtin_tools.py
    builtin_tools.py  calculator (safe arithmetic via `ast`) and python (runs code; sandboxed); how tool calls are
                    written in the model's text is data/tool_format.py (parse, render, strip: one entry per format)
    tool_runner.py  ToolResult, ToolRunner: each call under a timeout; sandboxed tools in worker processes
                    with CPU-time, memory and output limits (grpoflow/user_code.py)

Agent programs through an OpenAI-compatible endpoint (docs/agents.md; extra `agents`: fastapi, uvicorn, openai):

    endpoint.py     Endpoint: /v1/chat/completions and /v1/models on uvicorn in a thread, each call sent to the
                    request batcher as it arrives (one random stream per call), each call recorded
    openai_api.py   the wire format: requests checked and rendered as template messages, replies, OpenAI errors
    episode.py      EpisodeRecord: an episode's calls -> samples (merged token for token, else split; budgets)
    agents.py       AgentEpisodes: `async def run(row, client)` played n times per row, timeouts, errors
    verifiers_agent.py  rollout.agent.program=verifiers: a verifiers environment's own rollout, its rubric as the reward
                    (extra verifiers)
    verifiers_harness.py  verifiers' harness programs (uv scripts) built once per process before step 1, with uv's
                    offline settings honoured; one error when one cannot be built

A part beside `engines` (docs/architecture.md, "The rollout chain", places multi-turn with the rollout): it drives
the engines through the request batcher it is given and imports no workers, placement, controller or config. This
file imports nothing: tool worker processes import the tool modules, and nothing heavier.
"""
