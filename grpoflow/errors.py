"""The project's own error types for bad input: what `grpoflow` prints as one line instead of a traceback.

A `UserError` says what the user gave that cannot work (a config value, a file or folder, a dataset row, a
reward, tool or environment spec, a model folder, a missing optional extra) and what to change. The CLI prints
its message and exits 2. Any other exception is a bug, in grpoflow or a library under it, and keeps its
traceback, so that it is reported rather than mistaken for a typo.

Each type also subclasses the builtin that such a mistake raised before (`ValueError`, `FileNotFoundError`,
`FileExistsError`, `ImportError`), so code that catches those keeps working. Standard library only: every part
of the package may raise these.
"""

from __future__ import annotations

__all__ = ["MissingExtraError", "UserError", "UserFileExistsError", "UserFileNotFoundError"]


class UserError(ValueError):
    """Bad input from the user; the message names the bad value and the fix."""


class UserFileNotFoundError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist (or lacks what it must hold)."""


class UserFileExistsError(UserError, FileExistsError):
    """A folder the user named for output already holds files that must not be overwritten."""


class MissingExtraError(UserError, ImportError):
    """What the config asks for needs an optional extra that is not installed; the message names the extra."""
