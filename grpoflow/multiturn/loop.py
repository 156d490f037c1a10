"""The agent loop: every trajectory of a step, turn by turn, against the rollout engines.

Each turn is one generate call over the trajectories still running (the engines batch them), with
`max_new_tokens` = the most any of them has left of its budget (`rollout.max_new_tokens` counts every
token after the prompt, the environment's included); a trajectory's sample is cut at its own
remaining budget, which gives the tokens and log-probs it would have had with its own limit. Then
each trajectory's turn is answered: tool calls in the text run (all trajectories' calls at once,
each with its timeout and limits), else the environment steps; its reply is appended as rendered
ids (`chat.ChatRenderer.continuation_ids`).

Randomness: turn t of sample j of prompt i draws from its own stream (from the call's seed and
(i, j, t)), the environment's seed is the same for a prompt's `n` trajectories, so a step's
trajectories do not depend on batching, placement or the other trajectories.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.multiturn.chat import ChatRenderer
from grpoflow.multiturn.env import Environment, final_reward, reset_env, step_env, with_system_prompt
from grpoflow.multiturn.tool_parser import ToolCall, parse_tool_calls
from grpoflow.multiturn.tool_runner import ToolRunner
from grpoflow.multiturn.trajectory import Segment, Trajectory, to_batch
from grpoflow.rollout.protocol import PromptTokens, SamplingParams
from grpoflow.rollout.random_streams import prompt_seeds

Generate = Callable[[list[PromptTokens], SamplingParams, "int | None"], Batch]
TURN_STRIDE = 1009  # turn t of sample j of prompt i draws from stream index (i * n + j) * TURN_STRIDE + t


@dataclass
class ToolUse:
    runner: ToolRunner
    parser: str = "hermes"
    max_calls_per_turn: int = 4
    max_output_tokens: int = 256


class AgentLoop:
    """Multi-turn rollouts: `run(items, params, seed)` -> (the trajectories as a Batch, their metrics)."""

    def __init__(self, renderer: ChatRenderer, generate: Generate, *, env_cls: Callable[[], Environment] | None,
                 tools: ToolUse | None, max_turns: int, opening: Callable[[PromptItem], list[dict]],
                 shared_first_turn: bool = True, system_prompt: str | None = None) -> None:
        """`generate(prompts, params, seed)`: the rollout group's sampling; `opening(item)`: the conversation's
        first messages when the environment gives none (the dataset prompt); `system_prompt` (data.system_prompt)
        opens every conversation that has no system message of its own. `shared_first_turn`: a prompt's
        `n` trajectories with the same opening prefill it once and draw their first turns from the prompt's
        group stream; False: every turn of every trajectory is its own n=1 call on stream
        `stream_index(i, n, j, t)`, as the agent endpoint's calls are (multiturn/endpoint.py)."""
        self.renderer, self.generate, self.env_cls, self.tools = renderer, generate, env_cls, tools
        self.max_turns, self.opening, self.shared_first_turn = max_turns, opening, shared_first_turn
        self.system_prompt = system_prompt
        self.pad_token_id = renderer.tokenizer.pad_token_id

    def run(self, items: list[PromptItem], params: SamplingParams, seed: int | None) -> tuple[Batch, dict[str, float]]:
        n, budget = params.n, params.max_new_tokens
        env_seeds = prompt_seeds(seed or 0, torch.tensor([it.index for it in items], dtype=torch.long)).tolist()
        trajectories, envs = [], []
        for item, env_seed in zip(items, env_seeds):
            for _ in range(n):
                env = self.env_cls() if self.env_cls is not None else None
                first = reset_env(env, item.row, env_seed) if env is not None else None
                messages = with_system_prompt(first if first is not None else self.opening(item), self.system_prompt)
                trajectories.append(Trajectory(self.renderer.prompt_ids(messages), list(messages)))
                envs.append(env)
        stream = [stream_index(it.index, n, j, 0) for it in items for j in range(n)]
        try:
            for turn in range(self.max_turns):
                active = [k for k, t in enumerate(trajectories) if not t.done]
                if not active:
                    break
                self.model_turn(trajectories, active, params, seed, stream, turn,
                                grouped=turn == 0 and self.shared_first_turn)
                self.answer(trajectories, envs, [k for k in active if not trajectories[k].done], turn, budget)
        finally:
            for t, env in zip(trajectories, envs):
                if env is not None:
                    t.rewards = final_reward(env, t.step_reward)
                    close = getattr(env, "close", None)
                    if close is not None:
                        close()
        prompts = [self.renderer.render(opening_messages(t.messages), add_generation_prompt=True)
                   for t in trajectories]
        batch = to_batch(trajectories, pad_token_id=self.pad_token_id, prompt_texts=prompts,
                         rows=[it.row for it in items for _ in range(n)])
        return batch.replace(group_ids=torch.arange(len(items)).repeat_interleave(n)), \
            trajectory_metrics(trajectories)

    def final(self, items: list[PromptItem], params: SamplingParams, seed: int | None) -> Batch:
        """The trajectories alone (validation): one per prompt and sample, prompt-major."""
        return self.run(items, params, seed)[0]

    def close(self) -> None:
        """Stop the tool processes."""
        if self.tools is not None:
            self.tools.runner.close()

    def model_turn(self, trajectories: list[Trajectory], active: list[int], params: SamplingParams,
                   seed: int | None, stream: list[int], turn: int, *, grouped: bool) -> None:
        """Sample one turn for each active trajectory and append it (cut at its remaining budget)."""
        budget = params.max_new_tokens
        n = params.n
        left = {k: budget - trajectories[k].used for k in active}
        stops = (self.renderer.turn.end_token_id,)
        # The first turn: a prompt's n trajectories share their opening, so it is prefilled once with n samples.
        same_openings = grouped and len(active) == len(trajectories) and all(
            trajectories[k].prompt_ids == trajectories[k - k % n].prompt_ids for k in active)
        if same_openings:
            prompts = [PromptTokens(trajectories[k].prompt_ids, stream[k] + turn) for k in active[::n]]
            turn_params = dataclasses.replace(params, max_new_tokens=max(left.values()), stop_token_ids=stops)
        else:
            prompts = [PromptTokens(trajectories[k].prompt_ids + trajectories[k].response_ids, stream[k] + turn)
                       for k in active]
            turn_params = dataclasses.replace(params, n=1, max_new_tokens=max(left.values()), stop_token_ids=stops)
        out = self.generate(prompts, turn_params, seed)
        for row, k in enumerate(active):
            t = trajectories[k]
            length = int(out.response_mask[row].sum())
            ids = out.response_ids[row, :length].tolist()
            log_probs = out.rollout_log_probs[row, :length].tolist() if out.rollout_log_probs is not None else \
                [0.0] * length
            cut = len(ids) > left[k]
            ids, log_probs = ids[:left[k]], log_probs[:left[k]]
            version = int(out.policy_version[row]) if out.policy_version is not None else 0
            t.segments.append(Segment(ids, log_probs, version))
            t.turns += 1
            t.messages.append({"role": "assistant", "content": self.renderer.decode(ids)})
            if cut or not ids or ids[-1] != self.renderer.turn.end_token_id:
                # out of budget (truncated), or the model ended the conversation (EOS rather than end of turn)
                t.done, t.truncated = True, cut or bool(out.truncated is not None and out.truncated[row])

    def answer(self, trajectories: list[Trajectory], envs: list[Environment | None], active: list[int],
               turn: int, budget: int) -> None:
        """Tool results or the environment's reply for each trajectory whose turn ended; appended as rendered ids."""
        replies: dict[int, list[dict]] = {}
        pending: list[tuple[int, int, ToolCall]] = []  # (trajectory, index of its reply, call)
        for k in active:
            t, text = trajectories[k], trajectories[k].messages[-1]["content"]
            parsed = parse_tool_calls(text, self.tools.parser) if self.tools is not None else None
            if self.tools is not None and parsed is not None and (parsed.calls or parsed.errors):
                if turn + 1 >= self.max_turns:
                    t.done = True  # the last turn: no reply could follow, so the calls are not run
                    continue
                limit = self.tools.max_calls_per_turn
                replies[k] = [tool_message(None, f"error: {e}") for e in parsed.errors]
                t.tool_calls += len(parsed.calls) + len(parsed.errors)
                t.tool_errors += len(parsed.errors)
                for i, call in enumerate(parsed.calls):
                    if i < limit:
                        pending.append((k, len(replies[k]), call))
                        replies[k].append(tool_message(call.name, ""))  # filled in below
                    else:
                        replies[k].append(tool_message(call.name, f"error: more than {limit} tool calls in one turn "
                                                                  "(rollout.max_tool_calls_per_turn); not run"))
                        t.tool_errors += 1
            elif envs[k] is not None:
                stepped = step_env(envs[k], text)  # type: ignore[arg-type]
                t.step_reward += stepped.reward
                t.done = stepped.done
                replies[k] = stepped.messages
            else:
                t.done = True  # no tool call and no environment: the model's answer ends the conversation
        if pending:
            assert self.tools is not None
            results = self.tools.runner.run([call for _, _, call in pending])
            for (k, at, call), result in zip(pending, results):
                t, content = trajectories[k], result.content
                t.tool_errors += result.status == "error"
                t.tool_timeouts += result.status in ("timeout", "killed")
                size = len(self.renderer.encode(content))
                if size > self.tools.max_output_tokens:
                    content = (f"error: the output of {call.name} was {size} tokens, over the limit of "
                               f"{self.tools.max_output_tokens} (rollout.max_tool_output_tokens)")
                    t.tool_errors += result.status != "error"
                replies[k][at]["content"] = content
        for k in active:
            t = trajectories[k]
            if t.done:
                continue
            if turn + 1 >= self.max_turns:
                t.done = True  # rollout.max_turns: the model's last turn ends the conversation
                continue
            ids = self.renderer.continuation_ids(t.messages, replies[k])
            if t.used + len(ids) >= budget:
                t.done, t.truncated = True, True  # the reply and one more token do not fit in the budget
                continue
            t.segments.append(Segment(ids))
            t.messages += replies[k]


def stream_index(item_index: int, n: int, sample: int, turn: int) -> int:
    """The random stream of turn `turn` of sample `sample` of the prompt with dataset index `item_index`."""
    return (item_index * n + sample) * TURN_STRIDE + turn


def opening_messages(messages: list[dict]) -> list[dict]:
    """The messages before the first assistant turn."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return messages[:first]


def tool_message(name: str | None, content: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": content}
    if name is not None:
        message["name"] = name
    return message


def trajectory_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """multi_turn/* and tools/* of a step's trajectories (tools/* are totals; the others means or maxima)."""
    turns = torch.tensor([t.turns for t in trajectories], dtype=torch.float32)
    tokens = sum(t.used for t in trajectories)
    out = {"multi_turn/turns/mean": turns.mean().item(), "multi_turn/turns/max": turns.max().item(),
           "multi_turn/env_token_share": sum(t.env_tokens for t in trajectories) / max(tokens, 1),
           "multi_turn/budget_truncated": sum(t.truncated for t in trajectories) / len(trajectories),
           "tools/calls": float(sum(t.tool_calls for t in trajectories)),
           "tools/errors": float(sum(t.tool_errors for t in trajectories)),
           "tools/timeouts": float(sum(t.tool_timeouts for t in trajectories))}
    parts = sorted({k for t in trajectories for k in t.rewards})
    for part in parts:
        out[f"reward/{part}/mean"] = sum(t.rewards.get(part, 0.0) for t in trajectories) / len(trajectories)
    return out
