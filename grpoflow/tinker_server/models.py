"""Base models by name, and the training models made from them (LoRA or full), saved and loaded as states.

A `base_model` name is resolved as every model spec is (models/spec.py), in order, as: the alias
`tinker.model_name` (meaning `model.path`); a `builtin:tiny-<size>` model (built once into `<root>/base_models/`); a
local HF folder or `.gguf` file (converted once into `<root>/base_models/`); a name in the local Hugging Face cache
(offline). The SDK's `get_tokenizer()` loads `model_data.tokenizer_id`, which is always the local folder, so it works
offline; builtin: models are reported under their folder's path, because a sampling client loads its tokenizer from
the model name.

LoRA training models on one base model share one copy of its weights (`BaseModels.shared`, frozen): each holds
its own module tree around the same parameter tensors (`sharing_copy`), its adapters and their optimizer state.
A full fine-tuning model has its own copy.

Saved states (`save_state`, `tinker://<model_id>/weights/<name>`) are grpoflow's atomic checkpoint folders:
the engine's HF folder (adapters or full weights + optimizer.pt) and `tinker_model.json` (base model, LoRA).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpoflow.atomic_folder import damaged_file, publish_folder
from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.models.lora import add_lora
from grpoflow.models.spec import is_builtin, model_folder, store_name
from grpoflow.training.collectives import current_device
from grpoflow.training.engine import TrainEngine
from grpoflow.errors import UserError
from grpoflow.tinker_server.futures import SeqGate

MODEL_FILE = "tinker_model.json"
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class BaseModel:
    name: str      # as the client reports it (model_data.model_name)
    folder: str    # local HF folder with the tokenizer (model_data.tokenizer_id)


@dataclass(frozen=True)
class ModelSpec:
    """What a training model is: its base model and adapters (None: full fine-tuning). Saved with every state."""
    base_model: str
    lora_rank: int | None = None
    lora_alpha: float = 32.0
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None


class BaseModels:
    """base_model name -> BaseModel, resolved once (building builtin: models, converting GGUF files)."""

    def __init__(self, root: Path, default_path: str, alias: str | None, seed: int = 0) -> None:
        self.root, self.default_path, self.alias, self.seed = root, default_path, alias, seed
        self._known: dict[str, BaseModel] = {}
        self._shared: dict[str, torch.nn.Module] = {}
        self._lock = threading.RLock()

    def served(self) -> list[str]:
        return [n for n in (self.alias, self.default_path) if n]

    def resolve(self, name: str) -> BaseModel:
        with self._lock:
            if name not in self._known:
                self._known[name] = self._resolve(name)
            return self._known[name]

    def shared(self, base: BaseModel) -> torch.nn.Module:
        """The one frozen copy of `base`'s weights on this device that LoRA models and the sampler read."""
        with self._lock:
            if base.folder not in self._shared:
                model = load_causal_lm(base.folder).to(current_device())
                model.requires_grad_(False)
                self._shared[base.folder] = model
            return self._shared[base.folder]

    @staticmethod
    def context_length(base: BaseModel) -> int | None:
        """The model's context (max_position_embeddings in its config.json), None when it names none."""
        try:
            value = json.loads((Path(base.folder) / "config.json").read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            return None
        return int(value) if isinstance(value, int) and value > 0 else None

    def _resolve(self, name: str) -> BaseModel:
        path = self.default_path if name == self.alias else name
        folder = model_folder(path, setting=f"base_model={name!r}", into=self.root / "base_models" /
                              store_name(path, self.seed), seed=self.seed, hub_cache=True,
                              also=f", or one of {self.served()}; see docs/tinker.md")
        # a builtin: model is reported under its folder, from which a sampling client loads its tokenizer
        return BaseModel(name=folder if is_builtin(path) and name != self.alias else name, folder=folder)


def lora_targets(spec: ModelSpec, model: torch.nn.Module) -> list[str]:
    """Module names for the adapters: the attention and/or MLP projections. `train_unembed` adds none: an adapter
    on the output head makes PEFT save the head's full weight beside the adapters, which grpoflow's checkpoints
    (adapters only) do not hold; the head trains with full fine-tuning (lora_config=None)."""
    targets = (ATTENTION if spec.train_attn else []) + (MLP if spec.train_mlp else [])
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in targets if t in present]
    if not targets:
        raise UserError("the LoRA config selects no layer of this model (train_attn and train_mlp are both off); "
                        "enable one of them.")
    return targets


def sharing_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model`'s modules holding the very same parameter and buffer tensors (no weight is copied), so
    adapters can be added to it without touching `model` or the other copies."""
    same = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, same)


class TrainingModel:
    """One training client's model: the engine, its spec and the order its requests run in. `shared`: the base
    model's weights to build LoRA adapters around (BaseModels.shared); None loads a copy of its own."""

    def __init__(self, model_id: str, base: BaseModel, spec: ModelSpec, gate: SeqGate,
                 shared: torch.nn.Module | None = None) -> None:
        self.model_id, self.base, self.spec, self.gate = model_id, base, spec, gate
        self.last_used = time.monotonic()
        lora = spec.lora_rank is not None
        model = sharing_copy(shared) if lora and shared is not None else load_causal_lm(base.folder)
        if spec.lora_rank is not None:
            if spec.lora_rank < 1:
                raise UserError(f"lora rank {spec.lora_rank}: give a rank of 1 or more.")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0 if spec.seed is None else spec.seed)
                model = add_lora(model, rank=spec.lora_rank, alpha=spec.lora_alpha,
                                 target_modules=lora_targets(spec, model))
        # Tinker's Adam defaults; every optim_step sets its own learning rate, betas, eps, decay and clip
        self.engine = TrainEngine(model, lr=1e-4, weight_decay=0.0, grad_clip=0.0, betas=(0.9, 0.95))
        self.tokenizer = load_tokenizer(base.folder)

    def save(self, folder: Path, optimizer: bool = True) -> None:
        """An atomic state folder: the engine's HF folder + optimizer.pt, and the spec."""
        def write(tmp: Path) -> None:
            self.engine.save(tmp)
            if not optimizer:
                (tmp / "optimizer.pt").unlink(missing_ok=True)
            (tmp / MODEL_FILE).write_text(json.dumps(asdict(self.spec), indent=1))
        publish_folder(folder, write)

    def load(self, folder: Path, optimizer: bool) -> None:
        check_state(folder)
        if optimizer:
            self.engine.load(folder)
            return
        from grpoflow.models.loading import load_saved_weights

        load_saved_weights(self.engine.model, folder)


def check_state(folder: Path) -> ModelSpec:
    """The spec of a saved state; UserError if the folder is not a complete one."""
    if not (folder / MODEL_FILE).is_file():
        raise UserError(f"no saved state at {folder}: save one with training_client.save_state(name) first.")
    damage = damaged_file(folder)
    if damage is not None:
        raise UserError(f"the saved state {folder} is damaged ({damage}); load an earlier one.")
    return ModelSpec(**json.loads((folder / MODEL_FILE).read_text()))


SAVE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
MODEL_ID = re.compile(r"[A-Za-z0-9_-]{1,100}:train:[0-9]{1,18}")


def safe_name(name: str) -> str:
    """A save name as it is: a folder name that round-trips through its tinker:// path (no `/`, no `..`, no
    leading dot, nothing a file system or URL would change); anything else is refused, never rewritten."""
    if not SAVE_NAME.fullmatch(name) or ".." in name:
        raise UserError(f"{name!r} is not a usable checkpoint name; use letters, digits, '-', '_' and '.' (not "
                        "starting with '.', no '..', at most 200 characters).")
    return name


def model_folder_name(model_id: str) -> str:
    """A training model id (`<session>:train:<n>`) as a folder name; one-to-one, since `<n>` is a number."""
    if not MODEL_ID.fullmatch(model_id):
        raise UserError(f"{model_id!r} is not a training model id of this server (<session>:train:<n>).")
    return model_id.replace(":", "_")
