"""`grpoflow <command> [recipe.yaml] [key=value ...]`: parse, build, run; no logic here.

Errors: the project's own types for bad input or a run that cannot go on (`grpoflow.errors.UserError` and its
kinds, a worker's or the cluster's error, a non-finite loss, a checkpoint that cannot be written) print one line
and exit 2. Anything else is a bug and propagates with its traceback; GRPOFLOW_DEBUG=1 shows the traceback of
the one-line errors too.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

USAGE = """usage: grpoflow <command> [recipe.yaml | preset] [key=value ...]

commands:
  train   supervised warm start (when configured) then GRPO; no arguments trains the built-in task
  sft     only the supervised warm start; saves an HF folder in <trainer.output_dir>/sft_model
  data    NAME --source PATH... --out DIR [--test-source PATH | --test-size N]: verl-style parquet
          (gsm8k, math, countdown) from a local copy of the source dataset
  eval    validation metrics (mean@k, pass@k, maj@k) of model.path (a model or run folder) on data.val_files
  config  print the resolved config as YAML (verl's keys and a TRL GRPOConfig recipe are read too)
  translate  verl RUN.sh | trl CONFIG.yaml: print the grpoflow command for a verl run script or a TRL
          GRPOConfig, with what was converted and what does not apply (docs/migrating.md)
  plot    RUN_DIR... [--out DIR] [--metrics NAME...]: curves (PNG) and report.md of one or more runs
  export  RUN_DIR [--step N] --out DIR: a checkpoint's policy as a plain HF folder (LoRA merged)
  view    RUN_DIR... [--port P]: a local web page of the runs' curves, rollouts and facts, live while they train
  serve   tinker [key=value ...]: the Tinker API on 127.0.0.1 (tinker.port), for the unmodified tinker SDK
          and cookbook (docs/tinker.md); model.path is the default base model

presets (grpoflow/recipes/): grpo, dr_grpo, dapo, gspo, rloo, ppo, e.g. `grpoflow train dapo`; smollm2_addition
(a real chat model, docs/real-models.md); guess_number, calculator_tool and, on SmolLM2, smollm2_calculator,
smollm2_guess_number (multi-turn, docs/multi-turn.md). The defaults suit pretrained models; recipes/builtin.yaml
applies by itself under everything when model.path is a builtin: model. `grpoflow config [...]` shows the layers.
`grpoflow train --help` lists every key with its default and meaning.
"""


def main(argv: list[str] | None = None) -> int:
    """Run the command of `argv` (default: the process's own arguments) and return its exit code. Run as the
    process's own command (`argv` None), the process then ends even if threads an environment or a tool started
    still run (`_leave`)."""
    code = _command(argv)
    if argv is None:
        _leave(code)
    return code


def _leave(code: int) -> None:
    """Exit with `code` now if threads that Python would wait for (not daemon ones) are still running: user code
    (an environment's thread) kept `grpoflow train` alive after its last line. Everything is flushed and the exit
    handlers run first."""
    import atexit
    import threading

    left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if not left:
        return
    logging.getLogger("grpoflow").warning("exiting although %d thread(s) still run (%s): started by user code (an "
                                          "environment or a tool), they would keep this process alive.", len(left),
                                          ", ".join(left[:5]))
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _command(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "serve":
        if not rest or rest[0] != "tinker":
            print("grpoflow serve: say what to serve: `grpoflow serve tinker [key=value ...]`", file=sys.stderr)
            return 2
        rest = rest[1:]
    if command == "export":
        return _export(rest)
    if command == "data":
        return _data(rest)
    if command == "plot":
        return _plot(rest)
    if command == "view":
        return _view(rest)
    if command == "translate":
        return _translate(rest)
    from grpoflow.config import Config, ConfigError, describe_layers, help_text, load_config, to_yaml
    if "-h" in rest or "--help" in rest:
        print(USAGE + "\nconfig keys:\n" + help_text())
        return 0
    recipe = rest[0] if rest and "=" not in rest[0] else None
    overrides = rest[1:] if recipe else rest
    notes: list[str] = []
    try:  # every key checked before torch is imported: a typo costs a fraction of a second
        cfg = load_config(recipe, overrides, notes)
    except ConfigError as e:
        print(f"grpoflow {command}: error: {e}", file=sys.stderr)
        return 2
    for note in filter(None, notes):
        print(note, file=sys.stderr)
    if command == "config":
        print(describe_layers(recipe, overrides) + to_yaml(cfg))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import transformers

    transformers.utils.logging.disable_progress_bar()  # per-file load/save bars drown the run's own output
    from grpoflow.controller.checkpoint import CheckpointWriteError
    from grpoflow.commands.evaluate import evaluate
    from grpoflow.commands.run import sft_stage, train
    from grpoflow.controller.fit import TrainingError
    from grpoflow.distributed.ray_pool import ClusterError
    from grpoflow.distributed.worker_group import WorkerError
    from grpoflow.errors import UserError
    from grpoflow.commands.serve import serve_tinker
    commands: dict[str, Callable[[Config], Any]] = {
        "train": train, "sft": sft_stage, "eval": evaluate, "serve": serve_tinker}
    if command not in commands:
        print(f"grpoflow: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        result = commands[command](cfg)
    except (UserError, TrainingError, WorkerError, ClusterError, CheckpointWriteError) as e:
        if os.environ.get("GRPOFLOW_DEBUG"):
            raise
        print(f"grpoflow {command}: error: {e}", file=sys.stderr)
        return 2
    if isinstance(result, dict) and result.get("stopped"):  # SIGTERM / Ctrl-C: checkpointed, exits 0
        print(f"to resume: {resume_command(command, rest, cfg.trainer.resume)}")
    return 0


def resume_command(command: str, args: list[str], resume: str) -> str:
    """The command line that continues a stopped run: the same one, unless it said trainer.resume=never
    or a checkpoint folder (then trainer.resume=auto takes the run folder's latest checkpoint)."""
    import shlex

    if resume != "auto":
        args = [a for a in args if not a.startswith("trainer.resume=")] + ["trainer.resume=auto"]
    return shlex.join(["grpoflow", command, *args])


def _translate(args: list[str]) -> int:
    """`grpoflow translate verl run.sh | trl config.yaml`: the grpoflow command for another framework's run."""
    import argparse

    from grpoflow.config import ConfigError
    from grpoflow.commands.translate import script_text, translate_file

    parser = argparse.ArgumentParser(prog="grpoflow translate", description="The grpoflow command for a verl run "
                                     "script or a TRL GRPOConfig (docs/migrating.md).")
    parser.add_argument("framework", choices=["verl", "trl"])
    parser.add_argument("file", help="verl: a run script (python3 -m verl.trainer.main_ppo key=value ...); "
                                     "trl: a YAML file of GRPOConfig fields")
    ns = parser.parse_args(args)
    try:
        command, notes = translate_file(ns.framework, ns.file)
    except (ConfigError, OSError) as e:
        print(f"grpoflow translate: error: {e}", file=sys.stderr)
        return 2
    print(script_text(command, notes), end="")
    return 0


def _data(args: list[str]) -> int:
    import argparse

    from grpoflow.data.prepare import DATASETS, prepare_dataset
    from grpoflow.errors import UserError

    parser = argparse.ArgumentParser(prog="grpoflow data", description="Write verl-style train/test parquet.")
    parser.add_argument("name", choices=sorted(DATASETS))
    parser.add_argument("--source", nargs="+", required=True, help="local file(s) or dataset folder of the source")
    parser.add_argument("--out", required=True, help="folder for train.parquet (and test.parquet)")
    parser.add_argument("--test-source", nargs="+", default=None, help="local test split")
    parser.add_argument("--test-size", default=None, help="split this many rows (or a fraction) off for test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="keep the first N rows of each split")
    ns = parser.parse_args(args)
    test_size = None if ns.test_size is None else (int(ns.test_size) if ns.test_size.isdigit() else float(ns.test_size))
    try:
        written = prepare_dataset(ns.name, ns.source, ns.out, test_source=ns.test_source, test_size=test_size,
                                  seed=ns.seed, limit=ns.limit)
    except UserError as e:
        print(f"grpoflow data: error: {e}", file=sys.stderr)
        return 2
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0


def _plot(args: list[str]) -> int:
    import argparse

    from grpoflow.errors import UserError
    from grpoflow.plotting import GROUPS

    parser = argparse.ArgumentParser(prog="grpoflow plot", description="Curves and report.md of one or more runs.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders holding metrics.jsonl")
    parser.add_argument("--out", help="output folder (default: RUN_DIR/plots for one run, ./plots for several)")
    parser.add_argument("--metrics", nargs="+", metavar="NAME",
                        help=f"groups ({', '.join(GROUPS)}) or metric keys/patterns (default: every group)")
    ns = parser.parse_args(args)
    out = ns.out or (os.path.join(ns.run_dirs[0], "plots") if len(ns.run_dirs) == 1 else "plots")
    from grpoflow.plotting import plot_runs, write_report

    try:
        images = plot_runs(ns.run_dirs, out, ns.metrics)
        report = write_report(ns.run_dirs, out, images)
    except UserError as e:
        print(f"grpoflow plot: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(images)} plots and {report}")
    return 0


def _view(args: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="grpoflow view", description="A local page of runs' curves and rollouts.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders (trainer.output_dir)")
    parser.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--refresh", type=float, default=2.0, help="seconds between the page's reloads of the files")
    ns = parser.parse_args(args)
    from grpoflow.errors import UserError
    from grpoflow.viewer.server import serve

    try:
        serve(ns.run_dirs, port=ns.port, refresh_s=ns.refresh)
    except UserError as e:
        print(f"grpoflow view: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _export(args: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="grpoflow export", description="Write a checkpoint's policy as an HF folder.")
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--out", required=True, help="new folder for the model")
    ns = parser.parse_args(args)
    from grpoflow.commands.export import export
    from grpoflow.errors import UserError

    try:
        out = export(ns.run_dir, ns.out, ns.step)
    except UserError as e:
        print(f"grpoflow export: error: {e}", file=sys.stderr)
        return 2
    print(f"exported to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
