"""trajectories.loop.EnvLoop with a scripted engine (the model's reply is a function of the conversation so far):
segments, masks, budgets, turn limits, environment seeds, tool calls and their failures, counted exactly."""

import re
import time

import pytest
import torch

from grpoflow.data.dataset import PromptItem
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.env import GuessNumber
from grpoflow.trajectories.loop import EnvLoop
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.tools import tool_from_function
from grpoflow.trajectories.trajectory import EndState
from grpoflow.trajectories.turns import ToolUse
from grpoflow.engines.protocol import SamplingParams
from grpoflow.engines.random_streams import prompt_seeds
from sandbox_tools import hog, spin
from scripted import ScriptedEngine, play


def binary_search(text):
    """Guess the middle of what the replies so far leave possible."""
    low, high = 1, 8
    guesses = [int(g) for g in re.findall(r"assistant\n(\d+)", text)]
    for g, reply in zip(guesses, re.findall(r"user\n(higher|lower)", text)):
        low, high = (g + 1, high) if reply == "higher" else (low, g - 1)
    return str((low + high) // 2)


LONG = SamplingParams(n=1, max_new_tokens=4000, temperature=1.0)


def items(secrets):
    return [PromptItem(prompt_ids=[], prompt_text="", row={"prompt": "Guess 1-8", "secret": s}, data_source="g",
                       index=i) for i, s in enumerate(secrets)]


def make_loop(policy, *, env=GuessNumber, tools=None, max_turns=4, tok=None, max_prompt_length=None):
    tok = tok or build_char_tokenizer()
    renderer = ChatRenderer(tok, tools.runner.schemas if tools else None)
    engine = ScriptedEngine(tok, policy, renderer.turn.end_token_id)
    loop = EnvLoop(renderer, env_cls=env, tools=tools, max_turns=max_turns,
                   opening=lambda row: [{"role": "user", "content": row["prompt"]}],
                   max_prompt_length=max_prompt_length)
    return loop, engine, renderer


def test_a_found_number_gives_model_and_env_segments_with_exact_masks():
    loop, engine, r = make_loop(binary_search)
    batch, metrics = play(loop, engine, items([6]), SamplingParams(n=2, max_new_tokens=200, temperature=1.0), seed=5)
    # 4 -> "higher", 6 -> found: two model turns, one environment reply between them
    m1, m2 = [r.encode("4") + [r.turn.end_token_id], r.encode("6") + [r.turn.end_token_id]]
    env = r.continuation_ids([{"role": "user", "content": "Guess 1-8"}, {"role": "assistant", "content": "4"}],
                             [{"role": "user", "content": "higher"}])
    expected = m1 + env + m2
    for row in range(2):
        length = int(batch.response_attention[row].sum())
        assert batch.response_ids[row, :length].tolist() == expected
        assert batch.response_mask[row, :length].tolist() == [1, 1] + [0] * len(env) + [1, 1]
        assert batch.rollout_log_probs[row, :length].tolist() == pytest.approx(
            [-0.01, -0.02] + [0.0] * len(env) + [-0.01, -0.02])
    assert batch.env_rewards.tolist() == [1.0, 1.0]
    assert batch.completions == ["6", "6"] and batch.truncated.tolist() == [False, False]
    assert batch.group_ids.tolist() == [0, 0] and batch.policy_version.tolist() == [3, 3]
    assert [m["content"] for m in batch.conversations[0]] == ["Guess 1-8", "4", "higher", "6"]
    assert batch.prompts[0] == r.render(batch.conversations[0][:1], add_generation_prompt=True)
    assert metrics["multi_turn/turns/mean"] == 2 and metrics["multi_turn/budget_truncated"] == 0
    assert metrics["multi_turn/env_token_share"] == pytest.approx(len(env) / len(expected))
    # one request per trajectory and turn; the second turns name their trajectory, whose KV the engine keeps
    first, second = engine.calls
    assert len(first) == 2 and first[0].prompt_ids == first[1].prompt_ids and first[0].stream != first[1].stream
    assert [q.key for q in second] == [0, 1]
    assert second[0].prompt_ids[:len(first[0].prompt_ids) + 2] == first[0].prompt_ids + tuple(m1)


def test_each_turn_asks_for_the_most_budget_left_and_a_trajectory_is_cut_at_its_own():
    loop, engine, r = make_loop(lambda text: "7" * 10)   # never finds it, long guesses
    batch, metrics = play(loop, engine, items([3]), SamplingParams(n=1, max_new_tokens=30, temperature=1.0), seed=0)
    # turn 1: 11 tokens (10 + end); the reply "lower" costs 25 ids; 11 + 25 = 36 > 30: it does not fit
    assert engine.calls[0][0].max_new_tokens == 30
    assert batch.truncated.tolist() == [True] and metrics["multi_turn/budget_truncated"] == 1.0
    assert int(batch.response_attention.sum()) == 11
    loop, engine, r = make_loop(lambda text: "7" * 40)
    batch, _ = play(loop, engine, items([3]), SamplingParams(n=1, max_new_tokens=30, temperature=1.0), seed=0)
    assert batch.response_mask.sum().item() == 30 and batch.truncated.tolist() == [True]


def test_max_turns_ends_the_conversation_after_the_models_turn():
    loop, engine, r = make_loop(lambda text: "1", max_turns=3)
    batch, metrics = play(loop, engine, items([8]), SamplingParams(n=1, max_new_tokens=500, temperature=1.0), seed=0)
    assert metrics["multi_turn/turns/max"] == 3 and batch.env_rewards.tolist() == [0.0]
    assert batch.truncated.tolist() == [False]
    assert [m["role"] for m in batch.conversations[0]] == ["user", "assistant", "user", "assistant", "user",
                                                           "assistant"]
    # the last token trained is the model's end of turn: nothing after it
    assert batch.response_ids[0, int(batch.response_attention[0].sum()) - 1].item() == r.turn.end_token_id


class DigitReward:
    """One step: reward 1 when the answer holds a digit."""

    def reset(self, **_):
        return "Say a number"

    def step(self, text):
        return None, True, float(any(c.isdigit() for c in text))


def test_the_environment_scores_a_turn_that_ends_with_eos():
    loop, engine, r = make_loop(lambda text: "42", env=DigitReward)
    engine.end_id = engine.tok.eos_token_id  # the model ends its answer with EOS, not with the end-of-turn token
    batch, metrics = play(loop, engine, items([1]), SamplingParams(n=2, max_new_tokens=50, temperature=1.0), seed=0)
    assert batch.env_rewards.tolist() == [1.0, 1.0] and metrics["reward/env/mean"] == 1.0
    assert metrics["multi_turn/turns/max"] == 1 and batch.truncated.tolist() == [False, False]


class Chatty(DigitReward):
    def reset(self, **_):
        return "Say a number. " * 20


def test_an_environments_opening_over_the_prompt_length_ends_its_trajectory(caplog):
    loop, engine, _ = make_loop(lambda text: "4", env=Chatty, max_prompt_length=100)
    batch, metrics = play(loop, engine, items([1]), SamplingParams(n=1, max_new_tokens=50, temperature=1.0), seed=0)
    assert batch.infos[0].end is EndState.ERROR and metrics["rollout/ending/error"] == 1.0
    assert any(re.search(r"Chatty.reset opened a conversation of \d+ tokens, over data.max_prompt_length=100",
                         r.getMessage()) for r in caplog.records)


class SeededSecret(GuessNumber):
    """The secret comes only from the seed (no `secret` column)."""
    seen: list = []

    def reset(self, *, seed, **_):
        out = super().reset(seed=seed)
        SeededSecret.seen.append((seed, self.secret))
        return out


def test_a_groups_trajectories_start_from_the_same_environment_seed():
    SeededSecret.seen = []
    loop, engine, _ = make_loop(binary_search, env=SeededSecret)
    its = [PromptItem([], "", {"prompt": "Guess 1-8"}, "g", index=i) for i in (0, 7, 11)]
    play(loop, engine, its, SamplingParams(n=3, max_new_tokens=200, temperature=1.0), seed=42)
    seeds = [s for s, _ in SeededSecret.seen]
    expected = prompt_seeds(42, torch.tensor([0, 7, 11])).tolist()
    assert seeds == [e for e in expected for _ in range(3)]
    secrets = [s for _, s in SeededSecret.seen]
    assert all(len(set(secrets[g * 3:(g + 1) * 3])) == 1 for g in range(3))


def divide(a: float, b: float) -> float:
    """Divide.

    Args:
        a: numerator
        b: denominator
    """
    return a / b


def wait(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"


def shout(text: str) -> str:
    """Repeat loudly.

    Args:
        text: what to repeat
    """
    return text.upper() * 100


CALLS = ('<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>'   # raises
         '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'                   # unknown tool
         '<tool_call>{"name": "divide", "arguments": {"a": 6, "b": 3}}</tool_call>'   # fine
         '<tool_call>{"name": "wait", "arguments": {"seconds": 30}}</tool_call>'      # hangs
         '<tool_call>{"name": "shout", "arguments": {"text": "ab"}}</tool_call>'      # 200 chars: over 80 tokens
         '<tool_call>{"name": divide}</tool_call>')                                  # malformed JSON


def test_tool_failures_reach_the_model_as_messages_and_are_counted_exactly():
    runner = ToolRunner([tool_from_function(f, sandboxed=False) for f in (divide, wait, shout)], timeout_s=1.0)
    tools = ToolUse(runner, max_calls_per_turn=5, max_output_tokens=80)
    policy = lambda text: "done" if "<|im_start|>tool" in text else CALLS  # noqa: E731
    loop, engine, _ = make_loop(policy, env=None, tools=tools)
    start = time.perf_counter()
    with runner:
        batch, metrics = play(loop, engine, items([1]), LONG, seed=0)
    assert time.perf_counter() - start < 1.0 + 5.0   # the hung call cost its timeout, not 30 s
    tool_messages = [m["content"] for m in batch.conversations[0] if m["role"] == "tool"]
    # the malformed call first (parse errors), then the 5 parsed calls in order
    assert len(tool_messages) == 6
    assert tool_messages[0].startswith("error")
    assert "division by zero" in tool_messages[1] and "unknown tool 'nope'" in tool_messages[2]
    assert tool_messages[3] == "2.0"
    assert "timed out" in tool_messages[4] or "timeout" in tool_messages[4]
    assert "over the limit of 80" in tool_messages[5]
    assert metrics["tools/calls"] == 6 and metrics["tools/timeouts"] == 1
    assert metrics["tools/errors"] == 4   # malformed, raised, unknown, output too long
    assert batch.completions == ["done"] and metrics["multi_turn/turns/mean"] == 2


def test_calls_beyond_the_per_turn_limit_are_not_run():
    runner = ToolRunner([tool_from_function(divide, sandboxed=False)])
    tools = ToolUse(runner, max_calls_per_turn=1)
    call = '<tool_call>{"name": "divide", "arguments": {"a": 4, "b": 2}}</tool_call>'
    loop, engine, _ = make_loop(lambda text: "ok" if "tool" in text else call * 3, env=None, tools=tools)
    with runner:
        batch, metrics = play(loop, engine, items([1]), LONG, seed=0)
    tool_messages = [m["content"] for m in batch.conversations[0] if m["role"] == "tool"]
    assert tool_messages[0] == "2.0" and all("more than 1 tool calls" in m for m in tool_messages[1:])
    assert metrics["tools/calls"] == 3 and metrics["tools/errors"] == 2


def test_sandboxed_tools_that_spin_or_hog_memory_are_killed_and_the_step_goes_on():
    # the tools' module imports nothing heavy: a sandboxed worker imports it, under the 300 MB limit
    runner = ToolRunner([tool_from_function(spin), tool_from_function(hog)], timeout_s=5.0, cpu_time_s=1.0,
                        memory_mb=300)
    tools = ToolUse(runner)
    calls = ('<tool_call>{"name": "spin", "arguments": {"n": 0}}</tool_call>'
             '<tool_call>{"name": "hog", "arguments": {"mb": 2000}}</tool_call>'
             '<tool_call>{"name": "hog", "arguments": {"mb": 1}}</tool_call>')
    loop, engine, _ = make_loop(lambda text: "done" if "<|im_start|>tool" in text else calls, env=None, tools=tools)
    start = time.perf_counter()
    with runner:
        batch, metrics = play(loop, engine, items([1]), LONG, seed=0)
    assert time.perf_counter() - start < 5.0 + 10.0   # the spinning call ends at its CPU limit, not at timeout
    spun, hogged, fine = [m["content"] for m in batch.conversations[0] if m["role"] == "tool"]
    assert spun.startswith("error") and hogged.startswith("error") and fine == str(2**20)
    assert metrics["tools/calls"] == 3 and metrics["tools/timeouts"] == 2 and metrics["tools/errors"] == 0


def test_tool_calls_on_the_last_turn_are_not_run():
    runner = ToolRunner([tool_from_function(wait, sandboxed=False)], timeout_s=5.0)
    call = '<tool_call>{"name": "wait", "arguments": {"seconds": 3}}</tool_call>'
    loop, engine, _ = make_loop(lambda text: call, env=None, tools=ToolUse(runner), max_turns=2)
    start = time.perf_counter()
    with runner:
        batch, metrics = play(loop, engine, items([1]), LONG, seed=0)
    assert metrics["tools/calls"] == 1 and metrics["multi_turn/turns/max"] == 2
    assert [m["role"] for m in batch.conversations[0]] == ["user", "assistant", "tool", "assistant"]
    assert time.perf_counter() - start < 3.0 * 2   # one call ran, not two


def test_the_system_prompt_opens_a_conversation_once():
    from grpoflow.trajectories.env import with_system_prompt
    user = [{"role": "user", "content": "Guess 1-8"}]
    assert with_system_prompt(user, "Be brief.") == [{"role": "system", "content": "Be brief."}] + user
    own = [{"role": "system", "content": "Mine."}] + user
    assert with_system_prompt(own, "Be brief.") == own            # the conversation's own system message stays
    assert with_system_prompt(user, None) == with_system_prompt(user, "") == user
