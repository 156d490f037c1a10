"""A guess-the-number environment with a long tail of turns, for the partial-rollout runs: one game in two (drawn
from reset's seed, so the n games of a group agree) goes on until rollout.multi_turn.max_turns whatever the model
says; the others end after the model's first answer. The model is rewarded when one of its answers names the row's
secret."""

import random
import re


class LongGames:
    def reset(self, *, seed, secret=4, **_):
        self.secret = int(secret)
        self.long = random.Random(seed).random() < 0.5
        self.found = 0.0
        return "Guess 1-8"

    def step(self, text):
        guess = re.search(r"-?\d+", text)
        if guess is not None and int(guess.group()) == self.secret:
            self.found = 1.0
        if not self.long:
            return None, True, 0.0
        if guess is None or int(guess.group()) == self.secret:
            return "again", False, 0.0
        return ("higher" if int(guess.group()) < self.secret else "lower"), False, 0.0

    def get_reward(self):
        return self.found
