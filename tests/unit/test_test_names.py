"""Test modules are collected without packages (rootdir-relative basenames), so two files of one name in different
folders stop `make test` at collection ("import file mismatch"); this says which, before CI does."""

from collections import Counter
from pathlib import Path


def test_no_two_test_modules_share_a_name():
    names = Counter(p.name for p in (Path(__file__).parents[1]).rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1], [n for n, c in names.items() if c > 1]
