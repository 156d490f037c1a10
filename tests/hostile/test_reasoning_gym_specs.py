"""Issue 36, finding 6: a reasoning-gym spec with options the task refuses, or a size no machine can generate, is
one clear error naming the spec, not a raw traceback or a hang."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

from grpoflow.plan.run_plan import read_rows  # noqa: E402
from grpoflow.config import ConfigError  # noqa: E402


@pytest.mark.parametrize("spec, message", [
    ("reasoning_gym:chain_sum?min_terms=5&max_terms=2", r"refused its options \(AssertionError: max_terms must be"),
    ("reasoning_gym:chain_sum?size=-1", r"size=-1; give a whole number of rows from 1 to 100000"),
    ("reasoning_gym:chain_sum?size=100000000", r"size=100000000; give a whole number of rows from 1 to 100000"),
    ("reasoning_gym:chain_sum?seed=x", r"seed='x'; give a whole number")])
def test_a_bad_reasoning_gym_spec_is_one_clear_error(spec, message):
    with pytest.raises(ConfigError, match=message) as refused:
        read_rows([spec])
    assert spec in str(refused.value)
