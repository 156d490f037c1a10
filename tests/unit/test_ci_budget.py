""".ci/run's stages fit CI's limit: every stage has a time limit, and the limits add up to at most 75 minutes (CI
stops at 90; what each stage takes per machine kind: docs/performance.md, "CI time")."""

import re
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"
BUDGET_S = 75 * 60


def stage_limits(text: str) -> dict[str, int]:
    """{stage name: its limit in seconds} for every `stage NAME LIMIT COMMAND...` line of a .ci/run text."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^[ \t]*stage (\S+) (\d+) ", text, re.M)}


def test_every_stage_has_a_limit_and_together_they_fit_75_minutes():
    limits = stage_limits(RUN.read_text())
    assert {"setup", "test", "slow", "real_model", "vllm", "faults"} <= set(limits), limits
    assert all(limit > 0 for limit in limits.values()), f"a stage without a time limit: {limits}"
    assert sum(limits.values()) <= BUDGET_S, f"the stages' limits add up to {sum(limits.values())} s > {BUDGET_S} s"


def test_the_reader_sees_every_stage_line():
    text = "stage a 10 make x\n  stage b 5 y\nstage c 0 z\n# stage d 7 w\n"
    assert stage_limits(text) == {"a": 10, "b": 5, "c": 0}
