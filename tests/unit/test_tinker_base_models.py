"""base_model names of the Tinker server resolve to local models, never to a download."""

import pytest

pytest.importorskip("tinker")

from grpoflow.errors import UserError  # noqa: E402
from grpoflow.tinker_server.models import BaseModels  # noqa: E402


def test_alias_folder_builtin_and_unknown_names(tiny_model_path, tmp_path):
    bases = BaseModels(tmp_path, default_path=tiny_model_path, alias="meta-llama/Llama-3.2-1B")
    aliased = bases.resolve("meta-llama/Llama-3.2-1B")            # the program's hub name -> model.path
    assert aliased.folder == tiny_model_path and aliased.name == "meta-llama/Llama-3.2-1B"
    assert bases.resolve(tiny_model_path).folder == tiny_model_path
    built = bases.resolve("builtin:tiny-0.5m")                    # built once under the root, named by its folder
    assert built.folder.startswith(str(tmp_path)) and built.name == built.folder
    assert (tmp_path / "base_models").is_dir()
    with pytest.raises(UserError, match="base_model=.*is not a folder.*Hugging Face cache"):
        bases.resolve("Qwen/Qwen3-8B")                            # not local, not in the HF cache: refused, offline
    with pytest.raises(UserError, match="unknown built-in"):
        bases.resolve("builtin:tiny-7b")


def test_a_name_in_the_local_hugging_face_cache(tiny_model_path, tmp_path, monkeypatch):
    """A snapshot laid out as the hub cache holds it (models--org--name/snapshots/<rev>, refs/main) is found
    offline."""
    import shutil

    import huggingface_hub.constants as hub

    repo = tmp_path / "hub" / "models--someorg--tiny"
    shutil.copytree(tiny_model_path, repo / "snapshots" / "rev1")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev1")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    found = BaseModels(tmp_path / "root", default_path=tiny_model_path, alias=None).resolve("someorg/tiny")
    assert found.folder == str(repo / "snapshots" / "rev1") and found.name == "someorg/tiny"
