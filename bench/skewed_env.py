"""A multi-turn environment with skewed turn counts, for bench/multi_turn.py and bench/partial_rollout.py: most
conversations end after the model's first turn, one group in five (`long_share`, rollout.multi_turn.env_args) runs to
`rollout.multi_turn.max_turns` (the environment asks again, whatever the model said; drawn from reset's seed, so the n
games of a group agree). The model is rewarded when one of its answers names the row's secret. Lockstep turns lose
most here: every round waits for the round's longest turn, and every turn re-reads the whole conversation. The
partial-rollout tests play it with long_share 0.5 (tests/integration/test_partial_multi_turn.py)."""

import random
import re


class SkewedTurns:
    def __init__(self, long_share=0.2):
        self.long_share = float(long_share)

    def reset(self, *, seed, secret=4, **_):
        self.secret = int(secret)
        self.long = random.Random(seed).random() < self.long_share
        self.found = 0.0
        return "Guess 1-8"

    def step(self, text):
        guess = re.search(r"-?\d+", text)
        if guess is not None and int(guess.group()) == self.secret:
            self.found = 1.0
        if not self.long:
            return None, True, 0.0
        return "again" if guess is None or int(guess.group()) == self.secret else (
            "higher" if int(guess.group()) < self.secret else "lower"), False, 0.0

    def get_reward(self):
        return self.found
