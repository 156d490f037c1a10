"""Read prompt datasets (jsonl / json / parquet / Hugging Face folders) and turn rows into tokenized prompts.

Two row conventions are accepted, so datasets prepared for TRL or verl work unchanged:

* TRL: ``{"prompt": "37+48=", "answer": "85"}`` (a string) or ``{"prompt": [{"role": ...,
  "content": ...}, ...]}`` (chat messages); every other column goes to the reward function.
* verl: ``{"data_source": "gsm8k", "prompt": [messages], "reward_model": {"ground_truth":
  ..., "style": "rule"}, "extra_info": {...}}``.

The whole original row is kept on each ``PromptItem`` and later passed to reward functions
as keyword arguments, so the reward side decides which columns matter.

``load_rows`` also reads local Hugging Face ``datasets`` folders with pyarrow alone (the
``datasets`` package is not needed): a ``Dataset.save_to_disk`` folder (``state.json`` and
``data-XXXXX-of-XXXXX.arrow`` files in Arrow IPC stream format), one split of a saved
``DatasetDict`` (``folder/train``), and a folder of ``.parquet`` files such as a hub snapshot.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from grpoflow.errors import UserError, UserFileNotFoundError

logger = logging.getLogger(__name__)

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".parquet", ".arrow")


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
    index: int = 0
    """Position among the prepared prompts; with the step's seed it seeds this prompt's samples, so
    rollouts do not depend on how prompts are spread over rollout workers."""


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
                raise UserError(
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
        raise UserError(
            f"{path}: expected a JSON list of row objects at the top level, got "
            f"{type(data).__name__}; write the rows as a list or as JSON lines (.jsonl)."
        )
    return data


def _read_parquet(path: str) -> list:
    import pyarrow.parquet as pq

    # to_pylist turns struct columns into dicts and list columns into lists.
    return pq.read_table(path).to_pylist()


def _read_arrow(path: str) -> list:
    """One Arrow IPC file: the stream format ``datasets`` writes, or the random-access file format."""
    import pyarrow as pa

    with pa.memory_map(path) as source:  # rows are copied out before the map closes
        try:
            return pa.ipc.open_stream(source).read_all().to_pylist()
        except pa.ArrowInvalid:
            source.seek(0)
        try:
            return pa.ipc.open_file(source).read_all().to_pylist()
        except pa.ArrowInvalid as e:
            raise UserError(
                f"{path}: not an Arrow IPC stream or file ({e}); give the .arrow files that "
                f"`datasets` wrote, or convert the data to .parquet or .jsonl."
            ) from e


_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".arrow": _read_arrow}

# Hub and verl file names start with their split: train-00000-of-00001.parquet, test.parquet.
_SPLIT_NAME = re.compile(r"^(train|test|validation|valid|val|dev|eval)(?=[-_.])", re.IGNORECASE)


def _dataset_dict_splits(folder: str) -> list[str]:
    """The splits of a ``DatasetDict.save_to_disk`` folder (its dataset_dict.json, else its subfolders)."""
    try:
        with open(os.path.join(folder, "dataset_dict.json"), encoding="utf-8") as f:
            splits = json.load(f).get("splits")
    except (OSError, ValueError, AttributeError):
        splits = None
    if not splits:
        splits = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    return [str(s) for s in splits]


def _save_to_disk_files(folder: str) -> list[str]:
    """The .arrow files of a ``Dataset.save_to_disk`` folder, in the order its state.json lists
    them (sorted ``data-*.arrow`` without one); [] if the folder holds none."""
    state_path = os.path.join(folder, "state.json")
    state: dict = {}
    if os.path.isfile(state_path):
        with open(state_path, encoding="utf-8") as f:
            try:
                state = json.load(f)
            except json.JSONDecodeError as e:
                raise UserError(f"{state_path} is not valid JSON ({e.msg}); re-save the dataset.") from e
    if state.get("_indices_data_files"):
        raise UserError(
            f"{folder}: the saved dataset has an indices mapping (written by an old `datasets` "
            f"version); re-save it with `ds.flatten_indices().save_to_disk(...)`."
        )
    listed = [entry["filename"] for entry in state.get("_data_files") or []]
    if not listed:
        return sorted(glob.glob(os.path.join(folder, "data-*.arrow")))
    files = [os.path.join(folder, name) for name in listed]
    for path in files:
        if not os.path.isfile(path):
            raise UserFileNotFoundError(f"{state_path} lists {os.path.basename(path)!r}, which is missing.")
    return files


def _parquet_files(folder: str) -> list[str]:
    """All .parquet files under ``folder`` (sorted), refusing a mix of splits or configs."""
    files = sorted(glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True))
    groups: dict[str, str] = {}
    for path in files:
        split = _SPLIT_NAME.match(os.path.basename(path))
        if split:
            rel_dir = os.path.relpath(os.path.dirname(path), folder)
            key = split.group(1) if rel_dir == "." else f"{rel_dir}/{split.group(1)}"
            groups.setdefault(key, path)
    if len(groups) > 1:  # e.g. train and test files of one hub snapshot: never mix them silently
        raise UserError(
            f"{folder} holds parquet files of {len(groups)} splits ({', '.join(sorted(groups))}); "
            f"give one split's folder or files, e.g. {next(iter(groups.values()))!r}."
        )
    return files


def _read_folder(folder: str) -> list:
    """A saved ``Dataset`` (state.json + .arrow), or a folder of parquet files such as a hub snapshot."""
    if os.path.isfile(os.path.join(folder, "dataset_dict.json")):
        splits = _dataset_dict_splits(folder)
        example = os.path.join(folder, splits[0] if splits else "train")
        raise UserError(
            f"{folder} is a saved DatasetDict with splits {splits}; name the split as a path, "
            f"e.g. {example!r}."
        )
    arrow_files = _save_to_disk_files(folder)
    if arrow_files:
        return [row for path in arrow_files for row in _read_arrow(path)]
    parquet_files = _parquet_files(folder)
    if parquet_files:
        return [row for path in parquet_files for row in _read_parquet(path)]
    raise UserError(
        f"folder {folder!r} holds no dataset: no state.json or data-*.arrow (Dataset.save_to_disk), "
        f"no dataset_dict.json and no .parquet files; give data files or such a folder."
    )


def _missing_path_error(path: str) -> Exception:
    parent = os.path.dirname(os.path.normpath(path))
    if parent and os.path.isfile(os.path.join(parent, "dataset_dict.json")):
        return UserFileNotFoundError(
            f"{parent} is a saved DatasetDict without a split {os.path.basename(path)!r}; its "
            f"splits are {_dataset_dict_splits(parent)}."
        )
    return UserFileNotFoundError(
        f"data file {path!r} does not exist; check the paths in `data.train_files` "
        f"(and `data.val_files`)."
    )


def _read_path(path: str) -> list:
    if os.path.isdir(path):
        return _read_folder(path)
    if not os.path.isfile(path):
        raise _missing_path_error(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in _READERS:
        raise UserError(
            f"data file {path!r} has unsupported extension {ext!r}; supported: "
            f"{', '.join(SUPPORTED_EXTENSIONS)}, or a Hugging Face dataset folder."
        )
    return _READERS[ext](path)


def load_rows(files: str | os.PathLike | list) -> list[dict]:
    """Read and concatenate the rows of one or more data files or dataset folders.

    Each entry is a ``.jsonl``, ``.json``, ``.parquet`` or ``.arrow`` file, a
    ``Dataset.save_to_disk`` folder (its .arrow files in the order state.json lists them), one
    split of a saved ``DatasetDict`` named as ``folder/<split>``, or a folder of ``.parquet``
    files (all of them, recursively, sorted by path; a folder that mixes splits is refused).
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    rows: list[dict] = []
    for path in map(os.fspath, files):
        try:
            read = _read_path(path)
        except UnicodeDecodeError as e:
            raise UserError(f"data file {path!r} is not UTF-8 text ({e.reason} at byte {e.start}); convert it to "
                            f"UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None
        for i, row in enumerate(read):
            if not isinstance(row, dict):
                raise UserError(
                    f"{path}: row {i} is a {type(row).__name__}, not an object with named "
                    f"columns; each row must be a JSON object such as {{\"prompt\": ...}}."
                )
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Rows -> prompts


def _is_messages(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def render_prompt(prompt: Any, tokenizer: Any, system_prompt: str | None = None) -> str:
    """The text a run tokenizes for a prompt: a string as it is, chat messages through the chat template (as
    `prepare_prompts` renders them with data.apply_chat_template unset)."""
    return _prompt_text(0, prompt, tokenizer, None, system_prompt if not isinstance(prompt, str) else None, "prompt")


def _prompt_text(i, prompt, tokenizer, apply_chat_template, system_prompt, prompt_key, tools=None) -> str:
    """Return the text to tokenize for row ``i``'s prompt (a string or a list of messages)."""
    if isinstance(prompt, str):
        if apply_chat_template is not True:
            if system_prompt is not None:
                raise UserError(
                    f"row {i}: `{prompt_key}` is a plain string, which is not chat-templated, so "
                    f"system_prompt would be ignored; set data.apply_chat_template=true or drop "
                    f"data.system_prompt."
                )
            return prompt
        messages = [{"role": "user", "content": prompt}]
    elif _is_messages(prompt):
        if apply_chat_template is False:
            raise UserError(
                f"row {i}: `{prompt_key}` is a list of chat messages, which needs the chat template; "
                f"set data.apply_chat_template=true (or leave it unset)."
            )
        messages = list(prompt)
    else:
        raise UserError(
            f"row {i}: `{prompt_key}` must be a string or a list of {{\"role\", \"content\"}} "
            f"messages, got {type(prompt).__name__}: {str(prompt)[:80]!r}."
        )
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"row {i} needs a chat template but the tokenizer has none; use a tokenizer that has "
            f"one (an instruct/chat model's), or give plain-string prompts with "
            f"data.apply_chat_template=false."
        )
    if system_prompt is not None and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}] + messages
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **({"tools": tools} if tools else {}))
    except Exception as e:  # a template error says nothing about which row caused it
        raise UserError(
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
    tools: list[dict] | None = None,
) -> tuple[list[PromptItem], DataStats]:
    """Tokenize the prompt of each row; drop (and count) rows that cannot be used.

    ``apply_chat_template=None`` means: template chat-message prompts, tokenize string prompts
    as they are; ``True`` also wraps string prompts as one user message. ``system_prompt`` is
    prepended as a system message to templated prompts that do not already start with one.
    ``tools`` (multi-turn runs with tools: their chat-template schemas) are rendered into templated
    prompts as the rollout renders them, so the length check counts them.
    The text is tokenized with ``add_special_tokens=False``: a chat template writes its own
    BOS, and raw prompts such as ``"37+48="`` must be tokenized exactly as written.

    Rows without ``prompt_key`` (or with an empty prompt) are dropped and counted in
    ``missing_prompt``. Prompts over ``max_prompt_length`` tokens are dropped and counted in
    ``overlong`` (``overlong="drop"``) or raise ``ValueError`` (``overlong="error"``).
    """
    if overlong not in ("drop", "error"):
        raise UserError(f"overlong must be 'drop' or 'error', got {overlong!r}")
    stats = DataStats(total=len(rows))
    kept_rows, texts = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise UserError(f"row {i} is a {type(row).__name__}, not a dict of columns.")
        prompt = row.get(prompt_key)
        if prompt is None or (isinstance(prompt, (str, list)) and len(prompt) == 0):
            stats.missing_prompt += 1
            continue
        kept_rows.append((i, row))
        texts.append(
            _prompt_text(i, prompt, tokenizer, apply_chat_template, system_prompt, prompt_key, tools)
        )

    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    items: list[PromptItem] = []
    for (i, row), text, ids in zip(kept_rows, texts, all_ids):
        if len(ids) > max_prompt_length:
            if overlong == "error":
                raise UserError(
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
                index=len(items),
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
        raise UserError(
            f"no usable prompts in {stats.total} rows ({stats.missing_prompt} without "
            f"`{prompt_key}`, {stats.overlong} over {max_prompt_length} tokens); check "
            f"data.prompt_key and data.max_prompt_length."
        )
    return items, stats
