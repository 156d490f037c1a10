"""Experiment trackers: the step metrics of `MetricsLogger`, also sent to TensorBoard, W&B or MLflow.

`trainer.loggers` names where metrics go. `console` and `jsonl` are always on (MetricsLogger);
`tensorboard`, `wandb` and `mlflow` each need their extra (`pip install 'grpoflow[wandb]'`) and
are imported only when asked for, so `import grpoflow` never loads them. Every tracker writes
inside the run folder by default and needs no network:

    tensorboard  <run_dir>/tensorboard/events.out.tfevents.*   (`tensorboard --logdir <run_dir>`)
    wandb        <run_dir>/wandb/offline-run-*/                (`wandb sync <that folder>` to upload);
                 mode=offline unless WANDB_MODE is set
    mlflow       <run_dir>/mlflow.db, artifacts in <run_dir>/mlartifacts
                 (`mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db`); MLFLOW_TRACKING_URI
                 overrides. Not `file:<run_dir>/mlruns`: MLflow 3 refuses its file store unless
                 MLFLOW_ALLOW_FILE_STORE=true is set, and calls it "maintenance mode".

MLflow accepts only `[A-Za-z0-9_-./ ]` in names and no empty or `.`/`..` path segments, so
metric and param names are mapped by `mlflow_name`: `@` -> `_at_` (`val/addition/mean@1` ->
`val/addition/mean_at_1`), any other character outside the set (colons too, which Windows
forbids) -> `_`, empty/dot segments dropped, at most 250 characters. Two names that map to the
same key raise instead of merging their series. TensorBoard and W&B keep the names as they are.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

from grpoflow.errors import MissingExtraError, UserError


@runtime_checkable
class Tracker(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of one step (called once per step, with increasing steps)."""

    def close(self) -> None:
        """Flush and finish; the tracker is not used afterwards."""


def _check_installed(package: str) -> None:
    """Raise one sentence naming the extra to install (each extra is named after its package)."""
    if importlib.util.find_spec(package) is None:
        raise MissingExtraError(f"trainer.loggers includes {package}, but {package} is not installed; "
                                f"pip install 'grpoflow[{package}]'")


def _require(package: str) -> Any:
    _check_installed(package)
    return importlib.import_module(package)


# ---------------------------------------------------------------- TensorBoard


class TensorBoardTracker:
    """Scalars under their metric names in `<run_dir>/tensorboard`.

    A run resumed from step k (resume_step=k) redoes the steps after k; TensorBoard hides the
    events the first attempt wrote for them (SummaryWriter's purge_step), as MetricsLogger drops
    their records."""

    def __init__(self, run_dir: str | Path, resume_step: int = 0) -> None:
        _require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=step)
        self.writer.flush()  # a step takes seconds; flushing each one keeps a live `tensorboard` current

    def close(self) -> None:
        self.writer.close()


# ---------------------------------------------------------------- Weights & Biases


class WandbTracker:
    """A W&B run in `<run_dir>/wandb`, offline unless WANDB_MODE says otherwise."""

    def __init__(self, run_dir: str | Path, project: str, run_name: str, config: dict) -> None:
        wandb = _require("wandb")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, config=config, dir=str(run_dir),
                              mode=os.environ.get("WANDB_MODE", "offline"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # with `step` given, W&B holds the row open until a later step arrives (commit defaults to
        # False); each call is a whole step, so commit it now and the last step is never pending
        self.run.log({name: float(value) for name, value in metrics.items()}, step=step, commit=True)

    def close(self) -> None:
        self.run.finish()


# ---------------------------------------------------------------- MLflow

_MLFLOW_BAD_CHARS = re.compile(r"[^/\w.\- ]", flags=re.ASCII)
_MLFLOW_MAX_KEY, _MLFLOW_MAX_PARAM_VALUE, _MLFLOW_BATCH = 250, 6000, 100


def mlflow_name(name: str) -> str:
    """A metric or param name MLflow accepts; see the module docstring for the mapping."""
    name = _MLFLOW_BAD_CHARS.sub("_", name.replace("@", "_at_"))
    segments = [s for s in name.split("/") if s not in ("", ".", "..")]
    return "/".join(segments)[:_MLFLOW_MAX_KEY] or "_"


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"actor": {"lr": 1e-4}} -> {"actor.lr": "0.0001"}: the config as MLflow params (strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:_MLFLOW_MAX_PARAM_VALUE]
    return out


class MLflowTracker:
    """An MLflow run, in `<run_dir>/mlflow.db` unless MLFLOW_TRACKING_URI is set; the config as params."""

    def __init__(self, run_dir: str | Path, experiment: str, run_name: str, config: dict) -> None:
        _require("mlflow")
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        self._metric, run_dir = Metric, Path(run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        local = not os.environ.get("MLFLOW_TRACKING_URI")
        self.client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}" if local else None)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=(run_dir / "mlartifacts").as_uri() if local else None)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name,
                                             tags={"grpoflow.run_dir": str(run_dir)}).info.run_id
        self._names: dict[str, str] = {}  # MLflow name -> metric name, to catch two names mapping to one
        params = [Param(mlflow_name(k), v) for k, v in flatten(config).items()]
        for start in range(0, len(params), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[start:start + _MLFLOW_BATCH])

    def _key(self, name: str) -> str:
        key = mlflow_name(name)
        first = self._names.setdefault(key, name)
        if first != name:
            raise ValueError(f"metrics {first!r} and {name!r} both map to the MLflow name {key!r}; "
                             f"rename one of them (MLflow allows only [A-Za-z0-9_-./ ] in names).")
        return key

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(self._key(k), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(batch), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[start:start + _MLFLOW_BATCH])

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


# ---------------------------------------------------------------- building from `trainer.loggers`


class _Backend(NamedTuple):
    package: str  # the optional package, also the name of its grpoflow extra
    make: Callable[[Path, dict, str, str, int], Tracker]  # (run_dir, config, project, run_name, resume_step)


# W&B and MLflow start a new run on every (re)start of training; TensorBoard continues its folder.
TRACKERS: dict[str, _Backend] = {
    "tensorboard": _Backend("tensorboard", lambda run_dir, config, project, name, resume_step:
                            TensorBoardTracker(run_dir, resume_step)),
    "wandb": _Backend("wandb", lambda run_dir, config, project, name, resume_step:
                      WandbTracker(run_dir, project, name, config)),
    "mlflow": _Backend("mlflow", lambda run_dir, config, project, name, resume_step:
                       MLflowTracker(run_dir, project, name, config)),
}
BUILT_IN = ("console", "jsonl")  # MetricsLogger's own outputs, always on
LOGGERS = (*BUILT_IN, *TRACKERS)


def check_trackers(names: list[str]) -> None:
    """Raise before any heavy stage if a name is unknown or its package is missing; builds nothing."""
    for name in names:
        if name not in LOGGERS:
            close = difflib.get_close_matches(name, LOGGERS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"trainer.loggers includes {name!r}, which is not a logger{hint}; "
                            f"valid: {', '.join(LOGGERS)}.")
        if name in TRACKERS:
            _check_installed(TRACKERS[name].package)


def build_trackers(names: list[str], run_dir: str | Path, config: dict, project: str, run_name: str, *,
                   resume_step: int = 0) -> list[Tracker]:
    """The trackers that `names` (trainer.loggers) asks for, in order; console/jsonl are skipped.

    `project` is the W&B project and the MLflow experiment; `resume_step` the checkpoint step a
    resumed run continues from (0: a fresh run)."""
    check_trackers(names)
    trackers: list[Tracker] = []
    try:
        for name in dict.fromkeys(names):  # a name given twice makes one tracker
            if name in TRACKERS:
                trackers.append(TRACKERS[name].make(Path(run_dir), config, project, run_name, resume_step))
    except BaseException:
        for tracker in trackers:  # do not leave a W&B or MLflow run open behind a failed one
            tracker.close()
        raise
    return trackers
