"""Warnings for settings that run without error but cannot learn (or learn badly) on the model given.

The config's defaults suit a pretrained model, and `recipes/builtin.yaml` suits the built-in model
trained from scratch; a user who mixes the two (a recipe tuned on the built-in model with a real
checkpoint, a chat model with a handful of new tokens) gets a run that looks fine and learns
nothing. Each check here names the key, the value, why it is a trap and what to set instead. They
are warnings, not errors: a user who knows better keeps the value.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpoflow.config import Config

# Above this, AdamW on a pretrained LM usually destroys it within a few steps (verl/TRL use 1e-6).
PRETRAINED_MAX_LR = 1e-4
# Fewer new tokens than this cut almost every answer of a chat model off (a short sentence is ~20 tokens).
CHAT_MIN_NEW_TOKENS = 16
# Dropping more than this fraction of the training prompts as overlong is worth a warning.
MAX_OVERLONG_FRACTION = 0.1


@dataclass
class RunFacts:
    """What the checks need to know beyond the config (found once the tokenizer and data are loaded)."""
    chat_template: bool        # the tokenizer has a chat template (an instruct/chat model)
    prompts_total: int         # training rows read
    prompts_overlong: int      # of which dropped (or rejected) as longer than data.max_prompt_length


def config_traps(cfg: Config, facts: RunFacts) -> list[str]:
    """One sentence per trap found in `cfg` for this model and data (empty: nothing to warn about)."""
    found = []
    pretrained = not cfg.model.path.startswith("builtin:")
    if pretrained and cfg.actor.lr > PRETRAINED_MAX_LR:
        found.append(f"actor.lr={cfg.actor.lr:g} is far above what a pretrained model takes (verl and TRL use "
                     f"1e-6; above {PRETRAINED_MAX_LR:g} the policy usually collapses in a few steps); lower it "
                     f"unless model.path={cfg.model.path} was trained from scratch.")
    if pretrained and (cfg.sft.steps or 0) > 0 and cfg.sft.lr > PRETRAINED_MAX_LR:
        found.append(f"sft.lr={cfg.sft.lr:g} with sft.steps={cfg.sft.steps} is a from-scratch learning rate; a "
                     f"pretrained model's warm start wants about 1e-5.")
    if pretrained and cfg.data.train_files == ["builtin:addition/train"]:
        found.append("data.train_files is the built-in addition task (raw prompts such as '37+48=', no chat "
                     "template), made for builtin: models; set data.train_files to your prompts.")
    if pretrained and facts.chat_template and cfg.rollout.max_new_tokens < CHAT_MIN_NEW_TOKENS:
        found.append(f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} is tiny for a chat model: most answers "
                     f"will be cut off before they end; raise it (the default is 256).")
    if facts.prompts_total and facts.prompts_overlong / facts.prompts_total > MAX_OVERLONG_FRACTION:
        found.append(f"{facts.prompts_overlong} of {facts.prompts_total} training prompts are longer than "
                     f"data.max_prompt_length={cfg.data.max_prompt_length} tokens and are dropped; raise it "
                     f"(chat templates and system prompts add tokens).")
    return found
