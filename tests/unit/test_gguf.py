"""GGUF as a model source (grpoflow.models.gguf), on CPU without any download: a tiny Llama with a
byte-level BPE vocabulary is written as a float32 GGUF file with the `gguf` package's writer (q/k
permuted as llama.cpp stores them), then converted back and compared with the model it came from."""

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpoflow.config import load_config
from grpoflow.plan.run_plan import resolve_model
from grpoflow.models.gguf import CONVERTED_FROM, convert_gguf, is_gguf
from grpoflow.models.tiny import CHATML_TEMPLATE

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# GPT-2 byte-level alphabet for printable ASCII: bytes map to themselves except space and newline
CHARS = {" ": "Ġ", "\n": "Ċ", **{chr(b): chr(b) for b in range(33, 127)}}


def _llama_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's storage order of q/k rows (the inverse of what transformers' GGUF reader undoes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path) -> tuple[LlamaForCausalLM, list[str]]:
    gguf = pytest.importorskip("gguf")
    tokens = SPECIALS + sorted(set(CHARS.values()))
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128), w.add_embedding_length(64), w.add_block_count(2), w.add_feed_forward_length(128)
    w.add_head_count(4), w.add_head_count_kv(2), w.add_layer_norm_rms_eps(1e-5), w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(16), w.add_vocab_size(len(tokens)), w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("default"), w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * len(CHARS))
    w.add_token_scores([0.0] * len(tokens)), w.add_token_merges([])
    w.add_bos_token_id(1), w.add_eos_token_id(2), w.add_pad_token_id(2)
    w.add_chat_template(CHATML_TEMPLATE)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(2):
        names.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for hf, g in per_layer.items()})
    for hf, g in names.items():
        t = sd[hf]
        if g.endswith("attn_q.weight"):
            t = _llama_permute(t, 4)
        elif g.endswith("attn_k.weight"):
            t = _llama_permute(t, 2)
        w.add_tensor(g, t.numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return model, tokens


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    model, tokens = write_tiny_gguf(path)
    return path, model, tokens


def test_is_gguf():
    assert is_gguf("a/b/Model.Q4_1.GGUF") and is_gguf(Path("m.gguf")) and not is_gguf("models/m")


def test_conversion_gives_the_same_model_and_tokenizer(tiny_gguf, tmp_path):
    path, model, tokens = tiny_gguf
    out = Path(convert_gguf(path, tmp_path / "hf"))
    assert (out / "model.safetensors").exists() and (out / CONVERTED_FROM).exists()
    converted = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert "quantization_config" not in converted.config.to_dict()
    ids = torch.tensor([[5, 9, 40, 41, 7, 2, 3]])
    with torch.no_grad():
        assert torch.allclose(converted(ids).logits, model(ids).logits, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|im_end|>"
    assert tokenizer("7+5=12", add_special_tokens=False)["input_ids"] == [tokens.index(c) for c in "7+5=12"]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_run_converts_once_and_reuses_the_folder_on_resume(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    cfg = load_config(None, [f"model.path={path}", f"trainer.output_dir={tmp_path}"])
    folder = Path(resolve_model(cfg, tmp_path))
    assert folder == tmp_path.resolve() / "base_model"
    weights = folder / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert resolve_model(cfg, tmp_path) == str(folder)
    assert weights.stat().st_mtime_ns == written   # not converted again


def test_a_folder_converted_from_another_file_is_refused(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    out = convert_gguf(path, tmp_path / "hf")
    other = tmp_path / "other.gguf"
    other.write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match="new trainer.output_dir"):
        convert_gguf(other, out)


def test_missing_file_and_missing_extra_errors_name_the_fix(tiny_gguf, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no such .gguf file"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "hf")
    monkeypatch.setitem(sys.modules, "gguf", None)   # as if the extra were not installed
    with pytest.raises(ImportError, match=r"grpoflow\[gguf\]"):
        convert_gguf(tiny_gguf[0], tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_eval_converts_a_gguf_file_once_into_the_cache_and_reuses_it(tiny_gguf, tmp_path):
    from grpoflow.commands.evaluate import policy_folder

    path, model, _ = tiny_gguf
    cache = tmp_path / "cache"
    folder = Path(policy_folder(str(path), str(cache)))
    assert folder.parent == cache and folder.name.startswith("tiny-")
    converted = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    ids = torch.tensor([[5, 9, 40, 41]])
    with torch.no_grad():
        assert torch.allclose(converted(ids).logits, model(ids).logits, atol=1e-5)
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert policy_folder(str(path), str(cache)) == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == written   # reused, not converted again
    changed = tmp_path / "tiny.gguf"
    changed.write_bytes(path.read_bytes())   # another file (path, mtime): its own folder
    assert policy_folder(str(changed), str(cache)) != str(folder)


def test_grpoflow_eval_takes_a_gguf_file(tiny_gguf, tmp_path, capsys):
    """The new user's command: `grpoflow eval model.path=X.gguf data.val_files=...` converts and evaluates."""
    from grpoflow.cli import main

    path, _, _ = tiny_gguf
    args = ["eval", f"model.path={path}", f"model.gguf_cache_dir={tmp_path / 'cache'}",
            "data.val_files=[builtin:addition/val]", "data.val_max_prompts=3", "rollout.max_new_tokens=3",
            f"trainer.output_dir={tmp_path / 'out'}"]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "addition" in out and "(3 prompts)" in out, out
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 1
