"""Finding 6: checkpoints damaged in place (same size) are found by their checksums, at resume and at export."""

from __future__ import annotations

import logging
import random
import subprocess
from pathlib import Path

import pytest

from grpoflow.commands.export import export
from hostile_runs import metrics, run

WEIGHTS = Path("actor") / "model.safetensors"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run(out)  # checkpoints step_000002 and step_000003
    return out


def flip_bits(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x10
    path.write_bytes(bytes(data))


def random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


def damaged_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:24] = b"{not json at all"
    path.write_bytes(bytes(data))


def copy_of(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished), str(out)], check=True)
    return out


@pytest.mark.parametrize("damage", [flip_bits, random_bytes, damaged_header])
def test_a_checkpoint_damaged_in_place_is_skipped_and_the_step_redone(finished, tmp_path, damage, caplog):
    out = copy_of(finished, tmp_path)
    damage(out / "checkpoints" / "step_000003" / WEIGHTS)
    with caplog.at_level(logging.WARNING, logger="grpoflow.checkpoint"):
        run(out, steps=3)
    skipped = [r.getMessage() for r in caplog.records if "skipping the checkpoint" in r.getMessage()]
    assert skipped and "step_000003" in skipped[0] and "checksum" in skipped[0], skipped
    assert metrics(out) == metrics(finished)  # step 3 redone from step 2, identically
    redone = (out / "checkpoints" / "step_000003" / WEIGHTS).read_bytes()
    assert redone == (finished / "checkpoints" / "step_000003" / WEIGHTS).read_bytes()


def test_export_never_copies_a_damaged_checkpoint(finished, tmp_path, caplog):
    out = copy_of(finished, tmp_path)
    flip_bits(out / "checkpoints" / "step_000003" / WEIGHTS)
    with pytest.raises(ValueError, match="step_000003 is damaged .*checksum"):
        export(out, tmp_path / "named", step=3)
    with caplog.at_level(logging.WARNING, logger="grpoflow.checkpoint"):
        exported = export(out, tmp_path / "latest")
    assert (exported / "model.safetensors").read_bytes() == \
        (out / "checkpoints" / "step_000002" / WEIGHTS).read_bytes()  # the newest undamaged one
    assert any("step_000003" in r.getMessage() for r in caplog.records)
