"""A ChatML model folder that TRL's tool loop can run: Hermes tool calls rendered by the chat template and parsed by
the tokenizer's `response_template`, the format grpoflow's `hermes` tool parser reads.

TRL 1.16's `GRPOTrainer(tools=...)` refuses a chat template that drops an assistant message's `tool_calls`
(`supports_tool_calling`), as SmolLM2's and the built-in tiny tokenizer's plain ChatML templates do, and it reads
the model's calls with `tokenizer.parse_response`, which needs a `response_template` (transformers >= 5.13) that
neither ships. `with_hermes_tools(src, dst)` writes a copy of a model folder whose tokenizer has both:

- a chat template that renders every conversation of plain `content` messages exactly as the original ChatML
  template does (checked on probe conversations when the folder is written: grpoflow, which keeps a tool call as
  the assistant's text, sees the same ids either way), and renders an assistant message's `tool_calls` after its
  content as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- a `response_template` that parses `<tool_call>{json}</tool_call>` blocks into `tool_calls` and the rest of the
  turn (up to `<|im_end|>`) into `content`; saved in tokenizer_config.json, so `AutoTokenizer` loads it back.

The tools' schemas are not rendered into the prompt (neither original template does): the system prompt describes
the tool, as grpoflow's smollm2_calculator recipe does, for both frameworks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# Hermes blocks, then the content: what grpoflow/data/tool_format.py's `hermes` format parses, as a
# transformers response template (the format of TRL's qwen3 template, without its <think> field).
HERMES_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}

_TOOL_CALLS = ("{%- if message.get('tool_calls') %}{%- for call in message['tool_calls'] %}"
               "{%- set f = call['function'] if call.get('function') else call %}"
               "{{- '<tool_call>' + ({'name': f['name'], 'arguments': f['arguments']} | tojson) + '</tool_call>' }}"
               "{%- endfor %}{%- endif %}")


def hermes_chatml_template(default_system: str | None = None) -> str:
    """ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n`) with Hermes tool calls after an assistant's content;
    `default_system`: the system message written when the conversation has none (SmolLM2's template has one)."""
    opening = ""
    if default_system is not None:
        opening = ("{%- if loop.first and messages[0]['role'] != 'system' %}"
                   "{{- '<|im_start|>system\\n' + " + repr(default_system) + " + '<|im_end|>\\n' }}{%- endif %}")
    return ("{%- for message in messages %}" + opening +
            "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}" + _TOOL_CALLS +
            "{{- '<|im_end|>\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


PROBES = [[{"role": "user", "content": "347*29"}],
          [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "347*29"},
           {"role": "assistant", "content": '<tool_call>{"name": "calculator"}</tool_call>'},
           {"role": "tool", "name": "calculator", "content": "10063"}, {"role": "assistant", "content": "10063"}]]


def default_system_of(tokenizer) -> str | None:
    """The system message the tokenizer's template writes for a conversation without one (None: it writes none)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    head = "<|im_start|>system\n"
    if not text.startswith(head):
        return None
    return text[len(head):text.index("<|im_end|>")]


def install_hermes_tools(tokenizer) -> None:
    """Give `tokenizer` the Hermes chat template and response template; raises if the new template renders a probe
    conversation differently from the tokenizer's own (so a ChatML template is required)."""
    before = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=g)
              for p in PROBES for g in (False, True)]
    tokenizer.chat_template = hermes_chatml_template(default_system_of(tokenizer))
    after = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=g)
             for p in PROBES for g in (False, True)]
    if before != after:
        raise ValueError(f"the tokenizer's chat template is not plain ChatML: it renders {before[1]!r}, the Hermes "
                         f"ChatML template {after[1]!r}; write a tool-calling template for this model by hand.")
    tokenizer.response_template = HERMES_RESPONSE_TEMPLATE


def with_hermes_tools(src: Path, dst: Path) -> Path:
    """`dst`: a copy of the HF model folder `src` (the weights hard-linked where possible, every other file copied,
    so saving the tokenizer never writes through a link into `src`) whose tokenizer has the Hermes tool templates
    (`install_hermes_tools`)."""
    from transformers import AutoTokenizer
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if not f.is_file() or (dst / f.name).exists():
            continue
        if f.suffix == ".safetensors":
            try:
                (dst / f.name).hardlink_to(f)
                continue
            except OSError:
                pass
        shutil.copy2(f, dst / f.name)
    tokenizer = AutoTokenizer.from_pretrained(src)
    install_hermes_tools(tokenizer)
    tokenizer.save_pretrained(dst)
    stop_at_end_of_turn(dst, tokenizer)
    return dst


def stop_at_end_of_turn(folder: Path, tokenizer) -> None:
    """List `<|im_end|>` among the folder's generation_config EOS ids (as chat models whose EOS is another token do),
    so TRL's sampling ends a turn where grpoflow's does (on the template's end-of-turn token); SmolLM2's EOS already
    is `<|im_end|>`."""
    from transformers import GenerationConfig
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = GenerationConfig.from_pretrained(folder)
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    if end not in eos:
        config.eos_token_id = [e for e in eos if e is not None] + [end]
        (folder / "generation_config.json").unlink(missing_ok=True)  # a copy, but never write through a link
        config.save_pretrained(folder)
