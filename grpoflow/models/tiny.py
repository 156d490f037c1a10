"""Tiny models built from nothing: a character-level tokenizer and small Llama models.

There is no model hub here, so tests, examples and benchmarks build their own model. Every
printable ASCII character (and "\\n") is one token, which makes arithmetic tasks such as
"37+48=" -> "85" easy to read token by token.

Why Llama and not Qwen2: for ``model_type: qwen2`` transformers 5 forces ``Qwen2Tokenizer``
on reload, which ignores the saved ``tokenizer.json`` and silently drops spaces and newlines.
A Llama config reloads our ``tokenizer.json`` as is.
"""

from __future__ import annotations

import os
import string

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpoflow.errors import UserError

PAD, BOS, EOS, UNK = "<|pad|>", "<|bos|>", "<|endoftext|>", "<|unk|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, IM_START, IM_END]

# ChatML, as used by Qwen: `<|im_start|>role\ncontent<|im_end|>\n` per message.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# name -> (hidden, layers, heads, kv_heads, intermediate). With the 102-token char vocabulary
# (96 chars + 6 specials) and untied embeddings: 0.52M, 3.99M and 31.6M parameters.
TINY_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "0.5m": (128, 2, 4, 2, 512),
    "4m": (256, 4, 4, 2, 1024),
    "30m": (512, 8, 8, 4, 2048),
}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Return a tokenizer where each printable ASCII character or "\\n" is one token.

    A BPE model with no merges maps every character to its own id; special tokens come first
    (ids 0..5) and are matched whole, so ChatML text round-trips. No BOS is added when
    encoding: prompts are raw strings and are tokenized exactly as written.
    """
    chars = sorted(set(string.printable) - set("\t\r\x0b\x0c") | {"\n"})
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=True))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    size: str = "4m",
    seed: int = 0,
    max_position_embeddings: int = 256,
) -> LlamaForCausalLM:
    """Return a randomly initialised fp32 Llama of one of ``TINY_SIZES``.

    The same ``seed`` gives the same weights (the global RNG is restored afterwards, so
    building a model does not disturb the caller's random stream).
    """
    if size not in TINY_SIZES:
        raise UserError(f"unknown tiny model size {size!r}; choose one of {sorted(TINY_SIZES)}")
    hidden, layers, heads, kv_heads, intermediate = TINY_SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",  # type: ignore[call-arg]  # a PretrainedConfig keyword, not in LlamaConfig's stub
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(torch.float32)  # type: ignore[arg-type]  # transformers types .to() for devices only


def save_tiny_model(out_dir: str | os.PathLike, size: str = "4m", seed: int = 0) -> str:
    """Build the char tokenizer and a tiny model and save both (safetensors) into ``out_dir``.

    Returns the folder path, loadable with ``grpoflow.models.loading``.
    """
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, size=size, seed=seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
