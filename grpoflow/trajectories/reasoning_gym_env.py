"""`rollout.multi_turn.env=reasoning_gym`: a reasoning-gym task where the model may try again after a wrong answer.

The rows are those of `data.train_files=[reasoning_gym:TASK?...]` (tasks/reasoning_gym_tasks.py): the dataset
prompt (the task's question) opens the conversation. Each model turn is scored by the task's own verifier
(`dataset.score_answer`, on the turn's last `<answer>...</answer>` or its whole text); a full score ends the
conversation, anything less gets the user message `RETRY_MESSAGE` until rollout.multi_turn.max_turns is reached. The
reward is the score of the model's last answer (so a right answer after a retry counts as right; with
`reward.function=null` it is the only reward). Registered in env.py; imports reasoning_gym only when a row is
played (pip install 'grpoflow[reasoning-gym]').
"""

from __future__ import annotations

from typing import Any

from grpoflow.rewards.reasoning_gym_reward import answer_text, entry_of

RETRY_MESSAGE = "That is not right. Try again."


class ReasoningGymEnv:
    """A reasoning-gym task with retries (module docstring)."""

    def reset(self, *, reasoning_gym: Any = None, **_: Any) -> None:
        self.dataset, self.entry = entry_of(reasoning_gym)
        self.score = 0.0
        return None  # the dataset prompt (the question) opens the conversation

    def step(self, assistant_text: str) -> tuple[str | None, bool, float]:
        self.score = float(self.dataset.score_answer(answer_text(assistant_text), self.entry))
        if self.score >= 1.0:
            return None, True, 0.0
        return RETRY_MESSAGE, False, 0.0

    def get_reward(self) -> float:
        return self.score
