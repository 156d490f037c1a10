"""grpoflow view's JSON routes over a run folder written here: metrics followed by offset (and reset when a resumed
run rewrites the file), the groups of a step with their mean and spread, validation samples grouped, the run's
facts, the page and Plotly's bundle served from the package (no network), and the errors."""

import json
import re
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("plotly")
from fastapi.testclient import TestClient  # noqa: E402

from grpoflow.config import load_config, to_yaml  # noqa: E402
from grpoflow.viewer import watched_run  # noqa: E402
from grpoflow.viewer.server import STATIC, build_app  # noqa: E402


def write_lines(path, records, mode="w"):
    with open(path, mode) as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def group(step, g, scores, source="addition"):
    return {"step": step, "group": g, "data_source": source, "prompt": f"{g}+{g}=", "row": {"answer": str(2 * g)},
            "samples": [{"completion": str(s), "score": s, "advantage": 0.0, "length": 2} for s in scores]}


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run_a"
    run.mkdir()
    write_lines(run / "metrics.jsonl", [{"step": 0, "val/mean@1": 0.25}] +
                [{"step": s, "critic/score/mean": s / 10, "timing_s/step": 0.5, "timing_s/gen": 0.2} for s in (1, 2)])
    write_lines(run / "train_samples.jsonl", [group(1, 0, [1.0, 0.0, 0.0, 1.0]), group(2, 0, [1.0, 1.0]),
                                              group(2, 1, [0.0, 3.0], source="countdown")])
    val = [{"step": 2, "data_source": "addition", "prompt": "1+1=", "completion": c, "score": s}
           for c, s in (("2", 1.0), ("3", 0.0))] + [{"step": 2, "data_source": "addition", "prompt": "2+2=",
                                                     "completion": "4", "score": 1.0}]
    write_lines(run / "samples.jsonl", val + val[:1])   # a resumed run wrote the first sample again
    (run / "config.yaml").write_text(to_yaml(load_config(None, ["model.path=builtin:tiny-0.5m",
                                                                "data.prompts_per_step=4", "rollout.n=4"])))
    ckpt = run / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)   # the manifest as checkpoint.py writes it: sizes and checksums
    (ckpt / "manifest.json").write_text(json.dumps({"files": {"actor/model.safetensors": {"size": 1000, "sha256": "ab"},
                                                              "controller.pt": {"size": 24, "sha256": "cd"}}}))
    old = run / "checkpoints" / "step_000001"
    old.mkdir()                # a manifest of before checksums: {name: size}
    (old / "manifest.json").write_text(json.dumps({"actor/model.safetensors": 1000, "controller.pt": 20}))
    (run / "checkpoints" / "latest").write_text("step_000002")
    write_lines(run / "restarts.jsonl", [{"restart": 1, "during_step": 2, "role": "rollout", "rank": 0,
                                          "cause": "WorkerDied", "checkpoint": None}])
    return run


@pytest.fixture
def client(run_dir):
    return TestClient(build_app([run_dir, run_dir]), base_url="http://127.0.0.1")


def test_runs_and_metrics_follow_the_file_by_offset(client, run_dir):
    runs = client.get("/api/runs").json()
    assert [r["name"] for r in runs["runs"]] == ["run_a", "run_a"] and runs["refresh_s"] == 2.0
    first = client.get("/api/runs/0/metrics").json()
    assert [r["step"] for r in first["records"]] == [0, 1, 2] and first["count"] == 3
    gen = first["generation"]
    # the run writes step 3, and half of step 4's line: only the complete line comes
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "critic/score/mean": 0.3}) + '\n{"step": 4, "crit')
    more = client.get(f"/api/runs/0/metrics?count=3&generation={gen}").json()
    assert [r["step"] for r in more["records"]] == [3] and not more["reset"]
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('ic/score/mean": 0.4}\n')
    assert [r["step"] for r in client.get(f"/api/runs/0/metrics?count=4&generation={gen}").json()["records"]] == [4]
    # a resumed run rewrites the file (write aside, rename): the client is told to start over
    tmp = run_dir / "metrics.jsonl.tmp"
    write_lines(tmp, [{"step": 1, "critic/score/mean": 0.1}])
    tmp.replace(run_dir / "metrics.jsonl")
    again = client.get(f"/api/runs/0/metrics?count=5&generation={gen}").json()
    assert again["reset"] and [r["step"] for r in again["records"]] == [1] and again["generation"] != gen


def test_groups_of_a_step_with_mean_and_spread(client):
    assert client.get("/api/runs/0/steps").json() == {"train": [1, 2], "val": [2]}
    g1, = client.get("/api/runs/0/groups?kind=train&step=1").json()["groups"]
    # scores 1, 0, 0, 1: mean 0.5, population std sqrt(((0.5)^2 * 4) / 4) = 0.5
    assert g1["mean"] == pytest.approx(0.5) and g1["std"] == pytest.approx(0.5)
    a, b = client.get("/api/runs/0/groups?kind=train&step=2").json()["groups"]
    assert (a["mean"], a["std"]) == (1.0, 0.0)
    assert b["data_source"] == "countdown" and (b["mean"], b["std"]) == (pytest.approx(1.5), pytest.approx(1.5))


def test_validation_samples_are_grouped_by_prompt_and_repeats_dropped(client):
    groups = client.get("/api/runs/0/groups?kind=val&step=2").json()["groups"]
    assert [(g["prompt"], [s["completion"] for s in g["samples"]]) for g in groups] == [("1+1=", ["2", "3"]),
                                                                                        ("2+2=", ["4"])]
    assert groups[0]["mean"] == 0.5


def test_facts_hold_schedule_checkpoints_and_restarts(client):
    facts = client.get("/api/runs/0/facts").json()
    assert facts["schedule"].startswith("schedule: 4 prompts x 4 samples = 16 trajectories per step")
    assert [{k: c[k] for k in ("name", "step", "bytes", "latest")} for c in facts["checkpoints"]] == [
        {"name": "step_000001", "step": 1, "bytes": 1020, "latest": False},
        {"name": "step_000002", "step": 2, "bytes": 1024, "latest": True}]
    assert facts["restarts"][0]["cause"] == "WorkerDied"
    assert facts["last_step"] == 2 and facts["steps_logged"] == 2
    assert facts["summary"]["rollout.n"] == 4 and "model:" in facts["config_text"]


def test_bad_requests_name_the_problem(client):
    assert client.get("/api/runs/7/metrics").status_code == 404
    bad = client.get("/api/runs/0/groups?kind=other&step=1")
    assert bad.status_code == 400 and "use train or val" in bad.text
    assert client.get("/static/../server.py").status_code == 404
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_app(["/no/such/run"])


def test_only_requests_to_this_machines_address_are_answered(run_dir):
    """DNS rebinding: a page whose name resolves to 127.0.0.1 sends its own name as Host, and is refused."""
    app = build_app([run_dir], port=8765)
    assert TestClient(app, base_url="http://localhost:8765").get("/api/runs").status_code == 200
    assert TestClient(app, base_url="http://127.0.0.1:8765").get("/api/runs").status_code == 200
    for foreign in ("http://evil.example:8765", "http://127.0.0.1:9999", "http://testserver"):
        refused = TestClient(app, base_url=foreign).get("/api/runs")
        assert refused.status_code == 403 and "not this server's address" in refused.json()["error"]


def test_the_page_and_plotly_come_from_the_package_with_no_network(client):
    page = client.get("/")
    assert page.status_code == 200 and '<script src="/static/plotly.min.js">' in page.text
    bundle = client.get("/static/plotly.min.js")
    assert bundle.status_code == 200 and "plotly.js" in bundle.text[:2000] and len(bundle.content) > 1_000_000
    for path in STATIC.iterdir():   # no CDN or other remote address anywhere in the page
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", path.read_text()), path.name
        assert client.get(f"/static/{path.name}").status_code == 200


def test_the_viewer_reads_the_files_the_run_writes():
    from grpoflow.controller import restart, train_samples
    from grpoflow.controller.metrics import MetricsLogger

    assert watched_run.TRAIN_SAMPLES == train_samples.FILE
    assert watched_run.RESTARTS == restart.RESTARTS_FILE
    assert MetricsLogger("x").path.name == watched_run.METRICS


def test_the_viewer_does_not_import_torch():
    code = "import sys, grpoflow.viewer.server, grpoflow.viewer.watched_run; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_cli_view_of_a_missing_folder_is_one_line(capsys):
    from grpoflow.cli import main

    assert main(["view", "/no/such/run"]) == 2
    assert "run folder '/no/such/run' does not exist" in capsys.readouterr().err
