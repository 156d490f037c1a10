"""Token-exact chat rendering for multi-turn rollouts.

A trajectory's ids are never made by decoding the model's text and encoding it again (that changes
tokens: verl #6719, SkyRL #123). The model's turns are the ids the engine sampled; everything else
is rendered by the tokenizer's chat template as a *suffix* of the conversation so far:

    before = render(history ending with the assistant turn just sampled)
    after  = render(history + new messages, add_generation_prompt=True)
    ids    = encode(separator + after[len(before):])

`separator` is what the template writes after the end-of-turn token and the engine never emits
("\\n" after ChatML's <|im_end|>, nothing after Llama-3's <|eot_id|>): without it the model would
see a turn boundary at training time that it never saw at sampling time (verl #6501/#6921).

This needs a template that renders *prefix-preservingly*: appending messages only appends text.
`check_template` proves it on a sample conversation at start and names the problem when it fails
(e.g. a template that drops earlier turns' reasoning, as Qwen3's does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpoflow.errors import UserError

# A conversation used to check a template: two turns, a tool message, reasoning tags in an answer.
_PROBE_USER, _PROBE_ANSWER = "What is 2+2?", "<think>2 and 2</think>The answer is 4."
_PROBE_CONTENT = "Qx7"  # an assistant content whose rendering is easy to find


class TemplateError(UserError):
    """The chat template cannot render a conversation token-exactly; the message names the problem."""


@dataclass(frozen=True)
class TurnFormat:
    """How the template ends an assistant turn."""
    end_token_id: int   # the token after the assistant's content (the engine stops on it)
    end_text: str       # its text
    separator: str      # what the template writes after it, which the engine never emits


class ChatRenderer:
    """Renders conversations with `tokenizer`'s chat template (and `tools`, the function schemas the template's
    `tools=` takes) into exact token ids; `check_template` runs on construction."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("multi-turn rollouts need a chat template, and the tokenizer has none: use an "
                                "instruct/chat model, or set tokenizer.chat_template in the model folder's "
                                "tokenizer_config.json.")
        self.tokenizer, self.tools = tokenizer, tools or None
        self.turn = check_template(self)

    def render(self, messages: list[dict], *, add_generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as e:  # jinja's TemplateError, raise_exception(...) in the template, ...
            roles = [m.get("role") for m in messages]
            raise TemplateError(f"the chat template cannot render a conversation with roles {roles}: {e}") from None
        return text if isinstance(text, str) else str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The first prompt: the conversation's opening messages and the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def continuation_ids(self, history: list[dict], new: list[dict]) -> list[int]:
        """The ids that follow the end-of-turn token the model sampled: the separator, `new` (tool results,
        the environment's reply) and the next generation prompt. `history` ends with that assistant turn."""
        before = self.render(history, add_generation_prompt=False)
        after = self.render(history + new, add_generation_prompt=True)
        ending = self.turn.end_text + self.turn.separator
        if not before.endswith(ending):
            raise TemplateError(f"the chat template does not end the assistant turn with {ending!r} in this "
                                f"conversation (it ends {before[-40:]!r}); it renders turns inconsistently.")
        if not after.startswith(before):
            raise TemplateError(not_prefix_preserving(before, after))
        return self.encode(self.turn.separator + after[len(before):])

    def conversation_ids(self, messages: list[dict]) -> tuple[list[int], list[tuple[list[int], bool]]]:
        """A whole written conversation (a warm-start demonstration) as (prompt ids, [(ids, is the model's)]),
        by the rules of a rollout: each assistant turn is its encoded content and the end-of-turn token,
        everything else is rendered as a continuation."""
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None:
            raise UserError("a demonstration conversation needs at least one assistant message.")
        segments: list[tuple[list[int], bool]] = []
        history, i = list(messages[:first]), first
        while i < len(messages):
            assistant = messages[i]
            segments.append((self.encode(assistant["content"]) + [self.turn.end_token_id], True))
            history.append(assistant)
            j = next((k for k in range(i + 1, len(messages)) if messages[k]["role"] == "assistant"), len(messages))
            if j < len(messages):
                segments.append((self.continuation_ids(history, messages[i + 1:j]), False))
                history += messages[i + 1:j]
            i = j
        return self.prompt_ids(messages[:first]), segments

    def decode(self, ids: list[int]) -> str:
        """The model's text of sampled ids (special tokens, such as the end of turn, left out)."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def not_prefix_preserving(before: str, after: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    return (f"the chat template is not prefix-preserving: adding messages to a conversation changes how its "
            f"earlier part renders (at character {at}: {before[max(0, at - 30):at + 30]!r} becomes "
            f"{after[max(0, at - 30):at + 30]!r}), so the tokens the model sampled would not be the tokens it "
            "is trained on. Use a template that renders every turn the same whatever follows (e.g. one that "
            "keeps earlier turns' reasoning), or set the tokenizer's chat_template to such a template.")


def check_template(renderer: ChatRenderer) -> TurnFormat:
    """The template's `TurnFormat`, after checking on a sample conversation that it renders prefix-preservingly
    (the generation prompt is what precedes an assistant turn; every message only appends text)."""
    user = [{"role": "user", "content": _PROBE_USER}]
    base = renderer.render(user, add_generation_prompt=True)
    answered = renderer.render(user + [{"role": "assistant", "content": _PROBE_CONTENT}], add_generation_prompt=False)
    if not answered.startswith(base + _PROBE_CONTENT):
        raise TemplateError("the chat template's generation prompt is not what it renders before an assistant "
                            f"message: {base[-40:]!r} then {answered[len(base) - 40:][:80]!r}; the model would "
                            "be trained on a turn opening it never saw.")
    rest = answered[len(base) + len(_PROBE_CONTENT):]
    ids = renderer.encode(rest)
    if not rest or not ids:
        raise TemplateError("the chat template writes nothing after an assistant message, so no token ends a "
                            "turn; the engine could not tell where the model's turn stops.")
    end_id = ids[0]
    end_text = renderer.tokenizer.decode([end_id], skip_special_tokens=False)
    if end_id not in set(renderer.tokenizer.all_special_ids) or not rest.startswith(end_text):
        raise TemplateError(f"the chat template ends an assistant turn with {rest!r}, which does not start with "
                            "a special token; the engine stops a turn on one token (e.g. <|im_end|>).")
    turn = TurnFormat(end_token_id=end_id, end_text=end_text, separator=rest[len(end_text):])
    conversation = user + [{"role": "assistant", "content": _PROBE_ANSWER}]
    steps = [[{"role": "user", "content": "And 3+3?"}], [{"role": "assistant", "content": "6"}]]
    if renderer.tools:  # a tool result, then the model's answer
        steps += [[{"role": "tool", "name": "calculator", "content": "6"}], [{"role": "assistant", "content": "6."}]]
    for new in steps:
        before = renderer.render(conversation, add_generation_prompt=False)
        after = renderer.render(conversation + new, add_generation_prompt=new[0]["role"] != "assistant")
        if not after.startswith(before):
            raise TemplateError(not_prefix_preserving(before, after))
        conversation = conversation + new
    return turn
