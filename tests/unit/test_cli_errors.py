"""The CLI prints the project's own user errors as one line (exit 2) and lets every other exception through with
its traceback, so that a bug in grpoflow is never shown as if the user had made a typo."""

import pytest

from grpoflow import cli
from grpoflow.commands import evaluate as evaluate_module
from grpoflow.commands import export as export_module
from grpoflow.errors import MissingExtraError, UserError, UserFileExistsError, UserFileNotFoundError


def test_a_config_typo_is_one_line(capsys):
    assert cli.main(["config", "actor.lrr=1e-4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpoflow config: error: ") and "Did you mean `actor.lr`" in err and "Traceback" not in err


def test_a_missing_run_folder_is_one_line(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "grpoflow export: error: " in err and "has no checkpoint" in err


def test_a_plot_of_a_folder_without_metrics_is_one_line(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("error", [KeyError("step"), ValueError("shapes [4, 3] and [4, 2]"),
                                   FileNotFoundError("/tmp/x"), ImportError("cannot import name 'y'")])
def test_an_internal_error_keeps_its_traceback(tmp_path, monkeypatch, error):
    """Builtin exceptions raised inside a command are bugs, not user errors: they propagate out of main()
    (and so print their traceback), whatever builtin type they have."""
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(export_module, "export", broken)
    with pytest.raises(type(error)) as raised:
        cli.main(["export", str(tmp_path), "--out", str(tmp_path / "out")])
    assert raised.value is error


@pytest.mark.parametrize("error", [KeyError("val/acc"), ValueError("a shape bug"), ImportError("circular import")])
def test_an_internal_error_of_a_config_command_keeps_its_traceback(monkeypatch, error):
    """The same for the commands that take a config (train, sft, eval, serve): only the project's types are
    caught there."""
    def broken(cfg):
        raise error

    monkeypatch.setattr(evaluate_module, "evaluate", broken)
    with pytest.raises(type(error)) as raised:
        cli.main(["eval", "rollout.n=2"])
    assert raised.value is error


def test_a_user_error_raised_inside_a_command_is_one_line(tmp_path, monkeypatch, capsys):
    def refuses(*args, **kwargs):
        raise UserError("--out is taken; give a new folder.")

    monkeypatch.setattr(export_module, "export", refuses)
    assert cli.main(["export", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "grpoflow export: error: --out is taken; give a new folder.\n"


def test_the_user_error_kinds_keep_their_builtin_types():
    """Code that caught the builtin a mistake used to raise still catches it."""
    assert issubclass(UserError, ValueError)
    assert issubclass(UserFileNotFoundError, FileNotFoundError) and issubclass(UserFileNotFoundError, UserError)
    assert issubclass(UserFileExistsError, FileExistsError) and issubclass(UserFileExistsError, UserError)
    assert issubclass(MissingExtraError, ImportError) and issubclass(MissingExtraError, UserError)
    assert str(UserFileNotFoundError("model.path=/m is not a folder")) == "model.path=/m is not a folder"
