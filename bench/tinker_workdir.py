"""A working folder where tinker-cookbook recipes run offline against `grpoflow serve tinker` (docs/tinker.md).

The recipes name hub resources; this writes their local equivalents, nothing else:

- `openai/gsm8k/` : a local dataset folder that `datasets.load_dataset("openai/gsm8k", "main")` reads instead of
  the hub (same columns, `question` and `answer` ending in `#### <number>`), holding a task a small model can
  learn on a CPU: adding two one-digit numbers;
- `<org>/<model>/` : a link to a local model folder under the hub name the recipe's `model_name` gives, so the
  cookbook's `get_tokenizer(model_name)` (which loads a local folder of that name first) and its renderer table
  (`model_info`, which knows hub names only) both work.

- `HuggingFaceH4/no_robots/` : a local chat dataset (`messages`) for sl_loop.py: the same additions, answered
  as `\\boxed{<sum>}`;
- `Anthropic/hh-rlhf/` : a local preference dataset (`chosen`, `rejected`: "\\n\\nHuman: ...\\n\\nAssistant: ..."
  texts) for the DPO recipe (`dataset=hhh`): the same additions, the right sum chosen over a wrong one;
- `zwhe99/DeepMath-103K/` : a local prompt dataset (`question`, `final_answer`) for on-policy distillation
  (`dataset=deepmath`): the same additions, train split only, as on the hub;
- `Salesforce/wikitext/` : a local text dataset (config `wikitext-103-raw-v1`, column `text`) for
  rl_numerics_check: seeded sentences of plain English words, among them every word the recipe counts, so each
  page has some of them (the recipe only needs text whose word counts it can check);
- `prompts.jsonl` : the same training questions as rl_loop.py renders them (its few-shot conversation, the
  recipe's renderer), one `{"prompt", "answer"}` row each, so `grpoflow train` can run the same task.

    python bench/tinker_workdir.py DIR --model /tmp/grpoflow-smollm2/hf --name meta-llama/Llama-3.2-1B
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

CARD = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-00000-of-00001.parquet
  - split: test
    path: main/test-00000-of-00001.parquet
---
One-digit additions in GSM8K's format (question, answer ending in `#### <number>`), written by
grpoflow's bench/tinker_workdir.py for running tinker-cookbook recipes offline.
"""


def addition_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
    return rows


def write_dataset(root: Path, train: int = 4096, test: int = 256) -> Path:
    folder = root / "openai" / "gsm8k"
    (folder / "main").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(CARD)
    for split, n, seed in (("train", train, 0), ("test", test, 1)):
        table = pa.Table.from_pylist(addition_rows(n, seed))
        pq.write_table(table, folder / "main" / f"{split}-00000-of-00001.parquet")
    return folder


CHAT_CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-00000-of-00001.parquet
  - split: test
    path: data/test-00000-of-00001.parquet
---
One-digit additions as chat messages answered in \\boxed{}, written by grpoflow's bench/tinker_workdir.py.
"""


def write_chat_dataset(root: Path, train: int = 4096, test: int = 256) -> Path:
    folder = root / "HuggingFaceH4" / "no_robots"
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(CHAT_CARD)
    for split, n, seed in (("train", train, 0), ("test", test, 1)):
        rows = [{"messages": [{"role": "user", "content": r["question"]},
                              {"role": "assistant", "content": "\\boxed{" + r["answer"].rsplit("#### ", 1)[1] + "}"}]}
                for r in addition_rows(n, seed)]
        pq.write_table(pa.Table.from_pylist(rows), folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


def write_hub_folder(root: Path, name: str, splits: dict[str, list[dict]], note: str) -> Path:
    """A local dataset folder that `datasets.load_dataset(name)` reads instead of the hub: a parquet file a split."""
    folder = root / name
    (folder / "data").mkdir(parents=True, exist_ok=True)
    files = "".join(f"  - split: {split}\n    path: data/{split}-00000-of-00001.parquet\n" for split in splits)
    (folder / "README.md").write_text(f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}---\n{note}\n")
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


def preference_rows(n: int, seed: int) -> list[dict]:
    """hh-rlhf's shape: two whole conversations that differ in their last assistant turn only."""
    rows = []
    for r in addition_rows(n, seed):
        question, total = r["question"], int(r["answer"].rsplit("#### ", 1)[1])
        wrong = total + 1 if total < 18 else 0
        rows.append({side: f"\n\nHuman: {question}\n\nAssistant: {answer}"
                     for side, answer in (("chosen", total), ("rejected", wrong))})
    return rows


def write_preference_dataset(root: Path, train: int = 1024, test: int = 64) -> Path:
    return write_hub_folder(root, "Anthropic/hh-rlhf", {"train": preference_rows(train, 0),
                                                        "test": preference_rows(test, 1)},
                            "One-digit additions as hh-rlhf preference pairs (the right sum chosen), written by "
                            "grpoflow's bench/tinker_workdir.py.")


def write_prompt_dataset(root: Path, train: int = 1024) -> Path:
    rows = [{"question": r["question"], "final_answer": r["answer"].rsplit("#### ", 1)[1]}
            for r in addition_rows(train, 0)]
    return write_hub_folder(root, "zwhe99/DeepMath-103K", {"train": rows},
                            "One-digit additions in DeepMath-103K's columns, written by grpoflow's "
                            "bench/tinker_workdir.py.")


# the recipe's words to count (tinker_cookbook/recipes/rl_numerics_check/env.py DEFAULT_WORDS) and filler words
COUNTED = ("after against although before being between both could during however including into known later many "
           "most only over several such their then through time under until when while").split()
FILLER = ("the a river town church road king army city school year people war team family village station music "
          "game ship book film law name water north south east west small large old new first second great long "
          "was were is had has built played moved opened wrote found became remained returned began").split()


def corpus_lines(chars: int, seed: int) -> list[str]:
    """Sentences of 6-14 words (a counted word about one word in six) until `chars` characters, one line each
    five sentences."""
    rng = random.Random(seed)
    lines, total = [], 0
    while total < chars:
        sentences = []
        for _ in range(5):
            words = [rng.choice(COUNTED) if rng.random() < 0.17 else rng.choice(FILLER)
                     for _ in range(rng.randint(6, 14))]
            sentences.append(" ".join(words).capitalize() + ".")
        lines.append(" ".join(sentences))
        total += len(lines[-1]) + 1
    return lines


def write_text_corpus(root: Path, chars: int = 200_000, seed: int = 0) -> Path:
    """What `datasets.load_dataset("Salesforce/wikitext", "wikitext-103-raw-v1", split="train")` reads here."""
    folder, config = root / "Salesforce/wikitext", "wikitext-103-raw-v1"
    (folder / config).mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(
        f"---\nconfigs:\n- config_name: {config}\n  data_files:\n  - split: train\n"
        f"    path: {config}/train-00000-of-00001.parquet\n---\nSeeded sentences of plain English words for "
        "tinker-cookbook's rl_numerics_check, written by grpoflow's bench/tinker_workdir.py.\n")
    pq.write_table(pa.Table.from_pylist([{"text": line} for line in corpus_lines(chars, seed)]),
                   folder / config / "train-00000-of-00001.parquet")
    return folder


def link_model(root: Path, model: str, name: str) -> Path:
    link = root / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(Path(model).resolve(), link)
    return link


def write_prompts(root: Path, name: str, n: int) -> Path:
    """rl_loop.py's prompts for the first `n` training rows, as text (the cookbook's own renderer and prefix)."""
    import inspect
    import json

    from tinker_cookbook import model_info, renderers
    from tinker_cookbook.recipes import rl_loop
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    cwd = os.getcwd()
    os.chdir(root)  # the model name is a folder here
    try:
        tokenizer = get_tokenizer(name)
        renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(name), tokenizer)
    finally:
        os.chdir(cwd)
    source = inspect.getsource(rl_loop.main)  # the recipe's own few-shot turn and suffix, not a copy of them
    scope: dict = {}
    start = source.index("    question_suffix = ")
    exec("\n".join(line[4:] for line in source[start:source.index("n_train_batches")].splitlines()), scope)
    out = root / "prompts.jsonl"
    with open(out, "w") as f:
        for row in addition_rows(n, 0):
            convo = [*scope["convo_prefix"], {"role": "user", "content": row["question"] + scope["question_suffix"]}]
            ids = renderer.build_generation_prompt(convo).to_ints()
            text = tokenizer.decode(ids[1:] if ids and ids[0] == tokenizer.bos_token_id else ids)
            f.write(json.dumps({"prompt": text, "answer": row["answer"].rsplit("#### ", 1)[1]}) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--model", required=True, help="local HF model folder (with its tokenizer)")
    parser.add_argument("--name", default="meta-llama/Llama-3.2-1B", help="the hub name the recipe is given")
    parser.add_argument("--prompts", type=int, default=0, help="also write prompts.jsonl with this many rows")
    ns = parser.parse_args()
    root = Path(ns.dir)
    print(write_dataset(root), write_chat_dataset(root), write_preference_dataset(root), write_prompt_dataset(root),
          write_text_corpus(root), link_model(root, ns.model, ns.name))
    if ns.prompts:
        print(write_prompts(root, ns.name, ns.prompts))


if __name__ == "__main__":
    main()
