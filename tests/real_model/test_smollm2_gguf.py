"""`model.path=file.gguf`: dequantized once into the run folder, equal to transformers' own GGUF loading,
reused (not redone) when the run resumes."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpoflow.config import load_config
from grpoflow.plan.run_plan import resolve_model
from grpoflow.models.gguf import CONVERTED_FROM
from real_model_helpers import chat_ids

pytestmark = pytest.mark.real_model



def test_gguf_model_path_is_converted_once_into_the_run_folder(tmp_path, smollm2_gguf, smollm2):
    _, tokenizer = smollm2
    cfg = load_config(None, [f"model.path={smollm2_gguf}", f"trainer.output_dir={tmp_path}"])
    folder = Path(resolve_model(cfg, tmp_path))
    assert folder == tmp_path.resolve() / "base_model" and (folder / CONVERTED_FROM).exists()
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert resolve_model(cfg, tmp_path) == str(folder) and weights.stat().st_mtime_ns == stamp   # resume: reused

    ids = torch.tensor([chat_ids(tokenizer, "What is 7 + 5? Answer with just the number.")])
    gguf = Path(smollm2_gguf)
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    converted = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, reference(ids).logits)
