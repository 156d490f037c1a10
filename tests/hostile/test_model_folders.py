"""Issue 53, finding 6: a run's model folders are checked before they are reused, and the shipped warm start copies
out of a read-only install.

A `base_model/` whose embedding was scrambled in place was trained from without a word (it was reused whenever a
config.json was there); the warm start's copy out of a 0444 install failed with PermissionError and left a
read-only temporary folder behind. Now base_model/ and sft_model/ are checked against their manifests (SHA-256)
and built again when damaged, and the warm start is copied as plain file contents.
"""

import logging
import os
import stat
from pathlib import Path

from grpoflow.atomic_folder import MANIFEST, damaged_file
from grpoflow.commands.sft import run_sft
from grpoflow.models import warm_start
from grpoflow.models.spec import model_folder


def scramble(path: Path) -> None:
    """Change bytes in the middle of `path` in place (same size: only the checksum can tell)."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        chunk = f.read(64)
        f.seek(-len(chunk), os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in chunk))


def test_a_damaged_base_model_is_built_again(tmp_path, caplog):
    folder = Path(model_folder("builtin:tiny-0.5m", setting="model.path", into=tmp_path / "base_model"))
    weights = folder / "model.safetensors"
    original = weights.read_bytes()
    assert (folder / MANIFEST).exists()
    scramble(weights)
    with caplog.at_level(logging.WARNING, logger="grpoflow.folders"):
        again = model_folder("builtin:tiny-0.5m", setting="model.path", into=tmp_path / "base_model")
    assert Path(again) == folder and weights.read_bytes() == original and damaged_file(folder) is None
    assert any("is damaged (model.safetensors does not match its checksum" in r.getMessage() for r in caplog.records)


def test_a_damaged_copy_of_the_warm_start_is_copied_again(tmp_path):
    folder = Path(model_folder("builtin:tiny-4m-addition", setting="model.path", into=tmp_path / "base_model"))
    weights = next(folder.glob("*.safetensors"))
    original = weights.read_bytes()
    scramble(weights)
    model_folder("builtin:tiny-4m-addition", setting="model.path", into=tmp_path / "base_model")
    assert weights.read_bytes() == original


def test_the_warm_start_copies_out_of_a_read_only_install(tmp_path, monkeypatch):
    install = tmp_path / "install"
    (install / "tiny-4m-addition").mkdir(parents=True)
    for path in warm_start.shipped_folder("builtin:tiny-4m-addition").iterdir():
        (install / "tiny-4m-addition" / path.name).write_bytes(path.read_bytes())
        (install / "tiny-4m-addition" / path.name).chmod(0o444)  # as Nix and some images install package files
    (install / "tiny-4m-addition").chmod(0o555)
    monkeypatch.setattr(warm_start, "WARM_STARTS_DIR", install)
    try:
        folder = Path(warm_start.copy_warm_start("builtin:tiny-4m-addition", tmp_path / "run" / "base_model"))
    finally:
        (install / "tiny-4m-addition").chmod(0o755)
    for path in [folder, *folder.iterdir()]:
        assert path.stat().st_mode & stat.S_IWUSR, f"{path} was copied read-only"
    assert damaged_file(folder) is None and not list((tmp_path / "run").glob(".tmp-*"))


def test_a_damaged_sft_model_is_trained_again(tmp_path, capsys):
    base = model_folder("builtin:tiny-0.5m", setting="model.path", into=tmp_path / "base_model")
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]
    settings = dict(steps=2, lr=1e-3, batch_size=4, compute_dtype="float32")
    out = Path(run_sft(base, rows, tmp_path / "sft_model", **settings))
    weights = out / "model.safetensors"
    scramble(weights)
    run_sft(base, rows, tmp_path / "sft_model", **settings)
    assert damaged_file(out) is None and "is damaged (model.safetensors does not match" in capsys.readouterr().out
