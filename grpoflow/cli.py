"""`grpoflow <command> [recipe.yaml] [key=value ...]`: parse, build, run; no logic here."""

from __future__ import annotations

import logging
import os
import sys

USAGE = """usage: grpoflow <command> [recipe.yaml | preset] [key=value ...]

commands:
  train   supervised warm start (when configured) then GRPO; no arguments trains the built-in task
  sft     only the supervised warm start; saves an HF folder in <trainer.output_dir>/sft_model
  eval    validation metrics (mean@k, pass@k, maj@k) of model.path (a model or run folder) on data.val_files
  config  print the resolved config as YAML
  export  RUN_DIR [--step N] --out DIR: a checkpoint's policy as a plain HF folder (LoRA merged)

presets (grpoflow/recipes/): grpo, dr_grpo, dapo, gspo, rloo, ppo, e.g. `grpoflow train dapo`.
`grpoflow train --help` lists every key with its default and meaning.
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "export":
        return _export(rest)
    from grpoflow.config import ConfigError, help_text, load_config, to_yaml
    if "-h" in rest or "--help" in rest:
        print(USAGE + "\nconfig keys:\n" + help_text())
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import transformers

    transformers.utils.logging.disable_progress_bar()  # per-file load/save bars drown the run's own output
    recipe = rest[0] if rest and "=" not in rest[0] else None
    overrides = rest[1:] if recipe else rest
    from grpoflow.controller.evaluate import evaluate
    from grpoflow.controller.run import sft_stage, train
    from grpoflow.controller.trainer import TrainingError
    from grpoflow.distributed.worker_group import WorkerError
    commands = {"train": train, "sft": sft_stage, "eval": evaluate, "config": lambda cfg: print(to_yaml(cfg))}
    if command not in commands:
        print(f"grpoflow: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        commands[command](load_config(recipe, overrides))
    except (ConfigError, TrainingError, WorkerError, FileNotFoundError, ValueError, KeyError) as e:
        if os.environ.get("GRPOFLOW_DEBUG"):
            raise
        print(f"grpoflow {command}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _export(args: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="grpoflow export", description="Write a checkpoint's policy as an HF folder.")
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--out", required=True, help="new folder for the model")
    ns = parser.parse_args(args)
    from grpoflow.controller.export import export

    try:
        out = export(ns.run_dir, ns.out, ns.step)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"grpoflow export: error: {e}", file=sys.stderr)
        return 2
    print(f"exported to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
