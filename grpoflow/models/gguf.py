"""GGUF files (llama.cpp's format, often quantized) as a model source.

`model.path=model.gguf` is dequantized once to a plain Hugging Face folder (config, tokenizer with
its chat template, float32 safetensors) and everything downstream - training, rollout, checkpoints,
`grpoflow export` - sees an ordinary HF model. transformers reads GGUF (through the `gguf` package,
extra `grpoflow[gguf]`) but marks such a model as "quantized with gguf" and refuses to save it, so
the dequantized weights are copied into a model built from the same config without that mark.

The folder records the file it came from (`CONVERTED_FROM`); converting the same file into it
again is a no-op (a resumed run reuses it), a different file is an error rather than a silent mix.

Commands without a run folder (`grpoflow eval`) convert into a shared cache instead (`cached_conversion`):
one folder per file, named after the file and a hash of its path, size and mtime, so a second command reuses
it and a changed file gets a new one; a file lock makes two commands converting the same file at once wait for
each other instead of both converting.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch

from grpoflow.atomic_folder import MANIFEST, damaged_file, write_manifest
from grpoflow.errors import MissingExtraError, UserError, UserFileExistsError, UserFileNotFoundError

log = logging.getLogger("grpoflow.models")

CONVERTED_FROM = "grpoflow_gguf_source.json"
EXTRA_HINT = "pip install 'grpoflow[gguf]' (or: pip install gguf)"


def is_gguf(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".gguf")


def _source_record(gguf_file: Path) -> dict:
    stat = gguf_file.stat()
    return {"source": str(gguf_file), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401  (transformers imports it itself; checked here for a clear message)
    except ImportError as e:
        raise MissingExtraError(f"model.path is a .gguf file, which needs the gguf package: {EXTRA_HINT}.") from e


def convert_gguf(gguf_file: str | os.PathLike, out_dir: str | os.PathLike) -> str:
    """Dequantize `gguf_file` into the HF folder `out_dir` (float32) and return `out_dir`.

    Reuses `out_dir` when it was converted from the same file (same path, size and mtime) and its files match their
    manifest (converted again, with a warning, when damaged since); raises if it holds anything else. Written aside
    and renamed, so an interrupted conversion leaves nothing that looks finished.
    """
    src = Path(gguf_file).resolve()
    if not src.is_file():
        raise UserFileNotFoundError(f"model.path={gguf_file}: no such .gguf file; give the path of a GGUF model file.")
    out = Path(out_dir)
    record = _source_record(src)
    marker = out / CONVERTED_FROM
    if marker.exists():
        previous = json.loads(marker.read_text())
        wrong = damaged_file(out) if (out / MANIFEST).exists() else None
        if previous == record and wrong is None:
            return str(out)
        if previous != record:
            raise UserError(f"{out} was converted from {previous.get('source')}, not from {src} (or the file "
                            f"changed since); use a new trainer.output_dir for a different model.")
        log.warning("the conversion of %s in %s is damaged (%s); it is converted again.", src, out, wrong)
        shutil.rmtree(out)  # converted from this file, damaged since
    if out.exists() and any(out.iterdir()):
        raise UserFileExistsError(f"{out} already holds files that did not come from {src}; use a new "
                                  f"trainer.output_dir.")
    _require_gguf()
    tmp = out.with_name(out.name + ".converting")
    shutil.rmtree(tmp, ignore_errors=True)
    model, tokenizer = _load_dequantized(src)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / CONVERTED_FROM).write_text(json.dumps(record, indent=1))
    write_manifest(tmp)  # sizes and SHA-256s: checked before the folder is reused
    if out.exists():
        out.rmdir()  # empty (checked above)
    tmp.rename(out)
    return str(out)


def _load_dequantized(src: Path):
    """The GGUF file's tokenizer and its weights, in float32, in a model transformers will save."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs = dict(gguf_file=src.name, local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(src.parent, dtype=torch.float32, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"could not read {src} with transformers' GGUF loader ({type(e).__name__}: {e}); "
                        f"check that its architecture is one transformers supports for GGUF.") from e
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the mark that makes save_pretrained refuse
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):  # no random init of weights that are overwritten next
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return plain.eval(), tokenizer


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/grpoflow/gguf` (default ~/.cache/grpoflow/gguf)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpoflow" / "gguf"


def cached_conversion(gguf_file: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """The HF folder of `gguf_file` in `cache_dir` (default_cache_dir()), converted on first use, reused after."""
    src = Path(gguf_file).resolve()
    if not src.is_file():
        raise UserFileNotFoundError(f"model.path={gguf_file}: no such .gguf file; give the path of a GGUF model file.")
    key = hashlib.sha256(json.dumps(_source_record(src), sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"{src.stem}-{key}"
    with open(root / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second command waits here, then finds the folder converted
        return convert_gguf(src, out)
