"""bench/ablation.py, bench/ray_vs_local.py and bench/sandbox_call.py run once, small, so they cannot rot (slow
stage).

They call the package the way users do (plain parameters and metrics, no patched globals); a change that breaks
them breaks here, not on the day someone re-measures the README's figures.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}


def bench(script: str, *args: str, timeout: int = 600) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, env=ENV, text=True,
                         capture_output=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_ablation_times_every_variant(tiny_model_path):
    out = bench("ablation.py", "--model", tiny_model_path, "--group-size", "2", "--max-new-tokens", "4",
                "--repeats", "1", "--threads", "1")
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| variant")]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows]
    assert len(names) == 13 and any("shared prompts" in n for n in names) and any("rows kept" in n for n in names)
    assert any("packed" in n for n in names) and any("fp32, grouped attention" in n for n in names)
    for row in rows:  # fastest <= median, both positive milliseconds
        fastest, median = (float(x) for x in row.rstrip(" |").split(" | ")[-2:])
        assert 0 < fastest <= median


def test_ray_vs_local_reports_each_layout(tiny_model_path, tmp_path):
    pytest.importorskip("ray")
    ray_tmp = tempfile.mkdtemp(prefix="gf-rvl-")  # short: Ray's socket paths must stay under 108 bytes
    small = ["data.train_files=[builtin:addition/train]", "data.val_files=[]", "data.prompts_per_step=2",
             "rollout.n=2", "rollout.max_new_tokens=4", f"ray.tmpdir={ray_tmp}"]
    try:
        out = bench("ray_vs_local.py", "--model", tiny_model_path, "--out", str(tmp_path / "runs"), "--steps", "3",
                    "--layouts", "local,ray", *small)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    result = json.loads(out.strip().splitlines()[-1])
    assert [r["layout"] for r in result["rows"]] == ["local", "ray"]
    for r in result["rows"]:
        assert r["s_per_step"] > 0 and 0 <= r["dispatch_share"] < 1
        assert (tmp_path / "runs" / r["layout"] / "metrics.jsonl").exists()


def test_sandbox_call_reports_the_cost_per_call():
    out = bench("sandbox_call.py", "--calls", "3", "--rounds", "1")
    assert out.startswith("start ") and "ms per call by round" in out and out.rstrip().endswith(" ms")
