"""The agent endpoint with a scripted engine, through the official `openai` client: replies, tool calls, OpenAI
errors and their status codes, batching, calls merged into samples or split, budgets, stop strings; agent episodes
that raise, hang or never call the model."""

import asyncio
import json

import httpx
import openai
import pytest

from grpoflow.data.dataset import PromptItem
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.trajectories.agents import AgentEpisodes, reward_parts
from grpoflow.trajectories.episode import EpisodeRecord
from grpoflow.trajectories.trajectory import EndState
from grpoflow.trajectories.turns import stream_seed
from grpoflow.engines.protocol import SamplingParams
from scripted import ScriptedEngine, final, play, serving

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Exact arithmetic.",
                                           "parameters": {"type": "object",
                                                          "properties": {"expression": {"type": "string"}},
                                                          "required": ["expression"]}}}]


def calculator_policy(text):
    return "42" if "<|im_start|>tool" in text else CALL


@pytest.fixture
def served():
    """An endpoint over a scripted engine (calculator_policy unless the test swaps `engine.policy`)."""
    tok = build_char_tokenizer()
    engine = ScriptedEngine(tok, calculator_policy, None, version=5)
    with serving(engine, tok) as endpoint:
        yield endpoint, engine


def session(endpoint, episodes=1, budget=500, n=1):
    return endpoint.sessions.open(endpoint, episodes=episodes, budget=budget, n=n)


def client(endpoint, episode=None):
    headers = {"X-Episode-Id": episode} if episode else {}
    return openai.OpenAI(base_url=endpoint.url, api_key="x", max_retries=0, default_headers=headers)


def test_a_tool_call_and_its_result_merge_into_one_sample_with_exact_ids_and_masks(served):
    endpoint, engine = served
    r = endpoint.renderer
    (episode,) = session(endpoint)
    c = client(endpoint, episode)
    assert [m.id for m in c.models.list().data] == ["policy"]
    messages = [{"role": "user", "content": "6*7"}]
    first = c.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "6*7"}
    assert first.usage.prompt_tokens == len(r.prompt_ids(messages)) and first.usage.completion_tokens == len(CALL) + 1
    # the agent appends the message as the client returned it, and the tool's result
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    second = c.chat.completions.create(model="policy", messages=messages, tools=TOOLS, logprobs=True)
    assert second.choices[0].message.content == "42" and second.choices[0].finish_reason == "stop"
    assert [t.logprob for t in second.choices[0].logprobs.content] == pytest.approx([-0.01, -0.02, -0.03])
    (record,) = endpoint.close_session().values()
    (sample,) = record.samples
    history = [{"role": "user", "content": "6*7"}, {"role": "assistant", "content": CALL}]
    env = r.continuation_ids(history, [{"role": "tool", "name": "calculator", "content": "42"}])
    m1, m2 = r.encode(CALL) + [r.turn.end_token_id], r.encode("42") + [r.turn.end_token_id]
    assert sample.prompt_ids == r.prompt_ids(history[:1])
    assert [s.ids for s in sample.segments] == [m1, env, m2]
    assert [s.trainable for s in sample.segments] == [True, False, True]
    assert sample.segments[2].log_probs == pytest.approx([-0.01, -0.02, -0.03])
    assert sample.turns == 2 and sample.tool_calls == 1 and sample.version == 5
    assert sample.messages[-1] == {"role": "assistant", "content": "42"}
    # one request per call, its own stream per turn (as turn t of trajectory 0 of prompt 3), the template's stop
    # token; the second names the episode, whose KV cache the engine kept
    assert [[(q.stop_token_ids, q.stream, q.key) for q in tick] for tick in engine.calls] == \
        [[((r.turn.end_token_id,), stream_seed(7, 3, 1, 0, t), 0)] for t in (0, 1)]


def test_requests_of_concurrent_episodes_are_batched_into_one_generate_call(served):
    endpoint, engine = served
    engine.policy = lambda text: "ok"
    ids = session(endpoint, episodes=6, n=6)

    async def all_episodes():
        async with openai.AsyncOpenAI(base_url=endpoint.url, api_key="x", max_retries=0) as c:
            return await asyncio.gather(*(c.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": f"hi {k}"}], user=e)
                for k, e in enumerate(ids)))

    replies = asyncio.run(all_episodes())
    assert [r.choices[0].message.content for r in replies] == ["ok"] * 6
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 6   # all six episodes waited: admitted at one tick
    assert [q.stream for q in engine.calls[0]] == [stream_seed(7, 3, 6, j, 0) for j in range(6)]
    records = endpoint.close_session()
    assert all(len(records[e].samples) == 1 for e in ids)


def error_of(excinfo):
    body = excinfo.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return excinfo.value.status_code, body["error"]


def test_a_streamed_call_gets_the_same_reply_as_chunks_and_is_recorded_the_same(served):
    """Agents that always stream (verifiers' chat harness does) read the reply the official client rebuilds from
    the chunks: the tool call with its arguments, the finish reason, the usage; the sample holds the same ids."""
    endpoint, engine = served
    r = endpoint.renderer
    (episode,) = session(endpoint)
    c = client(endpoint, episode)
    messages = [{"role": "user", "content": "6*7"}]
    with c.chat.completions.stream(model="policy", messages=messages, tools=TOOLS,
                                   stream_options={"include_usage": True}) as stream:
        events = [e for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "6*7"}
    assert final.usage.prompt_tokens == len(r.prompt_ids(messages)) and final.usage.completion_tokens == len(CALL) + 1
    assert len(events) == 3 and events[-1].chunk.choices == []   # the message, the finish reason, the usage
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    raw = httpx.post(endpoint.url + "/chat/completions", headers={"X-Episode-Id": episode},
                     json={"model": "policy", "messages": messages, "tools": TOOLS, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in raw.text.split("\n\n") if line]
    assert lines[-1] == "data: [DONE]" and len(lines) == 3                   # no usage chunk unless asked
    assert json.loads(lines[0].removeprefix("data: "))["choices"][0]["delta"]["content"] == "42"
    (record,) = endpoint.close_session().values()
    (sample,) = record.samples   # the second call continued the first, token for token
    assert [s.ids for s in sample.segments][::2] == [r.encode(CALL) + [r.turn.end_token_id],
                                                     r.encode("42") + [r.turn.end_token_id]]


def test_bad_requests_get_openai_errors_with_their_status_codes(served):
    endpoint, _ = served
    (episode,) = session(endpoint)
    c = client(endpoint, episode)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=[])
    assert error_of(e)[0] == 400 and error_of(e)[1]["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        c.post("/chat/completions", body={"model": "policy"}, cast_to=dict)   # no messages at all
    assert error_of(e)[1]["code"] == "missing_required_parameter"
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert error_of(e)[0] == 404 and error_of(e)[1]["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], n=2)
    assert error_of(e)[1]["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], temperature=3)
    assert error_of(e)[1]["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=[{"role": "wizard", "content": "hi"}])
    assert error_of(e)[1]["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as e:   # no episode id
        client(endpoint).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert error_of(e)[1]["code"] == "missing_episode_id"
    with pytest.raises(openai.NotFoundError) as e:
        client(endpoint, "s99-p0-e0").chat.completions.create(model="policy",
                                                              messages=[{"role": "user", "content": "hi"}])
    assert error_of(e)[1]["code"] == "episode_not_found"
    raw = httpx.post(endpoint.url + "/chat/completions", content=b"{not json", headers={"X-Episode-Id": episode})
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    missing = httpx.get(endpoint.url + "/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert httpx.get(endpoint.url + "/models/policy").json()["id"] == "policy"
    (record,) = endpoint.close_session().values()
    assert record.calls == 0 and record.samples == []   # refused requests are neither counted nor recorded


def test_calls_beyond_max_turns_are_refused(served):
    endpoint, engine = served
    engine.policy = lambda text: "a"
    (episode,) = session(endpoint)
    c = client(endpoint, episode)
    messages = [{"role": "user", "content": "go"}]
    for _ in range(4):
        reply = c.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=messages)
    assert error_of(e)[1]["code"] == "max_turns_exceeded"
    (record,) = endpoint.close_session().values()
    assert len(record.samples) == 1 and record.samples[0].turns == 4


def test_a_rewritten_history_starts_a_new_sample(served):
    endpoint, engine = served
    engine.policy = lambda text: "x" * (text.count("<|im_start|>user"))
    (episode,) = session(endpoint)
    c = client(endpoint, episode)
    a = [{"role": "user", "content": "one"}]
    a.append(c.chat.completions.create(model="policy", messages=a).choices[0].message.model_dump(exclude_none=True))
    a.append({"role": "user", "content": "two"})
    c.chat.completions.create(model="policy", messages=a)
    # the agent summarises: the first exchange replaced by a note
    c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "summary; two"}])
    (record,) = endpoint.close_session().values()
    assert [s.turns for s in record.samples] == [2, 1] and record.last == 1
    assert record.samples[1].prompt_ids == endpoint.renderer.prompt_ids([{"role": "user", "content": "summary; two"}])


def test_merging_and_splitting_by_hand():
    rec = EpisodeRecord(budget=10)
    p = rec.place([1, 2])
    assert (p.sample, p.left) == (None, 10)
    rec.record(p, [1, 2], [], [7, 8], [-0.1, -0.2], 3, out_of_budget=False)
    # extends prompt + completion: the ids between are the masked extension, the budget is what is left
    p = rec.place([1, 2, 7, 8, 9, 9])
    assert (p.sample, p.extension, p.left) == (0, [9, 9], 10 - 2 - 2)
    assert rec.place([1, 2, 7, 8, 9, 9]).sample is None   # sample 0 has a call in flight: a concurrent call splits
    rec.record(p, [1, 2, 7, 8, 9, 9], [], [5], [-0.5], 2, out_of_budget=False)
    t = rec.samples[0]
    assert [(s.ids, s.log_probs) for s in t.segments] == [([7, 8], [-0.1, -0.2]), ([9, 9], None), ([5], [-0.5])]
    assert t.version == 2 and t.used == 5
    # differs inside the completion (the agent edited the reply): a new sample
    assert rec.place([1, 2, 7, 6, 9]).sample is None
    # the extension and one token no longer fit (5 used + 5 new = 10): sample 0 ends truncated, a new one starts
    p = rec.place([1, 2, 7, 8, 9, 9, 5, 4, 4, 4, 4, 4])
    assert (p.sample, p.ended, p.left) == (None, 0, 10)
    rec.record(p, [1, 2, 7, 8, 9, 9, 5, 4, 4, 4, 4, 4], [], [3], [-0.3], 2, out_of_budget=False)
    assert rec.samples[0].end is EndState.TOKEN_BUDGET and len(rec.samples) == 2 and rec.last == 1
    # a call cut at its sample's budget ends the sample: the next call cannot continue it
    rec2 = EpisodeRecord(budget=3)
    p = rec2.place([1])
    rec2.record(p, [1], [], [4, 4, 4], [0.0] * 3, 0, out_of_budget=True)
    assert rec2.samples[0].end.is_truncated and rec2.place([1, 4, 4, 4, 9]).sample is None


def test_a_reply_cut_at_the_budget_is_length_and_its_sample_ends(served):
    endpoint, engine = served
    engine.policy = lambda text: "y" * 50
    (episode,) = session(endpoint, budget=20)
    c = client(endpoint, episode)
    reply = c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}], max_tokens=500)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 20
    short = c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}], max_tokens=4)
    assert short.choices[0].message.content == "yyyy" and short.choices[0].finish_reason == "length"
    (record,) = endpoint.close_session().values()
    assert record.samples[0].end.is_truncated                 # out of the sample's budget
    assert not record.samples[1].end.is_truncated             # cut by the agent's own max_tokens: the sample goes on


def test_stop_strings_cut_the_reply(served):
    endpoint, engine = served
    engine.policy = lambda text: "abc STOP def"
    (episode,) = session(endpoint)
    reply = client(endpoint, episode).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "go"}], stop=["STOP", "zzz"])
    assert reply.choices[0].message.content == "abc " and reply.choices[0].finish_reason == "stop"
    (record,) = endpoint.close_session().values()
    assert record.samples[0].segments[0].ids == endpoint.renderer.encode("abc STOP")


def items(n_items):
    return [PromptItem([], "", {"prompt": f"p{i}", "answer": "42"}, "calc", index=i) for i in range(n_items)]


def opening(row):
    return [{"role": "user", "content": row["prompt"]}]


def test_agent_episodes_form_groups_and_failures_are_scored_and_counted(served):
    endpoint, engine = served

    async def agent(row, client):
        k = int(row["prompt"][1:])
        if k == 1:
            raise ValueError("the agent's own bug")
        if k == 2:
            await asyncio.sleep(60)    # hangs: cancelled at the timeout
        if k == 3:
            return 0.5                 # never calls the model
        messages = [{"role": "user", "content": row["prompt"]}]
        first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "42"}]
        final = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        if k == 4:   # a second, rewritten conversation: two samples
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}])
        return {"correct": float(final.choices[0].message.content == row["answer"]), "style": 0.25}

    episodes = AgentEpisodes(agent, endpoint, timeout_s=1.0, error_score=-1.0, opening=opening)
    batch, metrics = play(episodes, engine, items(5), SamplingParams(n=2, max_new_tokens=300, temperature=1.0), 0,
                          agent=True)
    # episodes per prompt: 0 -> 1 sample each, 1 -> error (empty), 2 -> timeout (empty), 3 -> no call (empty), 4 -> 2
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4]
    assert batch.env_rewards.tolist() == [1.25, 1.25, -1, -1, -1, -1, 0.5, 0.5, 1.25, 1.25, 1.25, 1.25]
    # the call, its end of turn, "42" and its end of turn; the rewritten conversation: the call alone
    assert batch.response_mask[2:8].sum() == 0 and batch.response_mask[[0, 1, 8, 10]].sum(-1).tolist() == \
        [len(CALL) + 4] * 4 and batch.response_mask[9].sum() == len(CALL) + 1
    assert metrics["agent/errors"] == 2 and metrics["agent/timeouts"] == 2
    assert batch.policy_version.tolist() == [5] * 12   # empty samples take the policy of the others
    assert metrics["agent/calls/mean"] == (2 * 2 + 2 * 3) / 10 and metrics["agent/samples/mean"] == (2 + 4) / 10
    assert metrics["reward/agent/correct/mean"] == pytest.approx(6 / 12)
    assert batch.completions[0] == "42" and batch.conversations[0][0] == {"role": "user", "content": "p0"}
    # validation: one sample per episode, the last conversation of each
    last = final(play(episodes, engine, items(5), SamplingParams(n=2, max_new_tokens=300, temperature=0.0), 1)[0])
    assert len(last) == 10 and last.conversations[8] == [{"role": "user", "content": "again"},
                                                          {"role": "assistant", "content": CALL}]
    assert last.conversations[0][0] == {"role": "user", "content": "p0"}


def test_reward_parts_reject_what_is_not_a_number():
    assert reward_parts(1) == {"agent": 1.0} and reward_parts({"a": 0.5}) == {"agent/a": 0.5}
    for bad in (None, "1", float("nan"), {"a": "x"}, True):
        with pytest.raises(TypeError, match="return a finite number"):
            reward_parts(bad)


def test_an_engine_failure_is_raised_as_such_not_scored_as_the_agents(served):
    endpoint, engine = served

    def broken(text):
        raise RuntimeError("CUDA out of memory")

    engine.policy = broken
    seen = []

    async def agent(row, client):
        try:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        except openai.InternalServerError as e:
            seen.append(e.response.json()["error"]["code"])
            raise
        return 1.0

    episodes = AgentEpisodes(agent, endpoint, timeout_s=5.0, error_score=0.0, opening=opening)
    with pytest.raises(RuntimeError, match="rollout engine failed while serving agent calls: RuntimeError: CUDA"):
        play(episodes, engine, items(1), SamplingParams(n=2, max_new_tokens=50, temperature=1.0), 0, agent=True)
    assert seen == ["engine_error", "engine_error"]


def test_an_agent_that_blocks_the_event_loop_is_abandoned_after_the_grace_period(served, monkeypatch):
    import time

    import grpoflow.trajectories.agents as agents

    endpoint, engine = served
    monkeypatch.setattr(agents, "GRACE_S", 0.5)

    async def agent(row, client):
        time.sleep(3)   # synchronous: no await, so wait_for cannot cancel it
        return 1.0

    episodes = AgentEpisodes(agent, endpoint, timeout_s=0.5, error_score=-2.0, opening=opening)
    start = time.perf_counter()
    batch, metrics = play(episodes, engine, items(1), SamplingParams(n=2, max_new_tokens=50, temperature=1.0), 0,
                          agent=True)
    assert time.perf_counter() - start < 2.5
    assert metrics["agent/timeouts"] == 2 and batch.env_rewards.tolist() == [-2.0, -2.0]


def test_messages_become_template_messages():
    from grpoflow.trajectories.openai_api import template_messages

    ours = {"call_1": "raw reply <tool_call>...</tool_call>"}
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "6*7"},
        {"role": "assistant", "content": None, "tool_calls": [   # made by this endpoint: its reply text
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [   # made elsewhere: written as Hermes
            {"id": "other", "type": "function",
             "function": {"name": "calculator", "arguments": '{"expression": "1"}'}}]},
    ]
    assert template_messages(messages, ours, {"call_1": "calculator"}) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "6*7"},
        {"role": "assistant", "content": "raw reply <tool_call>...</tool_call>"},
        {"role": "tool", "content": "42", "name": "calculator"},
        {"role": "assistant", "content": 'Let me check.<tool_call>{"name": "calculator", "arguments": '
                                         '{"expression": "1"}}</tool_call>'}]
