"""LoRA adapters via `peft`, and what the rest of grpoflow needs from an adapted model.

Only the adapters train. The reference policy is the same module with its adapters disabled,
so a KL term costs no second copy of the model. The rollout engine receives merged weights
`W + scale * B @ A` under the base model's parameter names, computed without touching the
trained weights (merge-then-unmerge would drift by rounding every step), or with
`rollout.lora_sync=adapter` only the adapter tensors (`is_adapter_weight`), which the engine applies
itself (engines/hf_adapter.py, vLLM's LoRA requests).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from grpoflow.errors import MissingExtraError


def _peft():
    try:
        import peft
    except ImportError:
        raise MissingExtraError("model.lora.rank > 0 needs peft, which is not installed; "
                                "pip install 'grpoflow[lora]'.") from None
    return peft


def add_lora(model: torch.nn.Module, *, rank: int, alpha: float, target_modules: list[str] | str,
             dropout: float = 0.0) -> torch.nn.Module:
    """Wrap `model` with fresh LoRA adapters; base weights are frozen."""
    peft = _peft()
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=dropout,
                             bias="none", task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def merged_named_weights(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the base model with each LoRA delta added, under the base model's names."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()  # type: ignore[operator]  # a PeftModel method
    deltas: dict[str, Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters)  # type: ignore[attr-defined]
            deltas[f"{name}.base_layer.weight"] = delta  # type: ignore[assignment]  # sum() of tensors
    for name, param in base.named_parameters():
        if "lora_" in name:
            continue
        tensor = param.detach()
        if name in deltas:
            tensor = tensor + deltas[name].detach()
        yield name.replace(".base_layer.", "."), tensor


def is_adapter_weight(name: str) -> bool:
    """Whether a parameter name (peft's naming) is a LoRA adapter tensor."""
    return ".lora_A." in name or ".lora_B." in name


def peft_file_key(name: str, adapter: str = "default") -> str:
    """A parameter name as peft's adapter_model.safetensors spells it (no adapter name): what vLLM reads.
    `base_model.model.layers.0.q_proj.lora_A.default.weight` -> `base_model.model.layers.0.q_proj.lora_A.weight`"""
    return name.replace(f".lora_A.{adapter}.", ".lora_A.").replace(f".lora_B.{adapter}.", ".lora_B.")


def adapter_config(spec: dict, base_path: str, tensor_names: list[str]) -> dict:
    """peft's adapter_config.json for `spec` (rank, alpha) on the model in `base_path`; the target modules are
    read from the adapter tensors' names (`...q_proj.lora_A.weight` -> q_proj), so `all-linear` resolves too."""
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in tensor_names if is_adapter_weight(n)})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec["rank"], "lora_alpha": spec["alpha"],
            "target_modules": targets, "lora_dropout": 0.0, "bias": "none",
            "base_model_name_or_path": base_path, "fan_in_fan_out": False, "modules_to_save": None,
            "use_rslora": False, "use_dora": False}


def merge_to_plain_model(base_path: str, adapter_folder: str, dtype: torch.dtype = torch.float32):
    """The base model in `base_path` with the adapters in `adapter_folder` merged in: a plain HF model."""
    peft = _peft()
    from grpoflow.models.loading import load_causal_lm

    adapted = peft.PeftModel.from_pretrained(load_causal_lm(base_path, dtype), adapter_folder)
    return adapted.merge_and_unload()
