"""The run around the step: resume, train to `trainer.total_steps`, evaluate held out, checkpoint, log, restart.

`Controller` (trainer.py) holds the roles, the step, the advantages and the checkpoint state; `RunLoop`
decides when each happens:

    loop = RunLoop(controller)
    result = loop.fit()   # {"before": val metrics, "after": ..., "seconds": ..., "stopped": {...} or {}}

- resume: the checkpoint the run folder chose (trainer.resume), or step 0; the metrics of later steps are
  dropped, so a resumed run redoes them (exactly: resume is deterministic);
- every step goes to `metrics.jsonl`, the console and each tracker of `trainer.loggers`; validation before the
  first step (unless `trainer.val_before_train` is false), every `trainer.val_every` steps and after the last; a
  checkpoint every `trainer.save_every` steps and after the last;
- SIGTERM or a first Ctrl-C ends the run after the current step with a checkpoint (preemption.py);
- a non-finite loss stops the run with a TrainingError that says what to change and what was kept;
- a worker process or node that dies, or a weight sync that times out, rebuilds the workers and continues
  from the last checkpoint, up to `trainer.max_restarts` times (restart.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from grpoflow.controller.checkpoint import step_dir_name
from grpoflow.controller.metrics import MetricsLogger
from grpoflow.controller.preemption import stop_on_signals
from grpoflow.controller.restart import record_restart, restartable, with_restart_advice
from grpoflow.controller.trackers import build_trackers
from grpoflow.controller.trainer import Controller
from grpoflow.distributed.worker_group import WorkerError
from grpoflow.training.engine import NonFiniteLossError


class TrainingError(RuntimeError):
    """Training stopped; the message names the cause, the fix, and what was kept."""


class RunLoop:
    """One run of `controller` from its resume point to `trainer.total_steps`; see the module docstring."""

    def __init__(self, controller: Controller) -> None:
        self.controller, self.cfg = controller, controller.cfg
        self.logger = MetricsLogger(controller.run_dir, every=self.cfg.trainer.log_every)
        self.trackers: list = []  # built in fit(), once the resume step is known
        self.restarts, self.current_step = 0, 0  # automatic restarts of this process's run (trainer.max_restarts)

    def fit(self, checkpoint: Path | None | str = "resolve") -> dict[str, Any]:
        """(Resume,) evaluate on the held-out prompts, train to `trainer.total_steps` (evaluating every `val_every`,
        saving every `save_every`), evaluate again. A worker process or node that dies, or a weight sync that times out,
        rebuilds the workers and continues from the last checkpoint, up to `trainer.max_restarts` times.
        `checkpoint`: the one to resume from, as the run folder chose it (default: resolve trainer.resume)."""
        c, t = self.controller, self.cfg.trainer
        chosen = c.checkpoints.resolve(t.resume) if checkpoint == "resolve" else checkpoint
        start, history = self.resume_from(Path(chosen) if chosen is not None else None)
        self.trackers = build_trackers(t.loggers, c.run_dir, self.cfg.to_dict(), t.project,
                                       t.run_name or c.run_dir.resolve().name, resume_step=start)
        try:
            while True:
                try:
                    return self.train_from(start, history)
                except WorkerError as e:
                    if not restartable(e) or self.restarts >= t.max_restarts:
                        raise with_restart_advice(e, t.max_restarts, c.last_saved) from None
                    self.restarts += 1
                    record_restart(c.run_dir, self.restarts, t.max_restarts, self.current_step, e, c.last_saved)
                    c.rebuild()
                    start, history = self.resume_from(c.last_saved)
        finally:
            c.train_samples.close()
            for tracker in self.trackers:
                tracker.close()

    def resume_from(self, checkpoint: Path | None) -> tuple[int, list[dict]]:
        """Load `checkpoint` (None: start at step 0); the step to continue after, and the kept metric records."""
        c = self.controller
        start = c.load_checkpoint(checkpoint) if checkpoint is not None else 0
        history = self.logger.start(start)
        c.train_samples.start(start)
        if not start:
            (c.run_dir / "samples.jsonl").unlink(missing_ok=True)
        if checkpoint is not None:
            tqdm.write(f"resumed from {checkpoint} (step {start} of {self.cfg.trainer.total_steps})")
        return start, history

    def train_from(self, start: int, history: list[dict]) -> dict[str, Any]:
        """Steps start+1 .. trainer.total_steps; `history` holds the kept records of a resumed run.

        SIGTERM or a first Ctrl-C ends the run after the current step with a checkpoint (preemption.py);
        the result's "stopped" then says by which signal, at which step and where the checkpoint is."""
        c, t = self.controller, self.cfg.trainer
        do_val = t.val_every > 0 and bool(c.val_items)
        began = time.perf_counter()
        stopped: dict[str, Any] = {}
        with stop_on_signals() as stop:
            first = next((r for r in history if r["step"] == 0), {}) if start else \
                (c.evaluate_held_out(0) if do_val and t.val_before_train else {})
            if first and not start:
                self.log(0, first, force_print=True)
            first = {k: v for k, v in first.items() if k != "step"}
            last = next(({k: v for k, v in r.items() if k.startswith("val/")} for r in reversed(history)
                         if any(k.startswith("val/") for k in r)), dict(first))
            done, saved = start, start  # the last step trained, and the last with a checkpoint (0: none needed)
            bar = tqdm(range(start + 1, t.total_steps + 1), desc="rl", unit="step", dynamic_ncols=True)
            for step in bar:
                if stop.requested:
                    break
                self.current_step = step
                metrics = self.checked_step(step)
                if self.restarts:
                    metrics["restarts"] = self.restarts
                if do_val and (step % t.val_every == 0 or step == t.total_steps):
                    last = c.evaluate_held_out(step)
                    metrics.update(last)
                self.log(step, metrics, force_print=step == t.total_steps)
                done = step
                if t.save_every and (step % t.save_every == 0 or step == t.total_steps):
                    c.save_checkpoint(step)
                    saved = step
                bar.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}")
            bar.close()
            if stop.requested and done < t.total_steps:
                # Saved here, after the loop, not inside it: a signal that lands after a step's save decision
                # (in the progress bar's refresh, say) still gets that step its checkpoint.
                if done > saved:
                    c.save_checkpoint(done)
                    saved = done
                stopped = {"signal": stop.signal_name, "step": done,
                           "checkpoint": c.checkpoints.root / step_dir_name(saved) if saved else None}
            c.drain()
        if start >= t.total_steps:
            tqdm.write(f"nothing left to train: the checkpoint is at step {start} of trainer.total_steps="
                       f"{t.total_steps}; use trainer.resume=never or another trainer.output_dir to start over.")
        return {"before": first, "after": last, "seconds": time.perf_counter() - began, "stopped": stopped}

    def checked_step(self, step: int) -> dict[str, float]:
        """`controller.step(step)`, with a non-finite loss turned into a TrainingError that says what to change."""
        try:
            return self.controller.step(step)
        except WorkerError as e:
            if isinstance(e.original, NonFiniteLossError):
                latest = self.controller.checkpoints.latest()
                kept = f"the last checkpoint, {latest}, is where a rerun resumes" if latest else \
                    "no checkpoint was written yet"
                raise TrainingError(
                    f"Stopped at step {step}: {e.original}. Lower actor.lr, check that rewards are finite and "
                    f"of moderate scale, or lower actor.grad_clip; {kept}, and metrics of steps before {step} are "
                    f"kept in {self.logger.path}.") from None
            raise

    def log(self, step: int, metrics: dict[str, float], *, force_print: bool = False) -> None:
        """One step's metrics to metrics.jsonl and the console, and to every tracker of trainer.loggers."""
        self.logger.log(step, metrics, force_print=force_print)
        for tracker in self.trackers:
            tracker.log(step, metrics)
