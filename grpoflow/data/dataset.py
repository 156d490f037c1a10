"""Read prompt datasets (jsonl / json / parquet) and turn rows into tokenized prompts.

Two row conventions are accepted, so datasets prepared for TRL or verl work unchanged:

* TRL: ``{"prompt": "37+48=", "answer": "85"}`` (a string) or ``{"prompt": [{"role": ...,
  "content": ...}, ...]}`` (chat messages); every other column goes to the reward function.
* verl: ``{"data_source": "gsm8k", "prompt": [messages], "reward_model": {"ground_truth":
  ..., "style": "rule"}, "extra_info": {...}}``.

The whole original row is kept on each ``PromptItem`` and later passed to reward functions
as keyword arguments, so the reward side decides which columns matter.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".parquet")


@dataclass
class PromptItem:
    """One prompt ready for generation."""

    prompt_ids: list[int]
    """Token ids of ``prompt_text``, with no special tokens added by the tokenizer."""
    prompt_text: str
    """The text actually tokenized (after the chat template, if one was applied)."""
    row: dict
    """The original dataset row, all columns; reward functions receive it as keyword arguments."""
    data_source: str
    """``row["data_source"]`` if present, else the default; selects the reward function."""


@dataclass
class DataStats:
    """What ``prepare_prompts`` kept and dropped (dropped rows are counted, never silent)."""

    total: int = 0
    kept: int = 0
    missing_prompt: int = 0
    overlong: int = 0


# ---------------------------------------------------------------------------------------------
# Reading files


def _read_jsonl(path: str) -> list:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}: line {line_no} is not valid JSON ({e.msg} at column {e.colno}); "
                    f"fix or remove that line."
                ) from e
    return rows


def _read_json(path: str) -> list:
    """A ``.json`` file holds a list of objects; JSON-lines content is also accepted."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _read_jsonl(path)  # many ".json" dataset files are really JSON lines
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: expected a JSON list of row objects at the top level, got "
            f"{type(data).__name__}; write the rows as a list or as JSON lines (.jsonl)."
        )
    return data


def _read_parquet(path: str) -> list:
    import pyarrow.parquet as pq

    # to_pylist turns struct columns into dicts and list columns into lists.
    return pq.read_table(path).to_pylist()


_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}


def load_rows(files: str | os.PathLike | list) -> list[dict]:
    """Read and concatenate the rows of one or more ``.jsonl``, ``.json`` or ``.parquet`` files."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    rows: list[dict] = []
    for path in map(os.fspath, files):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"data file {path!r} does not exist; check the paths in `data.train_files` "
                f"(and `data.val_files`)."
            )
        ext = os.path.splitext(path)[1].lower()
        if ext not in _READERS:
            raise ValueError(
                f"data file {path!r} has unsupported extension {ext!r}; supported: "
                f"{', '.join(SUPPORTED_EXTENSIONS)}."
            )
        for i, row in enumerate(_READERS[ext](path)):
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}: row {i} is a {type(row).__name__}, not an object with named "
                    f"columns; each row must be a JSON object such as {{\"prompt\": ...}}."
                )
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Rows -> prompts


def _is_messages(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def _prompt_text(i, prompt, tokenizer, apply_chat_template, system_prompt, prompt_key) -> str:
    """Return the text to tokenize for row ``i``'s prompt (a string or a list of messages)."""
    if isinstance(prompt, str):
        if apply_chat_template is not True:
            if system_prompt is not None:
                raise ValueError(
                    f"row {i}: `{prompt_key}` is a plain string, which is not chat-templated, so "
                    f"system_prompt would be ignored; set data.apply_chat_template=true or drop "
                    f"data.system_prompt."
                )
            return prompt
        messages = [{"role": "user", "content": prompt}]
    elif _is_messages(prompt):
        if apply_chat_template is False:
            raise ValueError(
                f"row {i}: `{prompt_key}` is a list of chat messages, which needs the chat template; "
                f"set data.apply_chat_template=true (or leave it unset)."
            )
        messages = list(prompt)
    else:
        raise ValueError(
            f"row {i}: `{prompt_key}` must be a string or a list of {{\"role\", \"content\"}} "
            f"messages, got {type(prompt).__name__}: {str(prompt)[:80]!r}."
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"row {i} needs a chat template but the tokenizer has none; use a tokenizer that has "
            f"one (an instruct/chat model's), or give plain-string prompts with "
            f"data.apply_chat_template=false."
        )
    if system_prompt is not None and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}] + messages
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template error says nothing about which row caused it
        raise ValueError(
            f"row {i}: the chat template failed on its messages ({type(e).__name__}: {e}); "
            f"check that each message has 'role' and 'content'."
        ) from e


def prepare_prompts(
    rows: list[dict],
    tokenizer,
    *,
    prompt_key: str = "prompt",
    max_prompt_length: int = 512,
    apply_chat_template: bool | None = None,
    system_prompt: str | None = None,
    overlong: str = "drop",
    default_data_source: str = "default",
) -> tuple[list[PromptItem], DataStats]:
    """Tokenize the prompt of each row; drop (and count) rows that cannot be used.

    ``apply_chat_template=None`` means: template chat-message prompts, tokenize string prompts
    as they are; ``True`` also wraps string prompts as one user message. ``system_prompt`` is
    prepended as a system message to templated prompts that do not already start with one.
    The text is tokenized with ``add_special_tokens=False``: a chat template writes its own
    BOS, and raw prompts such as ``"37+48="`` must be tokenized exactly as written.

    Rows without ``prompt_key`` (or with an empty prompt) are dropped and counted in
    ``missing_prompt``. Prompts over ``max_prompt_length`` tokens are dropped and counted in
    ``overlong`` (``overlong="drop"``) or raise ``ValueError`` (``overlong="error"``).
    """
    if overlong not in ("drop", "error"):
        raise ValueError(f"overlong must be 'drop' or 'error', got {overlong!r}")
    stats = DataStats(total=len(rows))
    kept_rows, texts = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"row {i} is a {type(row).__name__}, not a dict of columns.")
        prompt = row.get(prompt_key)
        if prompt is None or (isinstance(prompt, (str, list)) and len(prompt) == 0):
            stats.missing_prompt += 1
            continue
        kept_rows.append((i, row))
        texts.append(
            _prompt_text(i, prompt, tokenizer, apply_chat_template, system_prompt, prompt_key)
        )

    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    items: list[PromptItem] = []
    for (i, row), text, ids in zip(kept_rows, texts, all_ids):
        if len(ids) > max_prompt_length:
            if overlong == "error":
                raise ValueError(
                    f"row {i}: prompt is {len(ids)} tokens, over data.max_prompt_length="
                    f"{max_prompt_length}; raise data.max_prompt_length or shorten that prompt."
                )
            stats.overlong += 1
            continue
        source = row.get("data_source")
        items.append(
            PromptItem(
                prompt_ids=list(ids),
                prompt_text=text,
                row=row,
                data_source=str(source) if source is not None else default_data_source,
            )
        )
    stats.kept = len(items)

    if stats.missing_prompt or stats.overlong:
        logger.warning(
            "prepare_prompts kept %d of %d rows: %d without `%s`, %d over %d tokens",
            stats.kept, stats.total, stats.missing_prompt, prompt_key, stats.overlong,
            max_prompt_length,
        )
    if not items:
        raise ValueError(
            f"no usable prompts in {stats.total} rows ({stats.missing_prompt} without "
            f"`{prompt_key}`, {stats.overlong} over {max_prompt_length} tokens); check "
            f"data.prompt_key and data.max_prompt_length."
        )
    return items, stats
