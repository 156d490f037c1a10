"""Every model spec resolves in one place (models/spec.py): folders, built-ins built once, and one clear error naming
the setting for anything else. (.gguf files: tests/unit/test_gguf.py, through the same function.)"""

from pathlib import Path

import pytest

from grpoflow.models.spec import ModelSpecError, is_builtin, model_folder, store_name


def test_a_folder_is_its_absolute_path(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(tiny_model_path).parent)
    assert model_folder(Path(tiny_model_path).name, setting="model.path") == str(Path(tiny_model_path).resolve())


def test_a_builtin_is_built_once_into_its_folder(tmp_path):
    folder = model_folder("builtin:tiny-0.5m", setting="model.path", into=tmp_path / "base_model", seed=3)
    assert folder == str((tmp_path / "base_model").resolve()) and (tmp_path / "base_model" / "config.json").exists()
    stamp = (tmp_path / "base_model" / "model.safetensors").stat().st_mtime_ns
    assert model_folder("builtin:tiny-0.5m", setting="model.path", into=tmp_path / "base_model") == folder
    assert (tmp_path / "base_model" / "model.safetensors").stat().st_mtime_ns == stamp   # reused, not rebuilt
    assert is_builtin("builtin:tiny-4m") and not is_builtin("/models/builtin")
    assert store_name("builtin:tiny-4m", seed=2) == "builtin-tiny-4m-seed2" and store_name("/m/a.Q4.gguf") == "a.Q4"


@pytest.mark.parametrize("spec, kwargs, message", [
    ("/nope/model", {}, "model.path=/nope/model is not a folder; give a local HF model folder, a .gguf file "
                        "(this machine has no model hub)."),
    ("/nope/model", {"into": "x", "also": ", or self"},
     "model.path=/nope/model is not a folder; give a local HF model folder, a .gguf file, builtin:tiny-4m, or self"),
    ("org/name", {"hub_cache": True}, "a name in the local Hugging Face cache"),
    ("builtin:tiny-7b", {"into": "x"}, "model.path=builtin:tiny-7b: unknown built-in; use one of ['builtin:tiny-0.5m'"),
    ("builtin:tiny-4m", {}, "a built-in model is built into a run folder"),
])
def test_anything_else_is_one_message_naming_the_setting(spec, kwargs, message):
    with pytest.raises(ModelSpecError) as e:
        model_folder(spec, setting="model.path", **kwargs)
    assert message in str(e.value)
