"""publish_folder (grpoflow serve tinker's saved states) replaces a folder so that a kill -9 at any moment leaves
the old or the new one loadable: replace-then-remove, and recover_folders at the next start puts back an old
folder whose replacement never arrived."""

import os
import shutil
import signal

import pytest

from grpoflow import atomic_folder
from grpoflow.atomic_folder import TMP_PREFIX, damaged_file, publish_folder, recover_folders


def state(text: str):
    def write(tmp):
        tmp.mkdir(parents=True)
        (tmp / "weights.bin").write_text(text * 1000)
    return write


def publish_killed_at(final, step: int) -> None:
    """publish_folder(final, new) in a forked child that SIGKILLs itself just before its `step`-th rename or
    removal (1: set the old folder aside, 2: rename the new one in, 3: remove the old one)."""
    pid = os.fork()
    if pid == 0:  # the child: no cleanup of any kind runs after the kill
        calls = {"n": 0}

        def dying(real):
            def call(*args, **kwargs):
                calls["n"] += 1
                if calls["n"] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)
            return call
        atomic_folder.os.replace = dying(os.replace)        # the child's own copy of the module: gone with it
        atomic_folder.shutil.rmtree = dying(shutil.rmtree)
        try:
            publish_folder(final, state("new"))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.parametrize("step, survivor", [(1, "old"), (2, "old"), (3, "new")])
def test_a_kill_between_the_steps_of_an_overwrite_leaves_a_loadable_state(tmp_path, step, survivor):
    final = tmp_path / "weights" / "s1"
    publish_folder(final, state("old"))
    publish_killed_at(final, step)
    recover_folders(final.parent)                        # what the server does when it starts again
    assert damaged_file(final) is None
    assert (final / "weights.bin").read_text() == survivor * 1000
    assert not list(final.parent.glob(f"{TMP_PREFIX}*"))  # leftovers cleaned


def test_an_overwrite_that_completes_leaves_only_the_new_folder(tmp_path):
    final = tmp_path / "s1"
    publish_folder(final, state("old"))
    publish_folder(final, state("new"))
    assert (final / "weights.bin").read_text() == "new" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s1"]
