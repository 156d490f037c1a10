"""Each tracker's output read back with its own package's reader; build_trackers' errors.

Tests of a tracker whose package is not installed are skipped (pytest.importorskip).
"""

import glob
import importlib.util
import json
import struct
import time

import pytest

from grpoflow.controller import trackers
from grpoflow.controller.trackers import Tracker, build_trackers, check_trackers, flatten, mlflow_name
from grpoflow.errors import MissingExtraError

# three steps as the controller logs them: validation alone at step 0, then training steps
# with validation on the last one; the '@' keys are the ones MLflow rejects
STEPS = {
    0: {"val/addition/mean@1": 0.25, "val/mean@1": 0.25},
    1: {"critic/score/mean": 0.5, "actor/kl_loss": 0.01, "timing_s/step": 1.5},
    2: {"critic/score/mean": 0.75, "actor/kl_loss": 0.02, "timing_s/step": 1.25,
        "val/addition/mean@1": 0.5, "val/mean@1": 0.5},
}
CONFIG = {"actor": {"lr": 1e-4, "policy_loss": "vanilla"}, "rollout": {"n": 8}, "data": {"train_files": ["a.jsonl"]}}


def logged(key):
    """[(step, value)] of `key` in STEPS."""
    return [(step, m[key]) for step, m in STEPS.items() if key in m]


def feed(tracker):
    for step, metrics in STEPS.items():
        tracker.log(step, metrics)
    tracker.close()


# ---------------------------------------------------------------- TensorBoard


def test_tensorboard_scalars_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = build_trackers(["console", "jsonl", "tensorboard"], tmp_path, CONFIG, "grpoflow", "run")[0]
    assert isinstance(tracker, Tracker)
    feed(tracker)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {k for m in STEPS.values() for k in m}
    for key in events.Tags()["scalars"]:
        steps, values = zip(*logged(key))
        assert [e.step for e in events.Scalars(key)] == list(steps), key
        assert [e.value for e in events.Scalars(key)] == pytest.approx(values), key  # float32 in the event file


def test_tensorboard_resume_hides_the_redone_steps(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = build_trackers(["tensorboard"], tmp_path, CONFIG, "grpoflow", "run")[0]
    for step in (1, 2, 3):  # the first attempt got to step 3; its checkpoint is at step 1
        first.log(step, {"critic/score/mean": float(step)})
    first.close()
    second = build_trackers(["tensorboard"], tmp_path, CONFIG, "grpoflow", "run", resume_step=1)[0]
    for step in (2, 3, 4):
        second.log(step, {"critic/score/mean": 10.0 + step})
    second.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("critic/score/mean")] == [(1, 1.0), (2, 12.0), (3, 13.0),
                                                                               (4, 14.0)]


# ---------------------------------------------------------------- W&B


def wandb_records(path):
    """The protobuf records of a .wandb file (W&B's LevelDB-style log: 7-byte header, then 32 KiB
    blocks of chunks `crc32:u32 length:u16 type:u8 data`, type 1 whole, 2/3/4 first/middle/last)."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert b":W&B".startswith(data[:4]), "not a .wandb file"  # (or one still being created)
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # the writer is mid-chunk
            return
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield wandb_internal_pb2.Record.FromString(pending)
            pending = b""


def test_wandb_offline_run_history_and_summary(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default must be offline: no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = build_trackers(["wandb"], tmp_path, CONFIG, "grpoflow-test", "run-a")[0]
    for step, metrics in STEPS.items():
        tracker.log(step, metrics)
    assert tracker.run.settings.mode == "offline"
    assert tracker.run.config["actor"]["lr"] == 1e-4
    assert tracker.run.summary["critic/score/mean"] == 0.75  # the last value logged
    assert tracker.run.summary["val/addition/mean@1"] == 0.5
    tracker.close()

    files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    # wandb-core (a separate process) may still be writing the file when finish() returns
    deadline = time.monotonic() + 10
    while (history := wandb_history(files[0])) != STEPS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert history == STEPS


def wandb_history(path):
    """{step: {metric: value}} of the history records in a .wandb file."""
    history = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[row.pop("_step")] = {k: v for k, v in row.items() if not k.startswith("_")}
    return history


def test_wandb_mode_from_the_environment_wins(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    tracker = trackers.WandbTracker(tmp_path, "grpoflow-test", "run-b", {})
    tracker.log(1, {"x": 1.0})
    tracker.close()
    assert tracker.run.settings.mode == "disabled" and not (tmp_path / "wandb").exists()


# ---------------------------------------------------------------- MLflow


def test_mlflow_name_mapping():
    assert mlflow_name("val/addition/mean@1") == "val/addition/mean_at_1"
    assert mlflow_name("critic/score/mean") == "critic/score/mean"  # allowed names are unchanged
    assert mlflow_name("val/gsm8k:main/mean@1") == "val/gsm8k_main/mean_at_1"
    assert mlflow_name("val//x/../y/") == "val/x/y"  # MLflow rejects names that normalise to another path
    assert len(mlflow_name("a" * 300)) == 250


def test_flatten_config_to_params():
    assert flatten(CONFIG) == {"actor.lr": "0.0001", "actor.policy_loss": "vanilla", "rollout.n": "8",
                               "data.train_files": "['a.jsonl']"}


def test_mlflow_metric_history_and_params_read_back(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = build_trackers(["mlflow"], tmp_path, CONFIG, "grpoflow-test", "run-a")[0]
    run_id = tracker.run_id
    feed(tracker)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    assert run.data.params == flatten(CONFIG)
    assert set(run.data.metrics) == {mlflow_name(k) for m in STEPS.values() for k in m}
    for key in {k for m in STEPS.values() for k in m}:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, mlflow_name(key)))
        assert history == logged(key), key


def test_mlflow_respects_tracking_uri_and_refuses_clashing_names(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "elsewhere").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses its file store without it
    tracker = trackers.MLflowTracker(tmp_path / "run", "grpoflow-test", "run-b", {})
    tracker.log(1, {"val/x/mean@1": 1.0})
    with pytest.raises(ValueError, match="'val/x/mean@1' and 'val/x/mean_at_1' both map"):
        tracker.log(2, {"val/x/mean_at_1": 1.0})
    tracker.close()
    assert (tmp_path / "elsewhere").is_dir() and not (tmp_path / "run" / "mlflow.db").exists()


# ---------------------------------------------------------------- build_trackers


def test_console_and_jsonl_only_build_nothing(tmp_path):
    assert build_trackers(["console", "jsonl"], tmp_path, CONFIG, "p", "r") == []
    assert list(tmp_path.iterdir()) == []


def test_unknown_logger_names_it_and_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"'tensorbord', which is not a logger \(did you mean tensorboard\?\); "
                                         r"valid: console, jsonl, tensorboard, wandb, mlflow"):
        build_trackers(["console", "tensorbord"], tmp_path, CONFIG, "p", "r")


def test_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"^trainer.loggers includes wandb, but wandb is not installed; "
                                                r"pip install 'grpoflow\[wandb\]'$"):
        check_trackers(["console", "wandb"])
    assert issubclass(MissingExtraError, ImportError)


def test_a_failed_tracker_closes_the_ones_built_before_it(tmp_path, monkeypatch):
    closed = []

    class Fake:
        def log(self, step, metrics):
            pass

        def close(self):
            closed.append(True)

    def fail(*args):
        raise RuntimeError("server down")

    monkeypatch.setitem(trackers.TRACKERS, "tensorboard", trackers._Backend("os", lambda *a: Fake()))
    monkeypatch.setitem(trackers.TRACKERS, "mlflow", trackers._Backend("os", fail))
    with pytest.raises(RuntimeError, match="server down"):
        build_trackers(["tensorboard", "mlflow"], tmp_path, CONFIG, "p", "r")
    assert closed == [True]
