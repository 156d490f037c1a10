"""A user-registered advantage estimator, end to end: K samples per prompt, score = response length,
advantage = score - mean score of the prompt's group (GRPO's group baseline without the std).

    python examples/length_advantage.py [key=value ...]

Registering the estimator is one decorator; selecting it is one config key. The controller
looks it up by name and passes the inputs its signature asks for (here scores, group ids and
the response mask): there is no `if name == ...` anywhere. With this reward the policy learns
to write longer answers, which `response_length/mean` in the run's metrics.jsonl shows.
"""

import sys

import torch

from grpoflow.algorithms import group_mean_std, register_advantage
from grpoflow.config import load_config
from grpoflow.commands.run import train


@register_advantage("minus_group_mean")
def minus_group_mean(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - mean_{j in group(i)} r_j, on every response token.  [B], [B], [B, R] -> [B, R]."""
    mean, _, _ = group_mean_std(scores, group_ids)
    return (scores - mean)[:, None] * response_mask


def main(overrides: list[str]) -> dict:
    cfg = load_config(None, [
        "model.path=builtin:tiny-0.5m", "sft.steps=0",          # an untrained model: anything goes
        "reward.function=length", "algorithm.adv_estimator=minus_group_mean",
        "rollout.n=4", "rollout.max_new_tokens=24", "data.prompts_per_step=8",
        "actor.lr=1e-3", "trainer.total_steps=30", "trainer.val_every=0",
        "trainer.output_dir=runs/length_advantage", *overrides])
    return train(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
