"""verl's and TRL's knowledge, in one room: their keys and fields translated to grpoflow's config keys with their
units converted, and verl's run scripts read as its launcher reads them.

A verl run script's `key=value` arguments can be given to `grpoflow train` as they are (mixed with ours), and a
TRL GRPOConfig as a YAML file of its fields (`grpoflow train trl_config.yaml`); `grpoflow translate verl run.sh`
and `grpoflow translate trl config.yaml` (commands/translate.py) print the equivalent grpoflow command instead.
Each foreign key is:

    ours       the same setting under our name (a value map where the names differ: kl -> k1, ...)
    converted  computed from several keys or with other units (mini-batch size -> count, micro-batch sizes -> a
               token budget, epochs -> steps from the dataset size, ...)
    n/a        nothing to set here (GPU memory layout, offloading, logging back-ends' names, ...): listed in one
               note, never refused one at a time
    missing    a setting grpoflow does not have: listed in one warning, so nothing passes silently

- `translation.py`: `Translation` (what a translation gives) and the size check both share. Stdlib only.
- `verl.py`: verl's tables, `translate_verl` and its conversions, verl's KL names, its sections for the unknown-key
  hint and its multi-turn keys pointing to ours. Stdlib only.
- `trl.py`: TRL's tables, `translate_trl` and its conversions, TRL's batch-size checks. Stdlib only.
- `verl_script.py`: the `key=value` arguments of a verl run script (shell continuations, variables, Hydra's `+`
  and `~`). On `loading` (YAML values read as the config reads them).

The config's loading (`grpoflow.config.loading`) calls the translations; which of two keys that decide one thing
wins across the layers (steps over epochs, verl's run folder name) is `grpoflow.config.precedence`.
`docs/migrating.md` holds the tables and tests/unit/test_foreign_keys.py walks every row of them through these
modules and the config. This package's `__init__` imports nothing, so that `loading` can import its stdlib
modules while `verl_script` imports `loading`; nothing here imports torch.
"""
