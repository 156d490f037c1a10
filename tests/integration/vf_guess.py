"""A multi-turn verifiers environment written with verifiers' own API (taskset id `vf_guess`, this module): find a
hidden number in 1..8. The environment (`GuessEnv`, a `vf.SingleAgentEnv`) holds the agent's rollout open with
`interaction(task)` and answers each model turn as the next user turn ("higher", "lower", "a number") until the
number is found or MAX_TURNS; the rubric's `found` is 1 when a reply was the number. The prompt and replies are
those of grpoflow's built-in guess_number task, so its demonstrations warm-start the tiny model."""

import re

import verifiers.v1 as vf

MAX_TURNS = 4


def hint(reply: str, secret: int) -> str | None:
    """The user's answer to a reply: None when it names the secret."""
    guess = re.search(r"-?\d+", reply)
    if guess is None:
        return "a number"
    value = int(guess.group())
    return None if value == secret else "higher" if value < secret else "lower"


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(any(hint(m.content or "", self.data.secret) is None for m in trace.assistant_messages))


class GuessEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            for _ in range(MAX_TURNS - 1):
                if segment.terminated:
                    break
                answer = hint(segment.last_reply, task.data.secret)
                if answer is None:
                    break
                segment = await interaction.turn(answer)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self) -> list[GuessTask]:
        return [GuessTask(GuessData(idx=i, prompt="Guess 1-8", secret=1 + (5 * i) % 8), self.config.task)
                for i in range(8)]


__all__ = ["GuessEnv", "GuessTaskset"]
