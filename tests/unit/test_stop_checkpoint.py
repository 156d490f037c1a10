"""A stop request checkpoints the step it arrived in, wherever in that step's iteration it lands.

The run loop with a stand-in controller (no model): the loop's own bookkeeping is what is checked here; the
real run, signal and resume are tests/faults/test_preemption.py. A signal that lands after a step's metrics
are written (where the faults test sends it) once fell after the loop's save decision and left no checkpoint.
"""

import os
import signal
from pathlib import Path

import pytest

from grpoflow.config import Config
from grpoflow.controller.fit import RunLoop


class Checkpoints:
    def __init__(self, root: Path) -> None:
        self.root = root


class StandInController:
    """What RunLoop.train_from reads of a Controller: steps, validation, checkpoints."""

    def __init__(self, run_dir: Path, total_steps: int, save_every: int, signal_in_bar_at: int = 0) -> None:
        self.cfg = Config()
        self.signal_in_bar_at = signal_in_bar_at
        self.cfg.trainer.total_steps, self.cfg.trainer.save_every, self.cfg.trainer.val_every = \
            total_steps, save_every, 0
        self.run_dir, self.val_items, self.saved = run_dir, [], []
        self.checkpoints = Checkpoints(run_dir / "checkpoints")

    def step(self, step: int) -> dict[str, float]:
        score = SignalWhenShown(0.5) if step == self.signal_in_bar_at else 0.5
        return {"critic/score/mean": score}

    def save_checkpoint(self, step: int) -> None:
        self.saved.append(step)

    def drain(self) -> None:
        pass


class SignalWhenShown(float):
    """A score that sends SIGTERM when the progress bar formats it: the last thing of a step's iteration,
    after its save decision."""

    def __format__(self, spec: str) -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        return float.__format__(self, spec)


class SignalAfterLogging:
    """A tracker that sends SIGTERM once step `at` is logged: after metrics.jsonl has it."""

    def __init__(self, at: int) -> None:
        self.at = at

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("where", ["after logging", "in the progress bar"])
@pytest.mark.parametrize("at", [1, 3, 4])
def test_a_stop_inside_a_step_checkpoints_that_step_once(tmp_path, at, where):
    controller = StandInController(tmp_path, total_steps=8, save_every=3,
                                   signal_in_bar_at=at if where == "in the progress bar" else 0)
    loop = RunLoop(controller)
    loop.logger.start(0)
    loop.trackers = [SignalAfterLogging(at)] if where == "after logging" else []
    result = loop.train_from(0, [])
    on_grid = [s for s in (3,) if s < at]
    assert controller.saved == on_grid + [at]  # step 3 is saved by the grid, once
    assert result["stopped"] == {"signal": "SIGTERM", "step": at,
                                 "checkpoint": tmp_path / "checkpoints" / f"step_{at:06d}"}


def test_a_run_without_a_stop_saves_on_the_grid_and_after_the_last_step(tmp_path):
    controller = StandInController(tmp_path, total_steps=8, save_every=3)
    loop = RunLoop(controller)
    loop.logger.start(0)
    assert loop.train_from(0, [])["stopped"] == {}
    assert controller.saved == [3, 6, 8]
