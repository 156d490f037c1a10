"""A trajectory: the prompt ids, then segments of ids, the model's and the environment's.

The model's segments are the exact ids the engine sampled, with their sampling log-probs; the
environment's (tool results, replies, the separator and the next turn's opening) are rendered by
`chat.ChatRenderer`. One trajectory is one training sample: its response is every segment in
order, the loss mask is 1 on the model's tokens only, and the attention covers them all.

A trajectory that rollout.partial paused carries its open turn (`Trajectory.open`: the tokens sampled so far), and
goes on in a later rollout from itself (what the controller's pool and the wire hold; `as_data` in a checkpoint):
a single-turn sample and a conversation resume from it in their own loops (loop.py), not in a parallel class.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from dataclasses import dataclass, field

import torch

from grpoflow.data.batch import Batch
from grpoflow.engines.protocol import left_pad
from grpoflow.models.nucleus import NO_CUT

class EndState(str, enum.Enum):
    """Where a trajectory is: running, paused, or why it ended (the one end state of a trajectory, and of an agent
    episode; logged as shares rollout/ending/<value>, written as `ended` in train_samples.jsonl)."""
    RUNNING = ""                 # not over yet
    STOP = "stop"                # the model ended its turn and nothing answers (no environment, no tool call)
    EOS = "eos"                  # the model ended with EOS (a single-turn sample's stop token), not the end-of-turn
    MAX_TURNS = "max_turns"      # rollout.multi_turn.max_turns model turns
    TOKEN_BUDGET = "token_budget"  # rollout.max_new_tokens ran out (a turn cut, or no room for a reply and a token)
    ENV_DONE = "env_done"        # the environment said the conversation is over
    ERROR = "error"              # user code (environment, agent program) raised or returned nonsense
    TIMEOUT = "timeout"          # user code ran past its limit (rollout.multi_turn.env_timeout_s, .agent.timeout_s)
    PAUSED = "paused"            # rollout.partial stopped it unfinished, to go on in a later rollout

    @property
    def is_truncated(self) -> bool:
        """The token budget ran out before it ended (Batch.truncated: actor.mask_truncated, the clip ratio)."""
        return self is EndState.TOKEN_BUDGET

    @property
    def is_error(self) -> bool:
        """User code failed it (it scores reward.error_score)."""
        return self in (EndState.ERROR, EndState.TIMEOUT)

    @property
    def is_terminal(self) -> bool:
        """Over for good: neither running nor paused."""
        return self not in (EndState.RUNNING, EndState.PAUSED)


END_REASONS = tuple(e.value for e in EndState if e is not EndState.RUNNING)


@dataclass
class Segment:
    ids: list[int]
    log_probs: list[float] | None = None  # the model's sampling log-probs; None: environment tokens (not trained)
    version: int | None = None            # the model's: weight version of the engine that sampled it (the oldest)
    versions: list[int] | None = None     # the model's, per token (None: all `version`)
    floors: list[float] | None = None     # the model's, per token: the nucleus floor (models/nucleus.py); None: none

    @property
    def trainable(self) -> bool:
        return self.log_probs is not None


@dataclass
class Trajectory:
    prompt_ids: list[int]
    messages: list[dict]                   # the conversation: opening messages, then every turn
    segments: list[Segment] = field(default_factory=list)
    turns: int = 0                         # model turns
    tool_calls: int = 0
    tool_errors: int = 0                   # malformed calls, unknown tools, tools that raised or output too much
    tool_timeouts: int = 0                 # calls past the tool timeout or killed for CPU time / memory
    step_reward: float = 0.0               # the environment's step rewards so far
    rewards: dict[str, float] = field(default_factory=dict)  # the environment's reward parts, when it is over
    prefilled: int = 0                     # prompt tokens the engine computed for its turns (the rest reused)
    context: int = 0                       # prompt tokens of its turns: what re-prefilling every turn would compute
    kv_reused: int = 0                     # prompt tokens of its turns whose KV the engine kept from a turn before
    kv_evicted: int = 0                    # other trajectories' kept KV caches that keeping its own pushed out
    end: EndState = EndState.RUNNING       # running, paused, or why it ended
    open: Segment | None = None            # paused (rollout.partial): the open turn's tokens so far, not yet a turn

    @property
    def oldest(self) -> int | None:
        """The weight version of its oldest sampled token, the open turn's included (None: none sampled yet)."""
        model = [s for s in self.segments + ([self.open] if self.open is not None else []) if s.trainable]
        versions = [v for s in model for v in (s.versions if s.versions is not None else [s.version or 0] * len(s.ids))]
        return min(versions, default=None)

    @property
    def version(self) -> int:
        """Weight version of the oldest model segment (-1 before the first)."""
        return min((s.version for s in self.segments if s.version is not None), default=-1)

    @property
    def response_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.ids]

    @property
    def used(self) -> int:
        """Tokens after the prompt (the budget's count)."""
        return sum(len(s.ids) for s in self.segments)

    @property
    def env_tokens(self) -> int:
        return sum(len(s.ids) for s in self.segments if not s.trainable)

    def last_assistant_text(self) -> str:
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    def as_data(self) -> dict:
        """The trajectory as plain data (lists, dicts, numbers, strings): what a checkpoint holds (its end state as
        its value: a checkpoint loads plain values only)."""
        return {**dataclasses.asdict(self), "end": self.end.value}

    @staticmethod
    def from_data(data: dict) -> "Trajectory":
        """A fresh trajectory from `as_data`'s output (a deep copy: growing it leaves `data` as it was)."""
        data = copy.deepcopy(data)
        if "ended" in data:  # written before the one end state (truncated, done, ended): its reason holds it all
            data["end"] = data.pop("ended")
            data.pop("truncated", None), data.pop("done", None)
        data["end"] = EndState(data.get("end", ""))
        opened = data.get("open")
        return Trajectory(**{**data, "segments": [Segment(**s) for s in data["segments"]],
                             "open": Segment(**opened) if opened is not None else None})


def to_batch(trajectories: list[Trajectory], *, pad_token_id: int, prompt_texts: list[str], rows: list[dict],
             multi_turn: bool = True) -> Batch:
    """The trajectories as training samples (in order): response = the segments, response_mask 1 on the model's
    tokens, response_attention 1 on all, rollout log-probs on the model's tokens (0 elsewhere), env rewards
    (the sum of each trajectory's parts), completions = the last assistant message (what reward functions
    score), conversations = the messages. `multi_turn=False` (one model segment each): no response_attention,
    conversations or env rewards, as a plain sample has none."""
    prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in trajectories], pad_token_id)
    width = max([t.used for t in trajectories] + [1])
    b = len(trajectories)
    response_ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((b, width), dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    log_probs = torch.zeros((b, width), dtype=torch.float32)
    versions = torch.zeros((b, width), dtype=torch.long)
    floors = torch.full((b, width), NO_CUT, dtype=torch.float32)
    for i, t in enumerate(trajectories):
        at = 0
        for s in t.segments:
            end = at + len(s.ids)
            response_ids[i, at:end] = torch.tensor(s.ids, dtype=torch.long)
            attention[i, at:end] = 1
            if s.log_probs is not None:
                response_mask[i, at:end] = 1
                log_probs[i, at:end] = torch.tensor(s.log_probs, dtype=torch.float32)
                versions[i, at:end] = torch.tensor(s.versions, dtype=torch.long) if s.versions is not None else \
                    (s.version or 0)
                if s.floors is not None:
                    floors[i, at:end] = torch.tensor(s.floors, dtype=torch.float32)
            at = end
    # the nucleus floors only where top-p cut something: a run at top_p = 1 scores under the full distribution
    sampling_floors = floors if bool((floors > NO_CUT).any()) else None
    if not multi_turn:
        return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                     response_mask=response_mask, group_ids=torch.zeros(b, dtype=torch.long),
                     rollout_log_probs=log_probs, sampling_floors=sampling_floors,
                     truncated=torch.tensor([t.end.is_truncated for t in trajectories]),
                     policy_version=torch.tensor([t.version for t in trajectories], dtype=torch.long),
                     token_versions=versions, prompts=list(prompt_texts),
                     completions=[t.last_assistant_text() for t in trajectories], rows=list(rows))
    return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                 response_mask=response_mask, response_attention=attention,
                 group_ids=torch.zeros(b, dtype=torch.long), rollout_log_probs=log_probs,
                 sampling_floors=sampling_floors,
                 truncated=torch.tensor([t.end.is_truncated for t in trajectories], dtype=torch.bool),
                 policy_version=torch.tensor([t.version for t in trajectories], dtype=torch.long),
                 token_versions=versions,
                 env_rewards=torch.tensor([sum(t.rewards.values()) for t in trajectories], dtype=torch.float32),
                 prompts=list(prompt_texts), completions=[t.last_assistant_text() for t in trajectories],
                 rows=list(rows), conversations=[list(t.messages) for t in trajectories])
