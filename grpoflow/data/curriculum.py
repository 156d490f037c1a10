"""Curriculum sampling: draw prompts by how often they are solved, so fewer groups carry no signal.

A GRPO group whose n samples all pass (or all fail) has zero advantage and teaches nothing. The
sampler keeps each prompt's recent pass rates (the share of its group that scored at least
`solved_score`, over the last `window` times it was drawn) and sorts prompts into pools:

    easy       mean recent pass rate >= easy_above
    hard       mean recent pass rate <= hard_below
    learnable  the rest, and every prompt not drawn yet

Each draw of k prompts takes round(k x share) from each pool (`shares` = easy, learnable, hard;
a pool that runs short passes its part to the others, learnable first), uniformly without
replacement within a pool. A prompt whose whole group passed `retire_after` times in a row is
retired: never drawn again (prime-rl's difficulty pools and online filtering; DAPO's
dynamic sampling drops such groups after generating them, this avoids generating them).

Randomness comes from (seed, number of draws so far) only, so the state in a checkpoint
(`state_dict`: draws, each prompt's history and streak, the retired set) resumes exactly.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import torch

from grpoflow.errors import UserError

POOLS = ("easy", "learnable", "hard")


class CurriculumSampler:
    """Prompt indices by difficulty pool; `observe` feeds back each drawn prompt's pass rate."""

    def __init__(self, num_items: int, seed: int, *, shares: Sequence[float] = (0.1, 0.8, 0.1), window: int = 4,
                 easy_above: float = 0.8, hard_below: float = 0.2, retire_after: int = 0) -> None:
        if num_items <= 0:
            raise UserError(f"CurriculumSampler needs at least one item, got num_items={num_items}.")
        if len(shares) != 3 or min(shares) < 0 or sum(shares) <= 0:
            raise UserError(f"data.curriculum.shares={list(shares)}: give three shares >= 0 (easy, learnable, hard) "
                            "that do not all vanish.")
        self.num_items, self.seed, self.window = num_items, seed, window
        self.shares = [s / sum(shares) for s in shares]
        self.easy_above, self.hard_below, self.retire_after = easy_above, hard_below, retire_after
        self.draws = 0
        self.history: dict[int, deque[float]] = {}  # prompt -> its last `window` pass rates
        self.streak: dict[int, int] = {}             # prompt -> times in a row its whole group passed
        self.retired: set[int] = set()

    def pool_of(self, index: int) -> str:
        rates = self.history.get(index)
        if not rates:
            return "learnable"
        rate = sum(rates) / len(rates)
        return "easy" if rate >= self.easy_above else "hard" if rate <= self.hard_below else "learnable"

    def pools(self) -> dict[str, list[int]]:
        """Each pool's prompt indices, in index order (retired prompts are in none)."""
        out: dict[str, list[int]] = {name: [] for name in POOLS}
        for i in range(self.num_items):
            if i not in self.retired:
                out[self.pool_of(i)].append(i)
        return out

    def next_indices(self, k: int) -> list[int]:
        """`k` distinct prompt indices (fewer only if fewer are left), drawn by pool shares."""
        pools = self.pools()
        live = sum(len(p) for p in pools.values())
        if live == 0:
            raise RuntimeError(f"every one of the {self.num_items} prompts is retired (solved "
                               f"{self.retire_after} times in a row): raise data.curriculum.retire_after (0: never "
                               "retire) or add prompts.")
        counts = split_counts(min(k, live), self.shares, [len(pools[p]) for p in POOLS])
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.draws)
        self.draws += 1
        out: list[int] = []
        for name, count in zip(POOLS, counts):
            members = pools[name]
            order = torch.randperm(len(members), generator=gen)[:count].tolist()
            out += [members[j] for j in order]
        if k > live:  # too few prompts left for distinct ones: repeat the live ones
            out += [out[j % live] for j in range(k - live)]
        return out

    def observe(self, indices: Sequence[int], pass_rates: Sequence[float]) -> None:
        """Record each drawn prompt's pass rate (the share of its group that was solved)."""
        for index, rate in zip(indices, pass_rates):
            history = self.history.setdefault(index, deque(maxlen=self.window))
            history.append(float(rate))
            self.streak[index] = self.streak.get(index, 0) + 1 if rate >= 1.0 else 0
            if self.retire_after and self.streak[index] >= self.retire_after:
                self.retired.add(index)

    def metrics(self) -> dict[str, float]:
        sizes = {f"curriculum/{name}": float(len(members)) for name, members in self.pools().items()}
        return {**sizes, "curriculum/retired": float(len(self.retired))}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "curriculum", "draws": self.draws, "history": {i: list(h) for i, h in self.history.items()},
                "streak": dict(self.streak), "retired": sorted(self.retired)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "curriculum":
            raise UserError("the checkpoint's prompt sampler is not a curriculum (it was written with "
                            "data.curriculum.enable=false); resume with the same data.curriculum settings.")
        self.draws = int(state["draws"])
        self.history = {int(i): deque(h, maxlen=self.window) for i, h in state["history"].items()}
        self.streak = {int(i): int(s) for i, s in state["streak"].items()}
        self.retired = {int(i) for i in state["retired"]}


def split_counts(k: int, shares: Sequence[float], available: Sequence[int]) -> list[int]:
    """How many of `k` to take from each pool: round(k x share) (largest remainders first), capped by what each
    pool has; what a pool cannot give goes to the others, the middle (learnable) pool first.

    e.g. k=10, shares (0.1, 0.8, 0.1), available (5, 20, 0) -> (1, 9, 0): hard's 1 moves to learnable."""
    raw = [k * s for s in shares]
    counts = [int(r) for r in raw]
    for j in sorted(range(len(raw)), key=lambda j: (-(raw[j] - counts[j]), j))[:k - sum(counts)]:
        counts[j] += 1
    counts = [min(c, a) for c, a in zip(counts, available)]
    for j in (1, 0, 2):  # the shortfall, learnable first
        extra = min(k - sum(counts), available[j] - counts[j])
        counts[j] += max(extra, 0)
    return counts
