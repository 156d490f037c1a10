"""What every kind of trajectory shares: random streams, reading a sampled turn, the budget and end-of-turn
rules, running a turn's tool calls, and the per-sample facts a rollout returns.

The rules, once for the environment loop (loop.py) and the agent endpoint (endpoint.py):

- **Streams.** Turn t of sample j of the prompt with dataset index i draws from `stream_seed(seed, i, n, j, t)`.
  Turn 0 is the stream a single-turn sample j of that prompt draws from; so an agent call, an environment
  turn and a plain sample with the same (i, j, t) sample the same tokens.
- **Budget.** `rollout.max_new_tokens` counts every token after the prompt, the environment's included. A
  turn may sample what is left; a turn cut there (finish "length") ends the trajectory, truncated; a reply
  that leaves no room for one more token ends it too, truncated.
- **End of turn.** A turn that ends with the template's end-of-turn token may be answered; one that ends
  with EOS, or is cut, ends the conversation after the environment has seen it. `read_turn` reads how a turn
  stopped, for both: the loop ends the trajectory on EOS or a cut (`EndState`); the endpoint replies
  `finish_reason` "stop" to a turn that ended with either end token and "length" to one that did not.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from grpoflow.data.tool_format import HERMES, ToolCall, ToolFormat
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.trajectory import EndState, Segment, Trajectory
from grpoflow.engines.protocol import Completion
from grpoflow.engines.random_streams import prompt_seeds, row_seeds

TURN_STRIDE = 1009  # turn t of sample j of prompt i: stream index (i * n + j) * TURN_STRIDE + t, for t >= 1
TURN_SALT = 0x5BD1E995  # later turns draw from seeds of their own (a turn-t index never meets a dataset index)


def stream_index(item_index: int, n: int, sample: int, turn: int) -> int:
    """The stream index of turn `turn` (>= 1) of sample `sample` of the prompt with dataset index `item_index`."""
    return (item_index * n + sample) * TURN_STRIDE + turn


def stream_seed(seed: int | None, item_index: int, n: int, sample: int, turn: int) -> int:
    """The 32-bit seed of the random stream of that turn (see the module docstring)."""
    if turn == 0:
        return int(row_seeds(prompt_seeds(seed or 0, torch.tensor([item_index])), n)[sample])
    index = torch.tensor([stream_index(item_index, n, sample, turn)])
    return int(row_seeds(prompt_seeds((seed or 0) ^ TURN_SALT, index), 1)[0])


def first_turn_seeds(seed: int | None, item_indices: list[int], n: int) -> list[int]:
    """`stream_seed(seed, i, n, j, 0)` of every (item, j), prompt-major, in one vectorised call."""
    return row_seeds(prompt_seeds(seed or 0, torch.tensor(item_indices, dtype=torch.long)), n).tolist()


def env_seeds(seed: int | None, item_indices: list[int]) -> list[int]:
    """The environment seed of each item's conversations (the same for its n trajectories: one start state)."""
    return prompt_seeds(seed or 0, torch.tensor(item_indices, dtype=torch.long)).tolist()


@dataclass
class SampleInfo:
    """What is logged of a sample (Batch.infos): its facts, for the step's metrics and the sample logs."""
    turns: int = 1
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    rewards: dict[str, float] = field(default_factory=dict)  # the environment's or agent's reward parts
    prefilled: int = 0      # prompt tokens the engine computed for its turns (not reused, not shared)
    context: int = 0        # prompt tokens of its turns (what prefilling each turn from scratch would compute)
    kv_reused: int = 0      # prompt tokens of its turns whose KV the engine kept from its turn before
    kv_evicted: int = 0     # other trajectories' kept KV caches that keeping its own pushed out (HF engine)
    end: EndState = EndState.RUNNING  # why it ended (an agent episode's samples: the episode's error or timeout)


@dataclass
class Carried:
    """What is carried with a sample (Batch.carried): where it belongs and how it goes on, for the controller (the
    curriculum, validation, the partial rollout's pool); never logged."""
    final: bool = True      # the sample of its episode that validation scores (an episode's latest call)
    episode: int = 0        # the episode (or trajectory) it came from, numbered within the rollout
    paused: bool = False    # rollout.partial: stopped unfinished, to continue in a later rollout
    finished_at: int = -1   # rollout.partial: the batcher tick it finished at in this rollout (-1: not in it)
    trajectory: Trajectory | None = None  # rollout.partial, paused: the trajectory so far (`open`: its open turn)


CARRIED = tuple(f.name for f in dataclasses.fields(Carried))


def info_as_data(info: SampleInfo, carried: Carried) -> dict:
    """A sample's facts and what it carries as plain data (end states as their values, a paused trajectory as
    `Trajectory.as_data`): what a checkpoint holds of a sample in flight."""
    trajectory = carried.trajectory.as_data() if carried.trajectory is not None else None
    return {**dataclasses.asdict(info), "end": info.end.value, **dataclasses.asdict(carried), "trajectory": trajectory}


def info_from_data(data: dict) -> tuple[SampleInfo, Carried]:
    """A sample's facts and what it carries from `info_as_data` (a checkpoint's samples in flight); one saved
    before the one end state holds `ended` (its reason) and `status` (an agent episode's, the same reason or ok), and
    `progress` (None: a step in flight never holds a partial rollout's samples)."""
    data = dict(data)
    if "ended" in data:
        data["end"] = data.pop("ended")
        data.pop("status", None)
    if data.get("progress", 0) is None:
        del data["progress"]
    carried = Carried(**{k: data.pop(k) for k in CARRIED if k in data})
    if carried.trajectory is not None:
        carried.trajectory = Trajectory.from_data(carried.trajectory)  # type: ignore[arg-type]
    return SampleInfo(**{**data, "end": EndState(data.get("end", ""))}), carried


def info_of(t: Trajectory) -> SampleInfo:
    return SampleInfo(turns=t.turns, tool_calls=t.tool_calls, tool_errors=t.tool_errors,
                      tool_timeouts=t.tool_timeouts, rewards=dict(t.rewards), prefilled=t.prefilled,
                      context=t.context, kv_reused=t.kv_reused, kv_evicted=t.kv_evicted, end=t.end)


class TurnStop(enum.Enum):
    """How one model turn stopped (`read_turn`)."""
    END_OF_TURN = "end_of_turn"  # on the template's end-of-turn token: it may be answered
    EOS = "eos"                  # on the end-of-sequence token (not the end-of-turn one)
    CUT = "cut"                  # at its token budget
    OPEN = "open"                # on neither end token and not cut (an empty turn): nothing closed it


def read_turn(ids: Sequence[int], *, cut: bool, end_of_turn: int, eos: int | None = None) -> TurnStop:
    """How a sampled turn of `ids` stopped: cut at its budget, or on its last token, the end-of-turn token first
    (a template whose end-of-turn token is EOS ends turns, not sequences). The one turn reader of the environment
    loops and the agent endpoint (module docstring)."""
    if cut:
        return TurnStop.CUT
    if ids and ids[-1] == end_of_turn:
        return TurnStop.END_OF_TURN
    if ids and eos is not None and ids[-1] == eos:
        return TurnStop.EOS
    return TurnStop.OPEN


def joined(head: Completion, c: Completion) -> Completion:
    """`c`, the continuation of a turn paused after `head` (tokens of an earlier rollout), as one completion of
    the whole turn; the engine counts (`prefilled`, `reused`, `evicted`) are `c`'s (the paused request's were
    counted when it paused)."""
    return Completion(list(head.ids) + list(c.ids), list(head.log_probs) + list(c.log_probs),
                      list(head.versions) + list(c.versions), c.finish, c.prefilled, c.reused, c.evicted,
                      list(head.floors) + list(c.floors))


def floors_of(c: Completion) -> list[float] | None:
    """`c`'s nucleus floors, one per token, or None where the engine (or a part of a joined turn) recorded none."""
    return list(c.floors) if c.floors and len(c.floors) == len(c.ids) else None


def count_engine_work(t: Trajectory, c: Completion, prompt_tokens: int) -> None:
    """Add what the engine did for one request of `t` (asked with `prompt_tokens` of context) to its counts."""
    t.prefilled += c.prefilled
    t.context += prompt_tokens
    t.kv_reused += c.reused
    t.kv_evicted += c.evicted


def add_model_turn(t: Trajectory, c: Completion, text: str, prompt_tokens: int) -> None:
    """Append a sampled turn (asked with `prompt_tokens` of context): its exact ids and log-probs, its text as the
    assistant message."""
    t.segments.append(Segment(list(c.ids), list(c.log_probs), min(c.versions, default=0), list(c.versions),
                              floors_of(c)))
    t.turns += 1
    count_engine_work(t, c, prompt_tokens)
    t.messages.append({"role": "assistant", "content": text})


def tool_message(name: str | None, content: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": content}
    if name is not None:
        message["name"] = name
    return message


@dataclass
class ToolUse:
    runner: ToolRunner
    format: ToolFormat = HERMES  # how calls are written in the model's text (rollout.multi_turn.tool_parser)
    max_calls_per_turn: int = 4
    max_output_tokens: int = 256

    def calls_in(self, text: str) -> tuple[list[ToolCall], list[str]] | None:
        """The tool calls of a turn's text and the malformed ones' errors; None when it has none."""
        parsed = self.format.parse(text)
        if not (parsed.calls or parsed.errors):
            return None
        return parsed.calls, parsed.errors

    def run(self, t: Trajectory, calls: list[ToolCall], errors: list[str], encode: Any) -> list[dict]:
        """Run a turn's calls (at most `max_calls_per_turn`; each result within `max_output_tokens`) and count
        them on `t`; the tool messages in order (blocking: the caller runs it in a thread)."""
        limit = self.max_calls_per_turn
        replies = [tool_message(None, f"error: {e}") for e in errors]
        t.tool_calls += len(calls) + len(errors)
        t.tool_errors += len(errors)
        runnable = calls[:limit]
        results = self.runner.run(runnable) if runnable else []
        for call, result in zip(runnable, results):
            content = result.content
            t.tool_errors += result.status == "error"
            t.tool_timeouts += result.status in ("timeout", "killed")
            size = len(encode(content))
            if size > self.max_output_tokens:
                content = (f"error: the output of {call.name} was {size} tokens, over the limit of "
                           f"{self.max_output_tokens} (rollout.multi_turn.max_tool_output_tokens)")
                t.tool_errors += result.status != "error"
            replies.append(tool_message(call.name, content))
        for call in calls[limit:]:
            replies.append(tool_message(call.name, f"error: more than {limit} tool calls in one turn "
                                                   "(rollout.multi_turn.max_tool_calls_per_turn); not run"))
            t.tool_errors += 1
        return replies


def rollout_metrics(infos: list[SampleInfo], carried: list[Carried], *, multi_turn: bool, agent: bool, episodes: int,
                    env_tokens: int, tokens: int, truncated: int) -> dict[str, float]:
    """rollout/ending/<reason> (the share of samples that ended so, trajectory.EndState), and multi_turn/*,
    tools/*, agent/* and reward parts of a step's samples (tools/* and errors are totals)."""
    ended = [i.end.value for i in infos if i.end is not EndState.RUNNING]
    endings = {f"rollout/ending/{r}": ended.count(r) / len(ended) for r in sorted(set(ended))}
    if not multi_turn or not infos:
        return endings
    turns = torch.tensor([i.turns for i in infos], dtype=torch.float32)
    out = {"multi_turn/turns/mean": turns.mean().item(), "multi_turn/turns/max": turns.max().item(),
           "multi_turn/env_token_share": env_tokens / max(tokens, 1),
           "multi_turn/budget_truncated": truncated / len(infos),
           "multi_turn/prefilled_tokens": float(sum(i.prefilled for i in infos)),
           "multi_turn/context_tokens": float(sum(i.context for i in infos)),
           # the HF engine's kept KV caches: prompt tokens served from them, caches dropped for memory (kv_reuse_mb)
           "rollout/kv_reused_tokens": float(sum(i.kv_reused for i in infos)),
           "rollout/kv_evicted": float(sum(i.kv_evicted for i in infos)),
           "tools/calls": float(sum(i.tool_calls for i in infos)),
           "tools/errors": float(sum(i.tool_errors for i in infos)),
           "tools/timeouts": float(sum(i.tool_timeouts for i in infos))}
    if agent:
        # an episode's samples all end in its error or timeout
        status = {c.episode: i.end for i, c in zip(infos, carried)}
        out.update({"agent/calls/mean": turns.sum().item() / max(episodes, 1),
                    "agent/samples/mean": sum(i.turns > 0 for i in infos) / max(episodes, 1),  # the empty ones not
                    "agent/errors": float(sum(s is EndState.ERROR for s in status.values())),
                    "agent/timeouts": float(sum(s is EndState.TIMEOUT for s in status.values()))})
    for part in sorted({k for i in infos for k in i.rewards}):
        out[f"reward/{part}/mean"] = sum(i.rewards.get(part, 0.0) for i in infos) / len(infos)
    return {**out, **endings}
