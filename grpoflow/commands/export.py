"""`grpoflow export RUN_DIR [--step N] --out DIR`: a checkpoint's policy as a plain HF model folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from grpoflow.controller.checkpoint import CheckpointManager, problem, step_dir_name
from grpoflow.errors import UserError, UserFileExistsError, UserFileNotFoundError
from grpoflow.training.engine import OPTIMIZER_FILE
from grpoflow.models.loading import load_tokenizer
from grpoflow.models.lora import merge_to_plain_model


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """The checkpoint of `step` (default: the newest whose files match their checksums); a damaged one named by
    `step` is an error, an unnamed one is skipped for the one before it (with a warning)."""
    manager = CheckpointManager(run_dir)
    path = manager.root / step_dir_name(step) if step is not None else manager.latest(verify=True)
    if path is not None and step is not None and path.is_dir():
        why = problem(path, verify=True)
        if why is not None:
            raise UserError(f"the checkpoint {path} is damaged ({why}); export another --step, or leave --step "
                            f"out to take the newest complete one.")
    if path is None or not (path / "actor").is_dir():
        have = sorted(p.name for p in manager.root.glob("step_*")) if manager.root.exists() else []
        raise UserFileNotFoundError(f"{run_dir} has no checkpoint{f' for step {step}' if step is not None else ''} "
                                    f"(found: {have or 'none'}); train with trainer.save_every > 0 first.")
    return path


ATTEMPTS = 5  # a latest checkpoint pruned while it is copied (trainer.keep_last beside a running run): try again


def export(run_dir: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Write the policy of a run's checkpoint (the latest, or `step`) to `out`: config, tokenizer and
    safetensors weights that `AutoModelForCausalLM.from_pretrained(out)` loads; LoRA adapters merged. Beside a
    running run the latest checkpoint may be pruned while it is read (a newer one was published first; files are
    never changed in place, so what was read is whole): the copy is then dropped and the new latest exported."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UserFileExistsError(f"--out {out} is not empty; give a new folder so nothing there is overwritten.")
    for attempt in range(ATTEMPTS):
        actor = find_checkpoint(run_dir, step) / "actor"
        try:
            return _write(actor, out)
        except (OSError, ValueError):  # a file gone mid-read: FileNotFoundError, or a loader's own error
            if step is not None or actor.parent.exists() or attempt == ATTEMPTS - 1:
                raise
            shutil.rmtree(out, ignore_errors=True)
    raise AssertionError("unreachable")


def _write(actor: Path, out: Path) -> Path:
    """The export of one checkpoint's actor/ folder into `out`."""
    adapter_config = actor / "adapter_config.json"
    if adapter_config.exists():
        base = json.loads(adapter_config.read_text())["base_model_name_or_path"]
        merge_to_plain_model(base, str(actor)).save_pretrained(out, safe_serialization=True)
        load_tokenizer(actor).save_pretrained(out)
    else:
        shutil.copytree(actor, out, ignore=shutil.ignore_patterns(OPTIMIZER_FILE), dirs_exist_ok=True)
    return out
