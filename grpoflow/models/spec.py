"""A model spec -> a local model folder, the one place it is decided: `model.path` (run, sft), `distill.teacher.path`,
`reward.judge.path`, the Tinker server's `base_model` names and `grpoflow eval`'s model all go through `model_folder`.

A spec is, in this order:

- a `.gguf` file: dequantized once (models/gguf.py) into `into`, the folder a run keeps for this model (reused on
  resume), or, without one, into the shared conversion cache (`gguf_cache_dir`, `cached_conversion`);
- `builtin:tiny-<size>`: the tiny model (models/tiny.py) built with `seed` into `into`, once, with a manifest (a
  folder that matches it is reused, a damaged one built again); a command without a folder of its own (`into`
  None) cannot take one;
- `builtin:tiny-4m-addition`: a shipped warm start (models/warm_start.py) copied into `into` once, or, without one,
  its folder in the package;
- a local folder: its absolute path (checkpoints record it);
- with `hub_cache` (the Tinker server), a name in the local Hugging Face cache, never downloaded.

Anything else is a `ModelSpecError` naming the setting, the value and what the setting takes. grpoflow never downloads.
"""

from __future__ import annotations

import re
from pathlib import Path

from grpoflow.atomic_folder import kept_or_published
from grpoflow.errors import UserError
from grpoflow.models.gguf import cached_conversion, convert_gguf, is_gguf
from grpoflow.models.tiny import TINY_SIZES, save_tiny_model
from grpoflow.models.warm_start import WARM_STARTS, copy_warm_start, is_warm_start, shipped_folder

BUILTIN = "builtin:"
BUILTIN_TINY = "builtin:tiny-"


class ModelSpecError(UserError):
    """A setting names no model this machine has (or an unknown built-in); the message names it and the fix."""


def is_builtin(spec: str) -> bool:
    """Whether `spec` names a built-in model (`builtin:...`)."""
    return spec.startswith(BUILTIN)


def store_name(spec: str, seed: int = 0) -> str:
    """The folder name a store of built and converted models (the Tinker server's `<root>/base_models/`) gives
    `spec`: `builtin-tiny-<size>-seed<seed>` for a built-in, the file's stem for a `.gguf` file, '' otherwise."""
    if is_builtin(spec):
        return f"builtin-tiny-{spec.removeprefix(BUILTIN_TINY)}-seed{seed}"
    return Path(spec).stem if is_gguf(spec) else ""


def model_folder(spec: str, *, setting: str, into: str | Path | None = None, seed: int = 0,
                 gguf_cache_dir: str | Path | None = None, hub_cache: bool = False, also: str = "") -> str:
    """The local HF model folder for the model spec `spec` (module docstring). `setting` names where the spec came
    from in error messages (`model.path`, `distill.teacher.path`, ...); `also` adds what else that setting takes
    (", or self")."""
    if is_gguf(spec):
        return convert_gguf(spec, into) if into is not None else cached_conversion(spec, gguf_cache_dir)
    if is_builtin(spec):
        return _builtin(spec, setting=setting, into=into, seed=seed)
    if Path(spec).is_dir():
        return str(Path(spec).resolve())
    cached = _hub_cache_folder(spec) if hub_cache else None
    if cached is not None:
        return cached
    kinds = ", a .gguf file" + (f", {BUILTIN_TINY}4m" if into is not None else "") + \
        (", a name in the local Hugging Face cache" if hub_cache else "")
    raise ModelSpecError(f"{setting}={spec} is not a folder; give a local HF model folder{kinds}{also} (this machine "
                      "has no model hub).")


def _builtin(spec: str, *, setting: str, into: str | Path | None, seed: int) -> str:
    if is_warm_start(spec):
        return copy_warm_start(spec, into) if into is not None else str(shipped_folder(spec))
    size = spec.removeprefix(BUILTIN_TINY)
    if not spec.startswith(BUILTIN_TINY) or size not in TINY_SIZES:
        builtins = [BUILTIN_TINY + s for s in TINY_SIZES] + list(WARM_STARTS)
        raise ModelSpecError(f"{setting}={spec}: unknown built-in; use one of {builtins}.")
    if into is None:
        raise ModelSpecError(f"{setting}={spec}: a built-in model is built into a run folder; give that run's folder "
                          "or a model folder.")
    folder = Path(into).resolve()  # built once: a resumed run or a second name reuses it, unless it was damaged
    kept_or_published(folder, lambda tmp: save_tiny_model(tmp, size=size, seed=seed), f"the built {spec}",
                      legacy=lambda f: (f / "config.json").exists())
    return str(folder)


def _hub_cache_folder(name: str) -> str | None:
    """The snapshot folder of `name` in the local Hugging Face cache, never downloading; None if absent."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return None
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(name, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError) or no hub library: not a cached model
        return None
    return folder if (Path(folder) / "config.json").exists() else None
