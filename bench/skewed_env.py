"""A multi-turn environment with skewed turn counts, for bench/multi_turn.py: most conversations end after the
model's first turn, one group in five runs to `rollout.multi_turn.max_turns` (the environment asks again, whatever the
model said). The model is rewarded when one of its answers names the row's secret. Lockstep turns lose most here:
every round waits for the round's longest turn, and every turn re-reads the whole conversation."""

import random
import re


class SkewedTurns:
    def reset(self, *, seed, secret=4, **_):
        self.secret = int(secret)
        self.long = random.Random(seed).random() < 0.2
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
