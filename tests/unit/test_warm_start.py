"""The shipped warm start `make train` begins from (models/warm_start.py): it resolves like any built-in, is not
warm-started again, answers the held-out additions as docs/performance.md says ("The default job"), and `ship` writes
what it loads."""

import json
import shutil

import torch

from grpoflow.commands.evaluate import evaluate
from grpoflow.commands.run import sft_steps
from grpoflow.config import BUILTIN_RECIPE, config_layers, load_config
from grpoflow.models.loading import load_causal_lm
from grpoflow.models.spec import model_folder
from grpoflow.models.warm_start import PROVENANCE, SFT_MARKER, ship, shipped_folder

SPEC = "builtin:tiny-4m-addition"


def test_the_default_job_starts_from_the_shipped_warm_start_without_warm_starting_again():
    cfg = load_config(None, [])
    assert cfg.model.path == SPEC and config_layers(None, []) == [BUILTIN_RECIPE]
    assert sft_steps(cfg) == 0 and cfg.trainer.total_steps == 300
    assert sft_steps(load_config(None, ["model.path=builtin:tiny-4m"])) == 400   # built from scratch: as before


def test_it_is_copied_into_the_run_once_and_is_the_package_folder_elsewhere(tmp_path):
    into = tmp_path / "base_model"
    folder = model_folder(SPEC, setting="model.path", into=into)
    assert folder == str(into.resolve()) and [p.name for p in tmp_path.iterdir()] == ["base_model"]  # no temp left
    assert (into / "model.safetensors").read_bytes() == (shipped_folder(SPEC) / "model.safetensors").read_bytes()
    mtime = (into / "model.safetensors").stat().st_mtime_ns
    model_folder(SPEC, setting="model.path", into=into)  # a run's own copy is reused on resume while it is whole
    assert (into / "model.safetensors").stat().st_mtime_ns == mtime
    (into / "model.safetensors").write_bytes(b"damaged")  # and copied again once it no longer matches its manifest
    model_folder(SPEC, setting="model.path", into=into)
    assert (into / "model.safetensors").read_bytes() == (shipped_folder(SPEC) / "model.safetensors").read_bytes()
    assert model_folder(SPEC, setting="model.path") == str(shipped_folder(SPEC))


def test_the_shipped_weights_answer_about_a_third_of_the_held_out_additions():
    """`grpoflow eval` with no arguments: the shipped warm start, greedy, on the built-in task's 500 held-out
    problems. 36.4% where it was made (docs/performance.md, "The default job"); the weights are fixed, so only the
    last bits of a CPU's float kernels can move a greedy answer. A damaged file or a changed tokenizer or task
    falls far outside."""
    metrics = evaluate(load_config(None, []))
    assert 0.32 <= metrics["val/mean@1"] <= 0.42, metrics


def test_ship_stores_bfloat16_that_loads_as_float32_and_says_how_it_was_made(tiny_model_path, tmp_path):
    made = shutil.copytree(tiny_model_path, tmp_path / "sft_model")
    (made / SFT_MARKER).write_text(json.dumps({"model_path": "/somewhere/base_model", "steps": 900}))
    dest = ship(made, tmp_path / "shipped", note="stopped after 600 steps")
    original, shipped = load_causal_lm(made), load_causal_lm(dest)
    for (name, a), (_, b) in zip(original.state_dict().items(), shipped.state_dict().items()):
        assert b.dtype == torch.float32 and torch.equal(b, a.to(torch.bfloat16).float()), name
    provenance = json.loads((dest / PROVENANCE).read_text())
    # the warm start's settings without the machine's own path, and what the maker noted
    assert provenance["sft_settings"] == {"steps": 900} and provenance["note"] == "stopped after 600 steps"
    size = (dest / "model.safetensors").stat().st_size
    assert size < 0.6 * (made / "model.safetensors").stat().st_size
