"""The addition task: deterministic, disjoint train/val, correct answers."""

import json

import pytest

from grpoflow.tasks.addition import addition_splits, make_addition_rows


def _check(row, digits):
    a, b = row["prompt"].removesuffix("=").split("+")
    assert row["prompt"].endswith("=")
    assert 0 <= int(a) < 10**digits and 0 <= int(b) < 10**digits
    assert row["answer"] == str(int(a) + int(b))
    assert row["data_source"] == "addition"


def test_rows_are_deterministic_distinct_and_correct():
    rows = make_addition_rows(300, seed=7)
    assert rows == make_addition_rows(300, seed=7)
    assert rows != make_addition_rows(300, seed=8)
    assert len({r["prompt"] for r in rows}) == 300
    for r in rows:
        _check(r, digits=2)
    assert rows[0]["prompt"] != rows[1]["prompt"]


def test_exclude_and_digits():
    rows = make_addition_rows(50, seed=0, digits=1, exclude={"3+4=", "0+0="})
    prompts = {r["prompt"] for r in rows}
    assert "3+4=" not in prompts and "0+0=" not in prompts
    for r in rows:
        _check(r, digits=1)
    # All 100 one-digit pairs, none excluded: every pair appears exactly once.
    assert len({r["prompt"] for r in make_addition_rows(100, seed=1, digits=1)}) == 100
    with pytest.raises(ValueError, match="at most 98"):
        make_addition_rows(99, seed=0, digits=1, exclude={"3+4=", "0+0="})


def write_addition_dataset(out_dir, n_train: int, n_val: int, seed: int) -> tuple[str, str]:
    """`addition_splits` written as train.jsonl and val.jsonl into `out_dir` (the rows a user's own files hold)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in zip(("train", "val"), addition_splits(n_train, n_val, seed)):
        (out_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(out_dir / f"{name}.jsonl"))
    return paths[0], paths[1]


def test_write_dataset_disjoint(tmp_path):
    train_path, val_path = write_addition_dataset(tmp_path, n_train=400, n_val=100, seed=3)
    train = [json.loads(line) for line in open(train_path)]
    val = [json.loads(line) for line in open(val_path)]
    assert len(train) == 400 and len(val) == 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    for r in train + val:
        _check(r, digits=2)
    # Same seed writes the same files.
    again = write_addition_dataset(tmp_path / "again", n_train=400, n_val=100, seed=3)
    assert open(again[0]).read() == open(train_path).read()
    assert open(again[1]).read() == open(val_path).read()
