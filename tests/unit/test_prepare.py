"""prepare_dataset: verl-style rows for gsm8k / math / countdown, splits, errors, and the round trip
prepared parquet -> load_rows -> prepare_prompts -> reward."""

import json
from pathlib import Path

import pyarrow as pa
import pytest

from grpoflow.data.dataset import load_rows, prepare_prompts
from grpoflow.data.prepare import DATASETS, math_row, prepare_dataset
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.rewards.answers import gsm8k_reward, math_reward
from grpoflow.rewards.countdown import countdown_reward
from grpoflow.rewards.scoring import score_completions

FIXTURES = Path(__file__).parent.parent / "fixtures"
GSM8K = FIXTURES / "gsm8k_sample.jsonl"
MATH = FIXTURES / "math_sample.jsonl"
COUNTDOWN = FIXTURES / "countdown_sample.jsonl"


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _source_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gsm8k_row_is_verls(tmp_path):
    written = prepare_dataset("gsm8k", GSM8K, tmp_path)
    assert written == {"train": str(tmp_path / "train.parquet")}  # no test source, no test_size
    rows = load_rows(written["train"])
    source = _source_rows(GSM8K)
    assert len(rows) == len(source) == 6
    assert rows[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": source[0]["question"]
                    + " Let's think step by step and output the final answer after \"####\"."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "14"},
        "extra_info": {"split": "train", "index": 0, "answer": source[0]["answer"],
                       "question": source[0]["question"]},
    }
    # "#### 1,250,000" loses its commas; negative and decimal answers are kept as written.
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["14", "12", "210", "1250000", "-7", "0.75"]
    assert [r["extra_info"]["index"] for r in rows] == list(range(6))


def test_round_trip_prompts_and_gsm8k_reward(tmp_path, tok):
    rows = load_rows(prepare_dataset("gsm8k", GSM8K, tmp_path)["train"])
    items, stats = prepare_prompts(rows, tok, max_prompt_length=1024)
    assert stats.kept == 6
    question = rows[3]["extra_info"]["question"]
    assert items[3].prompt_text == (
        f"<|im_start|>user\n{question} Let's think step by step and output the final answer after "
        f"\"####\".<|im_end|>\n<|im_start|>assistant\n"
    )
    assert items[3].data_source == "openai/gsm8k"
    # The scorer passes the row's columns (without "prompt") as keyword arguments, as in training.
    completions = ["1,250 houses pay $1,000 each, so 1250000 in all.\n#### 1,250,000",
                   "#### 1250001", "I do not know."]
    scores = score_completions(gsm8k_reward, [items[3].prompt_text] * 3, completions, [items[3].row] * 3)
    assert scores.scores == [1.0, 0.0, 0.0] and scores.errors == scores.nones == 0


def test_math_rows_and_reward(tmp_path, tok):
    rows = load_rows(prepare_dataset("math", MATH, tmp_path)["train"])
    assert [r["reward_model"]["ground_truth"] for r in rows] == [
        "7", "\\frac{1}{2}", "3\\sqrt{2}", "\\left(-1, 3\\right)"]  # nested braces kept whole
    assert rows[1]["prompt"][0]["content"].endswith(
        "$. Let's think step by step and output the final answer within \\boxed{}.")
    assert rows[1]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert rows[1]["extra_info"] == {"split": "train", "index": 1}
    # As in verl (datasets.map), the columns the converter does not consume stay.
    assert (rows[0]["level"], rows[0]["type"]) == ("Level 1", "Algebra")
    assert "problem" not in rows[0] and "solution" not in rows[0]

    items, stats = prepare_prompts(rows, tok, max_prompt_length=1024)
    assert stats.kept == 4
    scores = score_completions(math_reward, [items[1].prompt_text] * 2, ["so $\\boxed{\\dfrac12}$", "\\boxed{8}"],
                               [items[1].row] * 2)
    assert scores.scores == [1.0, 0.0]


def test_math_uses_the_last_box():
    row = math_row({"problem": "p", "solution": "First $\\boxed{1}$, then really $\\boxed{\\{2\\}}$."}, 0, "test")
    assert row["reward_model"]["ground_truth"] == "\\{2\\}"


def test_countdown_rows_and_reward(tmp_path, tok):
    rows = load_rows(prepare_dataset("countdown", COUNTDOWN, tmp_path)["train"])
    assert rows[1]["target"] == 98 and rows[1]["nums"] == [44, 19, 35]
    assert rows[1]["reward_model"] == {"style": "rule", "ground_truth": {"target": 98, "numbers": [44, 19, 35]}}
    assert rows[1]["data_source"] == "countdown"
    content = rows[1]["prompt"][0]["content"]
    assert content.startswith("Using the numbers [44, 19, 35], create an equation that equals 98.")
    assert "<answer> </answer>" in content

    items, stats = prepare_prompts(rows, tok, max_prompt_length=1024)
    assert stats.kept == 4
    # Score against the nested ground truth only: without the target/nums columns.
    truth_only = {k: v for k, v in items[0].row.items() if k not in ("target", "nums")}
    scores = score_completions(countdown_reward, [items[0].prompt_text] * 3,
                               ["<answer>2 * 3 * 4</answer>", "<answer>2 + 3 + 4</answer>", "I give up."],
                               [truth_only] * 3)
    assert scores.scores == [1.0, 0.1, 0.0]


def test_seeded_split(tmp_path):
    a = prepare_dataset("gsm8k", GSM8K, tmp_path / "a", test_size=2, seed=3)
    b = prepare_dataset("gsm8k", GSM8K, tmp_path / "b", test_size=2, seed=3)
    train, test = load_rows(a["train"]), load_rows(a["test"])
    assert (len(train), len(test)) == (4, 2)
    assert load_rows(b["train"]) == train and load_rows(b["test"]) == test  # same seed, same split
    questions = [r["question"] for r in _source_rows(GSM8K)]
    got = [r["extra_info"]["question"] for r in train + test]
    assert sorted(got) == sorted(questions)  # a partition of the source
    for split, rows in (("train", train), ("test", test)):  # each keeps the source order and counts from 0
        assert [questions.index(r["extra_info"]["question"]) for r in rows] == sorted(
            questions.index(r["extra_info"]["question"]) for r in rows)
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        assert {r["extra_info"]["split"] for r in rows} == {split}
    # a fraction rounds up: ceil(0.25 * 6) = 2
    assert len(load_rows(prepare_dataset("gsm8k", GSM8K, tmp_path / "c", test_size=0.25)["test"])) == 2


def test_test_source_and_limit(tmp_path):
    written = prepare_dataset("countdown", [COUNTDOWN, COUNTDOWN], tmp_path, test_source=COUNTDOWN, limit=5)
    assert set(written) == {"train", "test"}
    train, test = load_rows(written["train"]), load_rows(written["test"])
    assert len(train) == 5 and len(test) == 4  # 8 source rows limited to 5; the test source has 4
    assert test[0]["extra_info"] == {"split": "test", "index": 0}


def test_source_can_be_a_saved_dataset_folder(tmp_path):
    folder = tmp_path / "gsm8k_train"
    folder.mkdir()
    table = pa.Table.from_pylist(_source_rows(GSM8K))
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    rows = load_rows(prepare_dataset("gsm8k", folder, tmp_path / "out")["train"])
    assert [r["reward_model"]["ground_truth"] for r in rows][:2] == ["14", "12"]


def test_unknown_dataset(tmp_path):
    assert set(DATASETS) == {"gsm8k", "math", "countdown"}
    with pytest.raises(ValueError, match="unknown dataset 'gsm8k_typo'; choose one of: countdown, gsm8k, math"):
        prepare_dataset("gsm8k_typo", GSM8K, tmp_path)


def test_missing_column_names_column_and_file(tmp_path):
    src = tmp_path / "questions.jsonl"
    src.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n"
                   + json.dumps({"question": "2+2?"}) + "\n")
    with pytest.raises(ValueError, match=r"questions\.jsonl: row 1: missing column 'answer'"):
        prepare_dataset("gsm8k", src, tmp_path / "out")
    with pytest.raises(ValueError, match=r"questions\.jsonl: row 0: missing column 'problem'"):
        prepare_dataset("math", src, tmp_path / "out")
    with pytest.raises(ValueError, match=r"gsm8k_sample\.jsonl: row 0: missing column 'target'"):
        prepare_dataset("countdown", GSM8K, tmp_path / "out")


def test_answers_without_a_final_answer(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({"question": "q", "answer": "it is 4", "problem": "p", "solution": "it is 4"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 0: column 'answer' has no '#### <number>'"):
        prepare_dataset("gsm8k", src, tmp_path / "out")
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 0: column 'solution' has no closed \\boxed"):
        prepare_dataset("math", src, tmp_path / "out")


@pytest.mark.parametrize("kwargs, message", [
    ({"test_size": 6}, "gives 6 test rows of 6"),
    ({"test_size": 1.0}, r"a fraction must be in \(0, 1\)"),
    ({"test_size": True}, "give a row count"),
    ({"test_size": 1, "test_source": GSM8K}, "not both"),
    ({"limit": 0}, "limit=0"),
])
def test_bad_split_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prepare_dataset("gsm8k", GSM8K, tmp_path, **kwargs)


def test_a_multi_turn_runs_tool_schemas_count_in_the_prompt_length():
    from grpoflow.models.tiny import build_char_tokenizer
    from grpoflow.trajectories.chat import ChatRenderer
    from grpoflow.trajectories.tools import load_tools

    tok = build_char_tokenizer()
    tok.chat_template = ("{% for t in tools or [] %}{{ t | tojson }}\n{% endfor %}{% for m in messages %}<|im_start|>"
                         "{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # renders tools
    schemas = [t.schema for t in load_tools(["calculator"])]
    rows = [{"prompt": "347*29"}]
    plain, _ = prepare_prompts(rows, tok, apply_chat_template=True)
    with_tools, _ = prepare_prompts(rows, tok, apply_chat_template=True, tools=schemas, max_prompt_length=4000)
    # the ids a tool run's conversation starts from, schemas included, are what the length check sees
    assert with_tools[0].prompt_ids == ChatRenderer(tok, schemas).prompt_ids([{"role": "user", "content": "347*29"}])
    assert len(with_tools[0].prompt_ids) > len(plain[0].prompt_ids) + 50
    with pytest.raises(ValueError, match="over data.max_prompt_length"):
        prepare_prompts(rows, tok, apply_chat_template=True, tools=schemas, max_prompt_length=len(plain[0].prompt_ids),
                        overlong="error")
