"""One checkpoint reader (models.loading.saved_state) for every load: plain, tied embeddings, LoRA adapters."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpoflow.models.loading import load_saved_weights, saved_state


def tiny(tied: bool, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32, tie_word_embeddings=tied))


@pytest.mark.parametrize("tied", [False, True])
def test_a_saved_model_loads_back_exactly(tmp_path, tied):
    saved, fresh = tiny(tied, 0), tiny(tied, 1)
    saved.save_pretrained(tmp_path)
    load_saved_weights(fresh, tmp_path)
    for (name, a), b in zip(saved.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    if tied:  # saved once, shared by both names after the load
        assert fresh.lm_head.weight is fresh.model.embed_tokens.weight


def test_a_missing_weight_that_is_not_tied_is_an_error(tmp_path):
    from safetensors.torch import save_file

    state = {k: v for k, v in tiny(False, 0).state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\].*resume with the model.path"):
        saved_state(tiny(False, 1), tmp_path)


def test_another_architecture_is_an_error_naming_unexpected_keys(tmp_path):
    tiny(False, 0).save_pretrained(tmp_path)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32, tie_word_embeddings=False))
    with pytest.raises(ValueError, match="missing .*model.layers.1"):
        saved_state(other, tmp_path)


def test_lora_adapters_load_under_peft_names(tmp_path):
    pytest.importorskip("peft")
    from grpoflow.models.lora import add_lora

    saved = add_lora(tiny(False, 0), rank=2, alpha=4.0, target_modules=["q_proj"])
    with torch.no_grad():
        for name, p in saved.named_parameters():
            if "lora_" in name:
                p.normal_()
    saved.save_pretrained(tmp_path)
    fresh = add_lora(tiny(False, 0), rank=2, alpha=4.0, target_modules=["q_proj"])
    state = saved_state(fresh, tmp_path)
    assert state and all("lora_" in k and ".default." in k for k in state)
    load_saved_weights(fresh, tmp_path)
    for (name, a), b in zip(saved.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
