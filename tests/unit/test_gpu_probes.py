"""bench/gpu_probes.py's utilisation sampler, which only a GPU machine runs for real: fed by a stand-in nvidia-smi
that prints its CSV lines (timestamp, utilisation %, memory used MiB) every 0.1 s, it summarises the samples of a
time window; without nvidia-smi it samples nothing and says so."""

import importlib.util
import os
import stat
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
spec = importlib.util.spec_from_file_location("gpu_probes", BENCH / "gpu_probes.py")
assert spec is not None and spec.loader is not None
gpu_probes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_probes)

# utilisation alternates 25 % and 75 %, memory used grows by 1 GiB a line
FAKE_SMI = """#!/bin/bash
i=0
while true; do
  echo "$(date '+%Y/%m/%d %H:%M:%S.%3N'), $((i % 2 * 50 + 25)), $((1024 * (i + 1)))"
  i=$((i + 1))
  sleep 0.1
done
"""


def test_the_sampler_summarises_the_samples_of_each_window(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sampler = gpu_probes.UtilSampler(tmp_path / "smi.csv")
    try:
        start = time.time()
        time.sleep(1.0)
        window = sampler.window(start, time.time())
        later = sampler.window(time.time() + 60, time.time() + 120)
    finally:
        sampler.stop()
    assert sampler.note == ""
    assert window["util_max"] == 75 and 25 <= window["util_mean"] <= 75 and window["smi_used_gib"] >= 3
    assert later == {}  # no sample in that window


def test_without_nvidia_smi_nothing_is_sampled_and_the_note_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    sampler = gpu_probes.UtilSampler(tmp_path / "smi.csv")
    assert "nvidia-smi not found" in sampler.note and sampler.window(0, time.time()) == {}
    sampler.stop()
