"""Which worker faults trainer.max_restarts restarts, and what the message says when it does not."""

from pathlib import Path

import pytest

from grpoflow.config import ConfigError, load_config
from grpoflow.controller.restart import cause, record_restart, restartable, with_restart_advice
from grpoflow.distributed.host import CallTimeout, WorkerDied
from grpoflow.distributed.worker_group import WorkerError

TRACEBACK = "\n--- original traceback ---\nTraceback (most recent call last): ..."


def error(original: BaseException) -> WorkerError:
    return WorkerError(f"actor worker rank 1 (pid 7 on n2) failed in `update_policy`: {type(original).__name__}: "
                       f"{original}{TRACEBACK}", role="actor", rank=1, original=original)


def test_dead_processes_and_timeouts_restart_errors_in_the_code_do_not():
    assert restartable(error(WorkerDied("its process ended")))
    assert restartable(error(CallTimeout("no answer from rank(s) [0] within 60s")))
    assert not restartable(error(ValueError("shapes do not match")))
    assert not restartable(WorkerError("x", role="actor", rank=0, original=None))


def test_without_restarts_the_message_says_how_to_get_them_before_the_traceback():
    e = with_restart_advice(error(WorkerDied("its process ended")), 0, Path("run/checkpoints/step_000004"))
    head = str(e).split("--- original traceback ---")[0]
    assert "The same command resumes from the last checkpoint, run/checkpoints/step_000004; set " \
           "trainer.max_restarts=N (e.g. 2)" in head
    assert str(e).endswith("Traceback (most recent call last): ...") and e.role == "actor" and e.rank == 1
    spent = with_restart_advice(error(WorkerDied("its process ended")), 2, None)
    assert "Stopped after trainer.max_restarts=2 automatic restarts; no checkpoint was written yet" in str(spent)
    code = error(ValueError("shapes do not match"))
    assert with_restart_advice(code, 0, None) is code  # a bug in the code: a restart would not help, so no advice


def test_a_restart_is_recorded_with_its_cause(tmp_path, capsys):
    e = error(WorkerDied("its process ended"))
    record_restart(tmp_path, 1, 3, 5, e, tmp_path / "step_000004")
    assert cause(e) == "actor worker rank 1 (pid 7 on n2) failed in `update_policy`: WorkerDied: its process ended"
    assert "restart 1 of trainer.max_restarts=3 during step 5: actor worker rank 1" in capsys.readouterr().out
    line = (tmp_path / "restarts.jsonl").read_text()
    assert '"restart": 1' in line and '"during_step": 5' in line and "step_000004" in line


def test_max_restarts_below_zero_is_a_config_error():
    assert load_config(None, ["trainer.max_restarts=2"]).trainer.max_restarts == 2
    with pytest.raises(ConfigError, match="trainer.max_restarts=-1 must be >= 0"):
        load_config(None, ["trainer.max_restarts=-1"])
