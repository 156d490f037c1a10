"""Issue 36, finding 5: a run with model.compute_dtype=auto resumes with the same command on a machine of another
kind (here: bf16 units, then none, simulated by the cpuinfo the rule reads), in this machine's dtype and with a
warning that says so; any other changed setting is still refused."""

from __future__ import annotations

import logging

import pytest
import yaml

from grpoflow.config import ConfigError
from grpoflow.training import bf16_units
from hostile_runs import metrics, run

WITH_UNITS = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n"
WITHOUT = "processor\t: 0\nflags\t\t: fpu sse avx512f\n"


def on_a_cpu(monkeypatch, tmp_path, flags: str) -> None:
    """This process sees a CPU whose /proc/cpuinfo lists `flags` (and no CUDA device)."""
    cpuinfo = tmp_path / f"cpuinfo-{len(flags)}"
    cpuinfo.write_text(flags)
    real = bf16_units.cpu_has_bf16_units
    monkeypatch.setattr(bf16_units, "cpu_has_bf16_units", lambda path=cpuinfo: real(path))
    monkeypatch.setattr(bf16_units.torch.cuda, "is_available", lambda: False)


def test_auto_resumes_on_a_machine_without_bf16_units(tmp_path, monkeypatch, caplog):
    out = tmp_path / "run"
    on_a_cpu(monkeypatch, tmp_path, WITH_UNITS)
    run(out, "model.compute_dtype=auto", steps=1)
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["compute_dtype"] == "bfloat16"
    on_a_cpu(monkeypatch, tmp_path, WITHOUT)
    with pytest.raises(ConfigError, match=r"actor.lr"):  # another change is still refused
        run(out, "model.compute_dtype=auto", "actor.lr=0.5", steps=2)
    with caplog.at_level(logging.WARNING, logger="grpoflow.run_folder"):
        run(out, "model.compute_dtype=auto", steps=2)  # the same command
    assert [r["step"] for r in metrics(out)] == [1, 2]
    assert any("model.compute_dtype=auto resolves to float32 on this machine" in r.getMessage()
               and "computed in bfloat16" in r.getMessage() and "not promised" in r.getMessage()
               for r in caplog.records)
    assert "compute_dtype: float32" in (out / "checkpoints" / "step_000002" / "config.yaml").read_text()
