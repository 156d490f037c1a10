"""Held-out accuracy against RL steps and wall time for several runs, and their zero-advantage share, as
markdown (docs/algorithms/opd.md, docs/data-and-rewards.md).

    python bench/runs_table.py NAME=RUN_DIR [NAME=RUN_DIR ...]
"""

from __future__ import annotations

import sys

from grpoflow.controller.metrics import read_metrics


def summary(run_dir: str) -> tuple[dict[int, float], dict[int, float], float]:
    """(val accuracy by step, cumulative training seconds by step, mean zero-advantage group share)."""
    acc, wall, total, zero = {}, {}, 0.0, []
    for row in read_metrics(run_dir):
        total += row.get("timing_s/step", 0.0)
        wall[row["step"]] = total
        if "val/mean@1" in row:
            acc[row["step"]] = row["val/mean@1"]
        if "groups/zero_advantage_share" in row:
            zero.append(row["groups/zero_advantage_share"])
    return acc, wall, sum(zero) / max(len(zero), 1)


def main(argv: list[str]) -> None:
    runs = [arg.split("=", 1) for arg in argv]
    summaries = {name: summary(path) for name, path in runs}
    steps = sorted(set().union(*(s[0] for s in summaries.values())))
    print("| run | " + " | ".join(f"step {s}" for s in steps) + " | train s | zero-adv groups |")
    print("|---|" + "---|" * (len(steps) + 2))
    for name, (acc, wall, zero) in summaries.items():
        cells = [f"{acc[s]:.1%}" if s in acc else "" for s in steps]
        print(f"| {name} | " + " | ".join(cells) + f" | {max(wall.values(), default=0):.0f} | {zero:.1%} |")


if __name__ == "__main__":
    main(sys.argv[1:])
