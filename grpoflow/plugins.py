"""Named registries of pluggable functions, and loading a user's function from `path/to/file.py:function`.

One `Registry` type serves every family: advantage estimators, policy losses, KL estimators and
controllers, loss aggregation modes (grpoflow.algorithms), reward functions (grpoflow.rewards) and
rollout engines (grpoflow.engines.factory). A name is looked up with `resolve`, which also accepts
`path/to/file.py:function`; an unknown name is a ValueError naming the closest valid one.

Standard library only, so every part of grpoflow may use it (tests/unit/test_layering.py).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from grpoflow.errors import UserError, UserFileNotFoundError

# `something.py:function_name`: a user function named by its file instead of a registered name.
_FILE_SPEC = re.compile(r"^(?P<path>.+\.py):(?P<fn>[A-Za-z_][A-Za-z0-9_]*)$")


def is_file_spec(text: object) -> bool:
    return isinstance(text, str) and _FILE_SPEC.match(text) is not None


def load_from_file(spec: str) -> Callable:
    """Import `path/to/file.py` and return its `function`, for a spec `path/to/file.py:function`.

    The file runs as a module (named after its resolved path), so any `@register_*` decorators
    in it run and what they register becomes available by name. Its folder joins `sys.path` (at the end, so it
    shadows nothing), so that it imports the modules beside it as a script would. Loading the same file again
    reuses the module, so its decorators do not run twice.

    Raises:
        ValueError: the spec is malformed, or the file has no callable `function` (the message
            lists the file's public callables).
        FileNotFoundError: the file does not exist.
    """
    match = _FILE_SPEC.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise UserError(
            f"Cannot load {spec!r}: expected 'path/to/file.py:function_name'."
        )
    path = Path(match["path"]).expanduser().resolve()
    fn_name = match["fn"]
    if not path.is_file():
        raise UserFileNotFoundError(
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
        raise UserError(
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
        raise UserError(f"Cannot import {str(path)!r} as a Python module.")
    module = importlib.util.module_from_spec(module_spec)
    folder = str(path.parent)
    if folder not in sys.path:  # as for a script: the modules beside the file import by their names
        sys.path.append(folder)
    sys.modules[module_name] = module  # before exec: dataclasses and pickling look it up
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        del sys.modules[module_name]
        raise UserError(f"Cannot load {str(path)!r}: a syntax error at line {e.lineno}: {e.msg}"
                        f"{f' ({e.text.strip()!r})' if e.text else ''}; fix the file.") from None
    except ImportError as e:  # a module it imports is neither installed nor beside it
        del sys.modules[module_name]
        raise UserError(f"Cannot load {str(path)!r}: {e}. Install that package in this environment, or put the "
                        f"module next to the file (its folder {folder!r} is on the import path).") from None
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


# How many times this process resolved each (kind, name): a run's start-up check resolves every name its config
# holds once and keeps the result (grpoflow/plan/; tests/integration/test_run_plan.py counts).
RESOLVED: Counter[tuple[str, str]] = Counter()


class Registry:
    """A named collection of functions of one family (the `kind`, used in error messages)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(
        self, name: str, *, override: bool = False, **meta: Any
    ) -> Callable[[Callable], Callable]:
        """Decorator storing the function under `name` and returning it unchanged.

        Registering a *different* function under a taken name raises ValueError unless
        `override=True`; registering the same function again only replaces its metadata.
        Keyword `meta` (e.g. `agg_modes=...`) is stored with the name; see `meta`.
        """
        if not isinstance(name, str) or not name:
            raise UserError(f"{self.kind} name must be a non-empty string, got {name!r}.")

        def decorator(fn: Callable) -> Callable:
            existing = self._fns.get(name)
            if existing is not None and existing is not fn and not override:
                raise UserError(
                    f"{self.kind} {name!r} is already registered to {fn_name(existing)}; "
                    f"pick another name or pass override=True to replace it."
                )
            self._fns[name] = fn
            self._meta[name] = dict(meta)
            return fn

        return decorator

    def meta(self, name: str) -> dict[str, Any]:
        """A copy of the metadata registered with `name` ({} if none); ValueError if unknown."""
        self.get(name)
        return dict(self._meta.get(name, {}))

    def resolve(self, name_or_spec: str) -> Callable:
        """`get(name)`, or for `path/to/file.py:function` load the file and return the function.

        A loaded function is registered under the spec string itself (so later `get(spec)`
        finds it), with the metadata of any name the file registered it under in this registry.
        """
        RESOLVED[(self.kind, str(name_or_spec))] += 1
        if not is_file_spec(name_or_spec):
            return self.get(name_or_spec)
        fn = load_from_file(name_or_spec)
        meta = next((self._meta.get(n, {}) for n, f in self._fns.items() if f is fn), {})
        self.register(name_or_spec, override=True, **meta)(fn)
        return fn

    def resolve_key(self, key: str, name_or_spec: str, hint: str = "") -> Callable:
        """`resolve(name_or_spec)` for the config key `key`: a bad name's error starts with `key=value` (and ends with
        `hint`); a missing file.py's FileNotFoundError names the file already and passes as it is."""
        try:
            return self.resolve(name_or_spec)
        except FileNotFoundError:  # UserFileNotFoundError is a ValueError too: its message names the file already
            raise
        except ValueError as e:
            raise UserError(f"{key}={name_or_spec!r}: {e}{hint}") from None

    def get(self, name: str) -> Callable:
        """The function registered under `name`; ValueError with the closest valid name if none."""
        try:
            return self._fns[name]
        except (KeyError, TypeError):
            pass
        valid = [n for n in self.names() if not is_file_spec(n)]  # loaded files are not choices to list
        if not valid:
            raise UserError(f"Unknown {self.kind} {name!r}: no {self.kind}s are registered.")
        closest = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.0)[0]
        raise UserError(
            f"Unknown {self.kind} {name!r}; did you mean {closest!r}? Valid names: {valid}."
        )

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


def fn_name(fn: Callable) -> str:
    """`module.qualname` of a function, for messages."""
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else name
