"""Load a tokenizer and a causal LM from a local folder, with errors that say what to fix.

Everything is loaded with ``local_files_only=True``: grpoflow never downloads. A model must
first be saved into a folder (``save_pretrained``, ``huggingface-cli download`` elsewhere, or
``grpoflow.models.tiny.save_tiny_model``) and the folder path given here.
"""

from __future__ import annotations

import inspect
import os
from collections import Counter
from pathlib import Path

import torch
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM, AutoTokenizer

from grpoflow.errors import UserError, UserFileNotFoundError

# How many times this process loaded the tokenizer of each folder: a run's plan loads the policy's once and hands it
# to every role here (tests/integration/test_run_plan.py counts).
TOKENIZER_LOADS: Counter[str] = Counter()

# Any one of these marks a folder as holding a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _check_folder(path: str | os.PathLike, what: str) -> str:
    """Return ``path`` as a string after checking it is an existing local folder."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserFileNotFoundError(
            f"{what} path {path!r} does not exist; give a local folder written by "
            f"save_pretrained (grpoflow never downloads from a model hub)."
        )
    if not os.path.isdir(path):
        raise NotADirectoryError(
            f"{what} path {path!r} is a file, not a folder; give the folder that holds it."
        )
    return path


def load_tokenizer(path: str | os.PathLike):
    """Load the tokenizer saved in the local folder ``path``.

    If the tokenizer has no pad token, its eos token is used as pad: grpoflow pads batches
    itself and masks padded positions, so the pad id only needs to be a valid id. A tokenizer
    with neither pad nor eos token is rejected, since generation could not stop.
    """
    path = _check_folder(path, "tokenizer")
    if not any(os.path.exists(os.path.join(path, name)) for name in _TOKENIZER_FILES):
        raise UserFileNotFoundError(
            f"folder {path!r} holds no tokenizer (none of {list(_TOKENIZER_FILES)}); save one "
            f"there with tokenizer.save_pretrained({path!r})."
        )
    TOKENIZER_LOADS[str(Path(path).resolve())] += 1
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UserError(
            f"could not load the tokenizer in {path!r} ({type(e).__name__}: {e}); re-save it "
            f"with a transformers version that can read it."
        ) from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserError(
                f"tokenizer in {path!r} has neither a pad nor an eos token; set eos_token in "
                f"its tokenizer_config.json."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype = torch.float32, *, meta: bool = False):
    """Load the causal language model saved in the local folder ``path`` with weights in ``dtype``. `meta`: its
    architecture only, on the meta device, no weight read (an FSDP rank other than 0, which receives its shards
    from rank 0: training/engine.py)."""
    return _load_checked(AutoModelForCausalLM, path, dtype=dtype, meta=meta)


def _load_checked(auto_class, path: str | os.PathLike, config_overrides: dict | None = None, *, meta: bool = False,
                  **kwargs):
    """`auto_class.from_pretrained(path)` after checking that `path` holds a causal LM; `config_overrides`
    are set on its config first. `meta`: `auto_class.from_config` on the meta device instead (no weights)."""
    path = _check_folder(path, "model")
    if not os.path.exists(os.path.join(path, "config.json")):
        raise UserFileNotFoundError(
            f"folder {path!r} has no config.json, so it is not a saved model; save one there "
            f"with model.save_pretrained({path!r})."
        )
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UserError(
            f"could not read {os.path.join(path, 'config.json')!r} ({type(e).__name__}: {e}); "
            f"check its model_type is one this transformers version knows."
        ) from e
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise UserError(
            f"model in {path!r} has model_type {config.model_type!r}, which is not a causal "
            f"language model; give a decoder-only LM such as Llama or Qwen2."
        )
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    if meta:
        with torch.device("meta"):
            return auto_class.from_config(config, **kwargs)
    try:
        return auto_class.from_pretrained(path, config=config, local_files_only=True, **kwargs)
    except OSError as e:  # typically: config.json present but no weights file
        raise UserFileNotFoundError(
            f"could not load the weights in {path!r} ({e}); save them there with "
            f"model.save_pretrained({path!r})."
        ) from e


def load_value_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """The model in ``path`` with a scalar head on every position (a critic): a token-classification
    model with one label. The head is newly initialised when the folder holds a plain causal LM."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "score head newly initialised" is expected here, not a warning
    try:
        # one scalar per position; no dropout, so values are not noisy in train mode
        return _load_checked(AutoModelForTokenClassification, path, dtype=dtype,
                             config_overrides={"num_labels": 1, "classifier_dropout": 0.0})
    finally:
        hf_logging.set_verbosity(verbosity)


def saved_state(model: torch.nn.Module, folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The weights `model.save_pretrained(folder)` wrote, keyed like `model.state_dict()`: every safetensors
    file of the folder. A LoRA folder holds only the adapters, under PEFT's file names (the adapter name left
    out: `lora_A.weight`, not `lora_A.default.weight`); a tied weight (one Parameter under two names, e.g.
    the input and output embeddings) may be saved under one name only. Anything else missing or extra
    is an error naming a few keys."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(file))
    if not state:
        raise UserFileNotFoundError(f"checkpoint {folder} holds no *.safetensors weights.")
    keys = list(model.state_dict())
    if hasattr(model, "peft_config"):  # LoRA: only the adapters were saved
        adapters = list(model.peft_config)  # type: ignore[arg-type]  # a PeftModel's dict of adapters
        expected = {_without_adapter_name(k, adapters): k for k in keys if "lora_" in k}
    else:
        expected = {k: k for k in keys}
    unexpected = [k for k in state if k not in expected]
    missing = [k for k in expected if k not in state and not _is_tied(model, expected[k])]
    if unexpected or missing:
        raise UserError(f"checkpoint {folder} does not match the model: missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}; resume with the model.path (and model.lora) it was trained with.")
    return {expected[k]: v for k, v in state.items()}


def load_saved_weights(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Load, in place, the weights `model.save_pretrained(folder)` wrote (see `saved_state`)."""
    model.load_state_dict(saved_state(model, folder), strict=False)


def _without_adapter_name(key: str, adapters: list[str]) -> str:
    for name in adapters:
        key = key.replace(f".{name}.", ".")
    return key


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    """True if parameter `name` is the same Parameter as another name's (tied embeddings)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return name in params and any(other != name and p is params[name] for other, p in params.items())


def load_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """A sequence-classification model with one score per text (a reward model) from a local folder."""
    from transformers import AutoModelForSequenceClassification

    path = _check_folder(path, "reward model")
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UserError(f"reward.model.path={path}: not a loadable sequence-classification model "
                        f"({type(e).__name__}: {e}); save one with model.save_pretrained(path).") from e
    if model.config.num_labels != 1:
        raise UserError(f"reward.model.path={path} has {model.config.num_labels} labels; a reward model gives "
                        "one score per text (num_labels=1).")
    if model.config.pad_token_id is None:
        raise UserError(f"reward.model.path={path}: its config has no pad_token_id, so the score position of a "
                        "padded batch is unknown; set pad_token_id in its config.json.")
    return model


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward keyword that takes a KV cache: `cache` from transformers 5.24, `past_key_values` before
    (an older version silently ignores `cache=`, so the wrong keyword would drop the prompt's KV)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
