"""A single-turn verifiers taskset written with verifiers' own API (taskset id `vf_echo`, this module): the model
is asked to repeat a word; the rubric scores the share of the word's letters in the reply (weight 1) and a short
reply (weight 0.5). tests/integration/test_verifiers_run.py trains grpoflow on it through
rollout.agent.program=verifiers."""

import verifiers.v1 as vf

WORDS = ["cat", "dog", "sun", "map", "pen", "cup", "box", "hat"]


def letters(word: str, reply: str) -> float:
    """The share of `word`'s letters that occur in `reply`."""
    return sum(c in reply for c in word) / len(word)


class EchoData(vf.TaskData):
    word: str


class EchoTask(vf.Task[EchoData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def letters(self, trace: vf.Trace) -> float:
        return letters(self.data.word, trace.last_reply)

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 8)


class EchoConfig(vf.TasksetConfig):
    num_tasks: int = len(WORDS)


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list[EchoTask]:
        return [EchoTask(EchoData(idx=i, prompt=f"Say {WORDS[i % len(WORDS)]}", word=WORDS[i % len(WORDS)]),
                         self.config.task) for i in range(self.config.num_tasks)]


__all__ = ["EchoTaskset"]
