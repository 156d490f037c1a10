"""Training samples from an agent's model calls (the endpoint's side of docs/agents.md).

An agent episode is a series of chat-completion calls. Each call is recorded as the prompt ids the
endpoint rendered from the request's messages, the ids the engine sampled and their log-probs. The
calls become samples (`Trajectory`s) by one rule, applied when a call is dispatched:

    a call whose prompt ids start with a sample's prompt + response ids, token for token, continues
    that sample: the ids between (the new messages as the template renders them, the separator after
    the end-of-turn token and the next generation prompt) are appended masked, then the sampled ids
    trainable; any other call starts a new sample with its prompt.

So an agent that appends to its conversation (the usual loop: reply, tool results, reply ...) gives
one sample per episode, and one that rewrote its history (summarised, dropped or edited a turn, or
whose text re-encodes to other ids) starts a new one. The latest sample that fits is continued (an
agent with sub-conversations keeps each in its own sample); a sample with a call in flight cannot be
continued until that call is recorded.

`budget` (rollout.max_new_tokens) bounds each sample's response, every token after its prompt, as in
the agent loop: a continuation whose new messages leave no room for a token ends its sample
(truncated) and starts a new one with the whole conversation as prompt; a call cut at its sample's
remaining budget ends the sample (truncated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpoflow.trajectories.trajectory import EndState, Segment, Trajectory


@dataclass
class Placement:
    """Where a call goes: the sample it continues (None: it starts one), the ids between that sample's end
    and the call's prompt end, the tokens it may sample, and a sample it ended for lack of budget."""
    sample: int | None
    extension: list[int]
    left: int
    ended: int | None = None


@dataclass
class EpisodeRecord:
    """One episode's calls as samples; `place` a call when it is dispatched, then `record` or `release` it."""
    budget: int
    samples: list[Trajectory] = field(default_factory=list)
    calls: int = 0                                        # calls accepted (the next call's turn number)
    busy: set[int] = field(default_factory=set)           # samples with a call in flight
    raw_text: dict[str, str] = field(default_factory=dict)  # tool-call id -> the assistant text it came from
    tool_names: dict[str, str] = field(default_factory=dict)  # tool-call id -> the tool's name
    closed: bool = False                                  # the agent finished (or was cancelled): no more calls
    last: int | None = None                               # the sample the latest recorded call went to

    def place(self, prompt_ids: list[int]) -> Placement:
        """The sample that `prompt_ids` continue (the latest open one whose ids are its prefix), reserved until
        `record` or `release`."""
        for k in reversed(range(len(self.samples))):
            t = self.samples[k]
            if k in self.busy or t.end.is_terminal:
                continue
            full = t.prompt_ids + t.response_ids
            if len(prompt_ids) >= len(full) and prompt_ids[:len(full)] == full:
                extension = prompt_ids[len(full):]
                left = self.budget - t.used - len(extension)
                if left < 1:  # the new messages and one more token do not fit: the sample ends here
                    return Placement(None, [], self.budget, ended=k)
                self.busy.add(k)
                return Placement(k, extension, left)
        return Placement(None, [], self.budget)

    def release(self, placement: Placement) -> None:
        """A placed call that was not recorded (the engine failed, or the episode closed meanwhile)."""
        if placement.sample is not None:
            self.busy.discard(placement.sample)

    def record(self, placement: Placement, prompt_ids: list[int], messages: list[dict], ids: list[int],
               log_probs: list[float], version: int, *, out_of_budget: bool, tool_calls: int = 0,
               tool_errors: int = 0) -> Trajectory:
        """Add a finished call: `messages` is the request's conversation with the reply appended; `out_of_budget`:
        the reply was cut at the sample's remaining budget. Returns the sample it went to."""
        if placement.ended is not None:
            self.samples[placement.ended].end = EndState.TOKEN_BUDGET
        if placement.sample is None:
            t = Trajectory(list(prompt_ids), [])
            self.samples.append(t)
            self.last = len(self.samples) - 1
        else:
            self.last = placement.sample
            self.busy.discard(placement.sample)
            t = self.samples[placement.sample]
            if placement.extension:
                t.segments.append(Segment(list(placement.extension)))
        t.segments.append(Segment(list(ids), list(log_probs), version))
        t.messages = list(messages)
        t.turns += 1
        t.tool_calls += tool_calls
        t.tool_errors += tool_errors
        if out_of_budget:
            t.end = EndState.TOKEN_BUDGET
        return t
