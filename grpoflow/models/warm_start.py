"""Shipped warm starts: a built-in model already warm-started on its task, stored in the package.

`builtin:tiny-4m-addition` is the 4M tiny Llama (models/tiny.py) after `grpoflow sft` on the built-in 2-digit
addition task, stopped by `sft.until_accuracy` once its greedy answers were right on about a third of held-back
problems. `make train` starts GRPO from it. Why it ships rather than being trained in the first minute: the 4M
model learns carries in one jump somewhere between 300 and 800 warm-start steps, and where a fixed step count lands
on that jump depends on the seed and on the CPU's float kernels. A file lands in the same place everywhere, so what a
newcomer sees is GRPO's gain alone (the figures: docs/performance.md, "The default job"; how they came to be:
docs/performance-log.md, "The warm start ships").

The weights are stored in bfloat16 (8 MB instead of 16) and load as float32 like any folder. `make warm-start`
rebuilds the folder: `grpoflow sft` (the command is in the Makefile), then `ship` (this module's `python -m` entry).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
from datetime import date
from pathlib import Path

from grpoflow.atomic_folder import copy_contents, kept_or_published

WARM_STARTS_DIR = Path(__file__).parent / "warm_starts"
# spec -> its folder under WARM_STARTS_DIR
WARM_STARTS: dict[str, str] = {"builtin:tiny-4m-addition": "tiny-4m-addition"}
# the files of an HF folder a warm start keeps (weights are rewritten in bfloat16)
KEPT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja")
PROVENANCE = "grpoflow_warm_start.json"
SFT_MARKER = "grpoflow_sft.json"  # the settings `grpoflow sft` (commands/sft.py) writes beside a warm start's weights


def is_warm_start(spec: str) -> bool:
    """Whether `spec` names a shipped warm start (no warm-start steps of its own are run for it)."""
    return spec in WARM_STARTS


def shipped_folder(spec: str) -> Path:
    """The package folder of the shipped warm start `spec`."""
    return WARM_STARTS_DIR / WARM_STARTS[spec]


def copy_warm_start(spec: str, into: str | Path) -> str:
    """Copy the shipped warm start `spec` into the run's model folder `into` once, as file contents (a read-only
    install's 0444 files make a writable copy), published whole with a manifest: a kill mid-copy leaves no half
    folder under that name, and a copy damaged since is copied again (`kept_or_published`). Returns its path."""
    folder = Path(into).resolve()
    kept_or_published(folder, lambda tmp: copy_contents(shipped_folder(spec), tmp), f"the copy of {spec}",
                      legacy=lambda f: (f / "config.json").exists())
    return str(folder)


def ship(sft_folder: str | Path, dest: str | Path, *, note: str = "") -> Path:
    """Write the HF folder `sft_folder` (a `grpoflow sft` result) as a shipped warm start into `dest`: its weights
    in bfloat16, its config and tokenizer files, and `grpoflow_warm_start.json` saying how, where and when it was
    made (with the warm start's settings and `note`, e.g. where it stopped). Returns `dest`."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dest = Path(sft_folder), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    weights = load_file(src / "model.safetensors")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, dest / "model.safetensors",
              metadata={"format": "pt"})
    for name in KEPT_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dest / name)
    config = json.loads((dest / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    marker = src / SFT_MARKER
    settings = {k: v for k, v in json.loads(marker.read_text()).items() if k != "model_path"} \
        if marker.exists() else {}
    (dest / PROVENANCE).write_text(json.dumps({
        "made_by": "make warm-start: grpoflow sft (sft_settings), then python -m grpoflow.models.warm_start",
        "sft_settings": settings,
        "note": note, "date": date.today().isoformat(), "machine": _cpu_name(), "torch": torch.__version__,
        "stored": "bfloat16 (loads as float32)"}, indent=2) + "\n")
    return dest


def _cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else the platform's machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":  # make warm-start
    parser = argparse.ArgumentParser(description="Write a `grpoflow sft` folder as the shipped warm start.")
    parser.add_argument("sft_folder")
    parser.add_argument("--dest", default=str(shipped_folder("builtin:tiny-4m-addition")))
    parser.add_argument("--note", default="", help="what the provenance file should say too (where it stopped)")
    args = parser.parse_args()
    print(ship(args.sft_folder, args.dest, note=args.note))
