"""load_rows and prepare_prompts: TRL and verl row conventions, drop counting, clear errors."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpoflow.data.dataset import DataStats, load_rows, prepare_prompts
from grpoflow.models.tiny import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trl_jsonl_string_prompts(tmp_path, tok):
    path = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"prompt": "37+48=", "answer": "85", "data_source": "addition"},
            {"prompt": "1+2=", "answer": "3"},
        ],
    )
    rows = load_rows(str(path))
    items, stats = prepare_prompts(rows, tok, default_data_source="dflt")
    assert stats == DataStats(total=2, kept=2, missing_prompt=0, overlong=0)
    assert items[0].prompt_text == "37+48="
    assert items[0].prompt_ids == tok.convert_tokens_to_ids(list("37+48="))  # no BOS
    assert items[0].row == rows[0] and items[0].row["answer"] == "85"
    assert [it.data_source for it in items] == ["addition", "dflt"]


def test_string_prompt_with_chat_template_and_system_prompt(tok):
    items, _ = prepare_prompts(
        [{"prompt": "1+2="}], tok, apply_chat_template=True, system_prompt="Add."
    )
    assert items[0].prompt_text == (
        "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert len(items[0].prompt_ids) == len(tok(items[0].prompt_text)["input_ids"])
    assert items[0].prompt_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_system_prompt_on_untemplated_string_is_an_error(tok):
    with pytest.raises(ValueError, match="apply_chat_template=true"):
        prepare_prompts([{"prompt": "1+2="}], tok, system_prompt="Add.")


def test_verl_parquet_with_nested_columns(tmp_path, tok):
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    table = pa.table(
        {
            "data_source": ["gsm8k", "gsm8k"],
            "prompt": pa.array(
                [
                    [{"role": "user", "content": "What is 2+2?"}],
                    [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "3+3?"},
                    ],
                ],
                type=pa.list_(message),
            ),
            "reward_model": pa.array(
                [{"ground_truth": "4", "style": "rule"}, {"ground_truth": "6", "style": "rule"}],
                type=pa.struct([("ground_truth", pa.string()), ("style", pa.string())]),
            ),
            "extra_info": [{"index": 0, "split": "train"}, {"index": 1, "split": "train"}],
        }
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    rows = load_rows([path])
    assert rows[1]["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert rows[0]["reward_model"]["ground_truth"] == "4"
    assert rows[1]["extra_info"] == {"index": 1, "split": "train"}

    items, stats = prepare_prompts(rows, tok, system_prompt="Default system.")
    assert stats.kept == 2
    assert items[0].data_source == "gsm8k"
    assert items[0].prompt_text.startswith("<|im_start|>system\nDefault system.<|im_end|>\n")
    assert items[0].prompt_text.endswith("What is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    # A row that brings its own system message keeps it and gets no second one.
    assert items[1].prompt_text.count("system") == 1 and "Be brief." in items[1].prompt_text
    assert items[1].row["reward_model"]["ground_truth"] == "6"


def test_json_list_file(tmp_path, tok):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}]))
    assert [r["prompt"] for r in load_rows(path)] == ["a", "b"]


def test_missing_prompt_is_counted(tok):
    rows = [{"prompt": "1+1="}, {"question": "x"}, {"prompt": ""}, {"prompt": []}, {"prompt": None}]
    items, stats = prepare_prompts(rows, tok)
    assert stats == DataStats(total=5, kept=1, missing_prompt=4, overlong=0)
    assert items[0].row is rows[0]


def test_custom_prompt_key(tok):
    items, stats = prepare_prompts([{"question": "5+5="}], tok, prompt_key="question")
    assert stats.kept == 1 and items[0].prompt_text == "5+5="


def test_overlong_drop_vs_error(tok):
    rows = [{"prompt": "1+1="}, {"prompt": "12345+67890="}, {"prompt": "9+9="}]
    items, stats = prepare_prompts(rows, tok, max_prompt_length=4)
    assert [it.prompt_text for it in items] == ["1+1=", "9+9="]
    assert stats.overlong == 1 and stats.kept == 2
    with pytest.raises(ValueError, match=r"row 1: prompt is 12 tokens.*data\.max_prompt_length=4"):
        prepare_prompts(rows, tok, max_prompt_length=4, overlong="error")


def test_nothing_kept_says_why(tok):
    with pytest.raises(ValueError, match="1 without `prompt`, 1 over 2 tokens"):
        prepare_prompts([{"q": "1"}, {"prompt": "1+1="}], tok, max_prompt_length=2)


def test_messages_need_a_chat_template(tok):
    no_template = build_char_tokenizer()
    no_template.chat_template = None
    rows = [{"prompt": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(ValueError, match="tokenizer has none"):
        prepare_prompts(rows, no_template)
    with pytest.raises(ValueError, match="needs the chat template"):
        prepare_prompts(rows, tok, apply_chat_template=False)


def test_bad_prompt_type(tok):
    with pytest.raises(ValueError, match="row 0: `prompt` must be a string"):
        prepare_prompts([{"prompt": 42}], tok)


def test_missing_file_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl.*data\.train_files"):
        load_rows(str(tmp_path / "nope.jsonl"))


def test_unsupported_extension(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("prompt\n1+1=\n")
    with pytest.raises(ValueError, match=r"'\.csv'.*\.jsonl, \.json, \.parquet"):
        load_rows(path)


def test_malformed_line_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "1+1="}\n\n{"prompt": "2+2=",\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 3 is not valid JSON"):
        load_rows(path)


def test_non_object_row_error(tmp_path):
    path = _write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "a"}, ["not", "an", "object"]])
    with pytest.raises(ValueError, match=r"rows\.jsonl: row 1 is a list"):
        load_rows(path)


# ---------------------------------------------------------------------------------------------
# Local Hugging Face dataset folders, read with pyarrow alone


def _write_arrow_stream(path, rows):
    """An .arrow file as `datasets` writes it: Arrow IPC *stream* format, features in the metadata."""
    table = pa.Table.from_pylist(rows)
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": {}}})})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def _save_to_disk(folder, shards, state_order=None):
    """Mimic Dataset.save_to_disk: data-XXXXX-of-XXXXX.arrow shards, dataset_info.json, state.json."""
    folder.mkdir(parents=True)
    names = [f"data-{i:05d}-of-{len(shards):05d}.arrow" for i in range(len(shards))]
    for name, rows in zip(names, shards):
        _write_arrow_stream(folder / name, rows)
    (folder / "dataset_info.json").write_text(json.dumps({"citation": "", "features": {}}))
    order = names if state_order is None else [names[i] for i in state_order]
    (folder / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in order], "_fingerprint": "abc",
        "_format_type": None, "_split": "train"}))
    return folder


def test_save_to_disk_folder_in_state_json_order(tmp_path, tok):
    messages = [{"role": "user", "content": "2+2?"}]
    folder = _save_to_disk(tmp_path / "ds", [
        [{"prompt": messages, "reward_model": {"ground_truth": "4", "style": "rule"}, "k": 0}],
        [{"prompt": messages, "reward_model": {"ground_truth": "5", "style": "rule"}, "k": 1},
         {"prompt": messages, "reward_model": {"ground_truth": "6", "style": "rule"}, "k": 2}],
    ], state_order=[1, 0])  # state.json, not the file names, decides the order
    rows = load_rows(folder)
    assert [r["k"] for r in rows] == [1, 2, 0]
    assert rows[0]["prompt"] == messages and rows[0]["reward_model"]["ground_truth"] == "5"
    items, stats = prepare_prompts(rows, tok)
    assert stats.kept == 3 and items[0].prompt_text.endswith("2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_save_to_disk_folder_without_state_json_reads_sorted_shards(tmp_path):
    folder = _save_to_disk(tmp_path / "ds", [[{"prompt": "a"}], [{"prompt": "b"}]], state_order=[1, 0])
    (folder / "state.json").unlink()
    assert [r["prompt"] for r in load_rows(str(folder))] == ["a", "b"]
    assert [r["prompt"] for r in load_rows(folder / "data-00001-of-00002.arrow")] == ["b"]  # one .arrow file


def test_state_json_naming_a_missing_shard(tmp_path):
    folder = _save_to_disk(tmp_path / "ds", [[{"prompt": "a"}], [{"prompt": "b"}]])
    (folder / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(FileNotFoundError, match=r"state\.json lists 'data-00001-of-00002\.arrow'"):
        load_rows(folder)


def test_dataset_dict_needs_a_split(tmp_path):
    root = tmp_path / "gsm8k"
    _save_to_disk(root / "train", [[{"prompt": "train row"}]])
    _save_to_disk(root / "test", [[{"prompt": "test row"}]])
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(ValueError, match=r"saved DatasetDict with splits \['train', 'test'\]; name the split.*"
                                         r"gsm8k/train"):
        load_rows(root)
    assert load_rows(f"{root}/test") == [{"prompt": "test row"}]
    with pytest.raises(FileNotFoundError, match=r"without a split 'validation'.*\['train', 'test'\]"):
        load_rows(root / "validation")


def test_parquet_folder_like_a_hub_snapshot(tmp_path):
    data = tmp_path / "snapshot" / "data"
    data.mkdir(parents=True)
    (tmp_path / "snapshot" / "README.md").write_text("# card\n")
    for i in (1, 0):  # written out of order: read sorted by path
        pq.write_table(pa.Table.from_pylist([{"prompt": f"p{i}", "extra_info": {"index": i}}]),
                       data / f"train-0000{i}-of-00002.parquet")
    rows = load_rows(tmp_path / "snapshot")
    assert rows == [{"prompt": "p0", "extra_info": {"index": 0}}, {"prompt": "p1", "extra_info": {"index": 1}}]


def test_parquet_folder_with_two_splits_is_refused(tmp_path):
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist([{"prompt": split}]), tmp_path / f"{split}.parquet")
    with pytest.raises(ValueError, match=r"parquet files of 2 splits \(test, train\); give one split's"):
        load_rows(tmp_path)
    assert load_rows(tmp_path / "test.parquet") == [{"prompt": "test"}]


def test_folder_without_a_dataset(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(ValueError, match="holds no dataset"):
        load_rows(tmp_path)
