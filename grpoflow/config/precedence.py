"""Which of two settings that decide the same thing wins, across the config's layers (loading.py), and the line
that says so.

A layer is one source of `key=value` pairs in order: the built-in recipe, a recipe file, the command line. Later
layers win key by key; these rules decide between *different* keys that set the same thing:

- steps: an explicit step count (`trainer.total_steps`, verl's `trainer.total_training_steps`, TRL's `max_steps`)
  wins over epochs (`trainer.total_epochs`, `num_train_epochs`) given in the same or an earlier layer, as in verl
  and TRL; epochs given in a later layer (the command line over a recipe's step count) win over it.
- the built-in recipe's reward (`exact_match`, for its addition task) gives way to `auto` when a later layer names
  its own training files and no reward.
- a foreign key's derived default (verl's project_name/experiment_name naming the run folder) applies only where
  no layer sets the key.

Each rule returns the pairs to apply after every layer, and appends one line to `notes` when it decides.
Standard library only.
"""

from __future__ import annotations

from typing import Any

_ABSENT = object()
Pairs = list[tuple[str, Any]]
Layer = tuple[str, Pairs]  # (its name: a file or "the command line", its pairs)


def _last(layers: list[Layer], key: str) -> tuple[int, str, Any] | None:
    """(layer index, layer name, value) of the last layer that sets `key` (a recipe's section `{a: {b: 1}}` sets
    `a.b`)."""
    found = None
    for i, (name, pairs) in enumerate(layers):
        for k, v in pairs:
            if key.startswith(k + "."):  # a section: its field, if it sets it
                for part in key[len(k) + 1:].split("."):
                    v = v.get(part, _ABSENT) if isinstance(v, dict) else _ABSENT
                k = key
            if k == key and v is not _ABSENT:
                found = (i, name, v)
    return found


def steps_or_epochs(layers: list[Layer], notes: list[str]) -> Pairs:
    """`trainer.total_epochs=None` when a step count is given in the same or a later layer than the epochs."""
    steps, epochs = _last(layers, "trainer.total_steps"), _last(layers, "trainer.total_epochs")
    if steps is None or epochs is None or epochs[2] is None:
        return []
    if steps[0] >= epochs[0]:
        notes.append(f"steps: trainer.total_steps={steps[2]} wins over trainer.total_epochs={epochs[2]} (an explicit "
                     "step count beats epochs, as verl's trainer.total_training_steps and TRL's max_steps do); the "
                     "run takes that many steps.")
        return [("trainer.total_epochs", None)]
    notes.append(f"steps: trainer.total_epochs={epochs[2]} ({epochs[1]}) replaces trainer.total_steps={steps[2]} "
                 f"({steps[1]}, an earlier layer); the steps are counted from the epochs at start.")
    return []


def builtin_reward(layers: list[Layer], builtin: str, default: str, notes: list[str]) -> Pairs:
    """reward.function back to `default` (auto) when the built-in recipe (`builtin`, the layer's name) set it and a
    later layer gives its own, not built-in, training files without naming a reward."""
    reward, files = _last(layers, "reward.function"), _last(layers, "data.train_files")
    if reward is None or reward[1] != builtin or files is None or files[1] == builtin:
        return []
    given = files[2] if isinstance(files[2], list) else [files[2]]
    if _last(layers, "reward.functions") is not None or all(str(f).startswith("builtin:") for f in given):
        return []
    notes.append(f"reward.function={default}: the built-in model's recipe scores its addition task with "
                 f"{reward[2]}; your data.train_files are scored by each row's data_source (set reward.function to "
                 "choose).")
    return [("reward.function", default)]


def foreign_defaults(layers: list[Layer], defaults: Pairs, notes: list[str]) -> Pairs:
    """The foreign keys' derived defaults whose key no layer sets."""
    kept = [(k, v) for k, v in defaults if _last(layers, k) is None]
    for key, value in kept:
        notes.append(f"{key}={value}: verl's folder for trainer.project_name/experiment_name (set trainer.output_dir "
                     "to choose another).")
    return kept
