"""trajectories.chat: token-exact rendering, the end-of-turn separator, and the template check, by hand on a ChatML
and a Llama-3-style template (char tokenizers: one id per character, so the expected ids are readable)."""

import pytest

from grpoflow.errors import UserError
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.trajectories.chat import ChatRenderer, TemplateError

LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Qwen3-style: an earlier assistant turn loses its reasoning once a user turn follows it.
DROPS_REASONING = (
    "{% for m in messages %}"
    "{% set content = m['content'] %}"
    "{% if m['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NO_TURN_END = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


def chatml():
    return build_char_tokenizer()


def llama3():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|begin_of_text|>", "<|start_header_id|>",
                                                         "<|end_header_id|>", "<|eot_id|>"]})
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def ids(tok, *pieces):
    """Ids of pieces: a special token's text is its id, any other text one id per character."""
    out = []
    for piece in pieces:
        special = tok.convert_tokens_to_ids(piece) if piece in tok.all_special_tokens else None
        out += [special] if special is not None else [tok.convert_tokens_to_ids(c) for c in piece]
    return out


def test_chatml_turn_ends_with_im_end_and_the_newline_the_engine_never_emits():
    tok = chatml()
    r = ChatRenderer(tok)
    assert (r.turn.end_token_id, r.turn.end_text, r.turn.separator) == (tok.convert_tokens_to_ids("<|im_end|>"),
                                                                        "<|im_end|>", "\n")
    history = [{"role": "user", "content": "Guess 1-8"}, {"role": "assistant", "content": "4"}]
    got = r.continuation_ids(history, [{"role": "user", "content": "higher"}])
    # the separator "\n" first, then the user turn, then the next generation prompt
    assert got == ids(tok, "\n", "<|im_start|>", "user\nhigher", "<|im_end|>", "\n", "<|im_start|>", "assistant\n")
    assert r.prompt_ids(history[:1]) == ids(tok, "<|im_start|>", "user\nGuess 1-8", "<|im_end|>", "\n",
                                            "<|im_start|>", "assistant\n")


def test_llama3_turn_ends_with_eot_and_no_separator():
    tok = llama3()
    r = ChatRenderer(tok)
    assert (r.turn.end_text, r.turn.separator) == ("<|eot_id|>", "")
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    got = r.continuation_ids(history, [{"role": "tool", "content": "42"}])
    assert got == ids(tok, "<|start_header_id|>", "tool", "<|end_header_id|>", "\n\n42", "<|eot_id|>",
                      "<|start_header_id|>", "assistant", "<|end_header_id|>", "\n\n")
    assert r.prompt_ids(history[:1])[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")


def test_a_demonstration_conversation_renders_by_the_rollout_rules():
    tok = chatml()
    r = ChatRenderer(tok)
    demo = [{"role": "user", "content": "Guess 1-8"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "higher"}, {"role": "assistant", "content": "6"}]
    prompt, segments = r.conversation_ids(demo)
    assert prompt == r.prompt_ids(demo[:1])
    assert segments == [(ids(tok, "4", "<|im_end|>"), True), (r.continuation_ids(demo[:2], demo[2:3]), False),
                        (ids(tok, "6", "<|im_end|>"), True)]
    # the whole demonstration is exactly the template's rendering of the conversation
    whole = prompt + [t for s, _ in segments for t in s]
    assert tok.decode(whole) == r.render(demo, add_generation_prompt=False).removesuffix("\n")


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_reason():
    tok = chatml()
    tok.chat_template = DROPS_REASONING
    with pytest.raises(TemplateError, match="not prefix-preserving"):
        ChatRenderer(tok)


def test_a_template_without_an_end_of_turn_token_is_refused():
    tok = chatml()
    tok.chat_template = NO_TURN_END
    with pytest.raises(TemplateError, match="does not start with a special token"):
        ChatRenderer(tok)


def test_a_tokenizer_without_a_template_is_refused():
    tok = chatml()
    tok.chat_template = None
    with pytest.raises(TemplateError, match="need a chat template"):
        ChatRenderer(tok)


def test_a_warm_start_demonstration_opens_exactly_as_the_rollout_prompt_with_the_system_prompt():
    from grpoflow.commands.sft import sft_examples

    tok = chatml()
    demo = [{"role": "user", "content": "3*4"}, {"role": "assistant", "content": "12"}]
    row = {"prompt": "3*4", "demo": demo}
    (prompt, target, trained), = sft_examples([row], tok, "prompt", "demo", system_prompt="Use the tool.")
    # the rollout's first prompt: its opening with data.system_prompt (EnvLoop), rendered by the same rules
    rollout_prompt = ChatRenderer(tok).prompt_ids([{"role": "system", "content": "Use the tool."}, demo[0]])
    assert prompt == rollout_prompt
    assert tok.decode(prompt).startswith("<|im_start|>system\nUse the tool.<|im_end|>")
    assert target == ids(tok, "12", "<|im_end|>") and trained == [1] * len(target)
    # without a system prompt the demonstration opens with the user turn, as before
    (bare, _, _), = sft_examples([row], tok, "prompt", "demo")
    assert bare == ChatRenderer(tok).prompt_ids(demo[:1])


def test_a_warm_start_on_chat_message_prompts_renders_them_as_the_run_does():
    from grpoflow.commands.sft import sft_examples
    from grpoflow.data.dataset import render_prompt

    tok = chatml()
    row = {"prompt": [{"role": "user", "content": "2+2"}], "reward_model": {"ground_truth": "4"}}
    (prompt, target, trained), = sft_examples([row], tok, "prompt", "reward_model.ground_truth")
    assert prompt == tok.encode(render_prompt(row["prompt"], tok), add_special_tokens=False)
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n") and trained == [1] * len(target)
    with pytest.raises(UserError, match="sft.response_key=reward_model.ground_truth.*or sft.steps=0"):
        sft_examples([row], tok, "prompt", "answer")
