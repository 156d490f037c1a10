"""Loading a user's function from `path/to/file.py:function` (reward functions, estimators, losses).

Standard library only, so every part of grpoflow may use it (tests/unit/test_layering.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Callable

# `something.py:function_name`: a user function named by its file instead of a registered name.
_FILE_SPEC = re.compile(r"^(?P<path>.+\.py):(?P<fn>[A-Za-z_][A-Za-z0-9_]*)$")


def is_file_spec(text: object) -> bool:
    return isinstance(text, str) and _FILE_SPEC.match(text) is not None


def load_from_file(spec: str) -> Callable:
    """Import `path/to/file.py` and return its `function`, for a spec `path/to/file.py:function`.

    The file runs as a module (named after its resolved path), so any `@register_*` decorators
    in it run and what they register becomes available by name. Loading the same file again
    reuses the module, so its decorators do not run twice.

    Raises:
        ValueError: the spec is malformed, or the file has no callable `function` (the message
            lists the file's public callables).
        FileNotFoundError: the file does not exist.
    """
    match = _FILE_SPEC.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(
            f"Cannot load {spec!r}: expected 'path/to/file.py:function_name'."
        )
    path = Path(match["path"]).expanduser().resolve()
    fn_name = match["fn"]
    if not path.is_file():
        raise FileNotFoundError(
            f"Cannot load {spec!r}: file {str(path)!r} does not exist "
            f"(relative paths are taken from the working directory {str(Path.cwd())!r})."
        )
    module = _import_file(path)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        public = sorted(
            n for n, obj in vars(module).items()
            if not n.startswith("_") and callable(obj)
            and getattr(obj, "__module__", None) == module.__name__
        )
        raise ValueError(
            f"Cannot load {spec!r}: {str(path)!r} defines no function {fn_name!r}; "
            f"its public callables are {public}."
        )
    return fn


def _import_file(path: Path):
    """Import the file at `path` once, as module `grpoflow_user_<stem>_<hash of path>`."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"grpoflow_user_{stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"Cannot import {str(path)!r} as a Python module.")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # before exec: dataclasses and pickling look it up
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


