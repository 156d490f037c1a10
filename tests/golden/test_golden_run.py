"""The golden run (tests/golden/run.py) against its stored numbers: bit for bit on the machine kind that wrote
them, within run.RTOL elsewhere. A change that moves them fails here until `python -m tests.golden.rewrite --why
"..."` records why."""

from golden.run import MISMATCH_ATOL, RTOL, differences, machine, read_golden, run_golden


def test_the_golden_run_has_its_stored_numbers(tmp_path):
    golden = read_golden()
    same_kind = golden["machine"] == machine()
    steps = run_golden(tmp_path / "run")
    wrong = differences(golden["steps"], steps, exact=same_kind)
    how = "bit for bit (the machine kind that wrote them)" if same_kind else \
        f"within rtol {RTOL}, mismatch under {MISMATCH_ATOL} (written on {golden['machine']}, here {machine()})"
    assert not wrong, (
        f"the golden run's numbers moved, compared {how}:\n  " + "\n  ".join(wrong[:12]) +
        "\nIf the change is meant, rewrite them saying why: python -m tests.golden.rewrite --why \"...\"")


def test_the_comparison_catches_a_moved_number():
    stored = [{"step": 1, "actor/grad_norm": 1.7, "mismatch/abs_log_ratio_mean": 4e-7}]
    moved = [{"step": 1, "actor/grad_norm": 1.7 * (1 + 2 * RTOL), "mismatch/abs_log_ratio_mean": 4e-7}]
    close = [{"step": 1, "actor/grad_norm": 1.7 * (1 + RTOL / 10), "mismatch/abs_log_ratio_mean": 9e-6}]
    assert differences(stored, moved, exact=False) and not differences(stored, close, exact=False)
    assert differences(stored, close, exact=True)
