"""Issue 36, finding 6 (viewer): one line of metrics.jsonl that is JSON but not an object (`3`, `[]`, `"x"`) must
not blank the run's curves, and train_samples.jsonl is read by step (an index of byte ranges), never held whole."""

from __future__ import annotations

import json
import logging

from grpoflow.metrics_file import read_metrics
from grpoflow.viewer.watched_run import WatchedRun, StepIndex


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def test_a_non_object_metrics_line_is_skipped_not_fatal(tmp_path, caplog):
    write(tmp_path / "metrics.jsonl", [json.dumps({"step": 1, "critic/score/mean": 0.5, "timing_s/step": 1.0}),
                                       "3", "[]", '"text"', "null", '{"no": "step"}',
                                       json.dumps({"step": 2, "critic/score/mean": 0.7, "timing_s/step": 1.0})])
    run = WatchedRun(tmp_path)
    with caplog.at_level(logging.WARNING, logger="grpoflow.metrics"):
        records, _ = run.metrics.since(0, run.metrics.generation)
    assert [r["step"] for r in records] == [1, 2]
    assert run.facts()["last_step"] == 2
    # the rule and the warnings of every metrics.jsonl reader (grpoflow/metrics_file.py): lines 2 to 6 named
    assert [int(m.split(", line ")[1].split(",")[0]) for m in (r.getMessage() for r in caplog.records)] == \
        [2, 3, 4, 5, 6]
    assert read_metrics(tmp_path) == records


def test_train_samples_are_read_by_step_through_an_index(tmp_path):
    groups = [{"step": s, "group": g, "samples": [{"completion": "x" * 300, "score": float(g)}]}
              for s in (1, 2, 3) for g in range(4)]
    write(tmp_path / "train_samples.jsonl", [json.dumps(g) for g in groups] + ["[1, 2]", '{"step": "2"}'])
    with open(tmp_path / "train_samples.jsonl", "a") as f:
        f.write('{"step": 4, "group": 0, "samp')   # being written
    index = StepIndex(tmp_path / "train_samples.jsonl", block=100)   # lines longer than a block
    assert index.steps() == [1, 2, 3]
    assert index.records(2) == groups[4:8]
    assert sum(len(v) for v in index.spans.values()) == 12  # byte ranges, not records
    with open(tmp_path / "train_samples.jsonl", "a") as f:
        f.write('les": []}\n')
    assert index.steps() == [1, 2, 3, 4] and index.records(4) == [{"step": 4, "group": 0, "samples": []}]
    run = WatchedRun(tmp_path)
    assert [g["group"] for g in run.groups("train", 3)] == [0, 1, 2, 3]
    assert run.rollout_steps()["train"] == [1, 2, 3, 4]


def test_a_sample_without_score_and_a_group_without_samples_are_shown_not_a_500(tmp_path):
    """Issue 53 item 7: a train_samples.jsonl record whose sample has no `score` made /groups a plain-text 500,
    and one with no `samples` list broke the Rollouts tab. Both come back as JSON: the sample with score None,
    the group empty, each with a note saying what is missing; the other samples' mean is unchanged."""
    from fastapi.testclient import TestClient

    from grpoflow.viewer.server import build_app

    write(tmp_path / "train_samples.jsonl", [
        json.dumps({"step": 1, "group": 0, "prompt": "1+1=", "samples": [{"completion": "2", "score": 1.0},
                                                                          {"completion": "3"},
                                                                          {"completion": "4", "score": "high"},
                                                                          {"completion": "5", "score": 0.0}]}),
        json.dumps({"step": 1, "group": 1, "prompt": "2+2="})])
    answer = TestClient(build_app([tmp_path]), base_url="http://127.0.0.1").get("/api/runs/0/groups?step=1")
    assert answer.status_code == 200, answer.text
    scored, empty = answer.json()["groups"]
    assert [s["score"] for s in scored["samples"]] == [1.0, None, None, 0.0]
    assert scored["mean"] == 0.5 and scored["std"] == 0.5 and "2 of 4 samples have no score" in scored["note"]
    assert empty["samples"] == [] and "no `samples` list" in empty["note"] and empty["mean"] == 0.0
