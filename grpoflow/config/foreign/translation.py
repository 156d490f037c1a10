"""What translating another framework's keys gives: our `key=value` pairs and what could not be carried over
(`Translation`), and the size check both translations share. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Translation:
    """Our `key=value` pairs for foreign ones, and what could not be carried over."""
    overrides: list[tuple[str, Any]] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)          # "theirs -> ours" lines
    not_applicable: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)          # values no run can take: one sentence each
    defaults: list[tuple[str, Any]] = field(default_factory=list)  # set only where no layer sets the key

    def set_aside(self, key: str, value: Any, category: str | None, missing: dict[str, str]) -> None:
        """Record a key that sets nothing here: n/a, missing (with why, from `missing`) or unknown (None)."""
        if category == "n/a":
            self.not_applicable.append(key)
        elif category == "missing":
            self.missing.append(f"{key}={value} ({missing[key]})")
        else:
            self.unknown.append(key)

    def note(self, framework: str) -> str:
        """The one-line notes a run prints about the foreign keys it took."""
        lines = []
        if self.renamed:
            lines.append(f"{framework} keys read as grpoflow's: {', '.join(self.renamed)}")
        if self.not_applicable:
            lines.append(f"{framework} keys with nothing to set here (ignored): {', '.join(self.not_applicable)}")
        if self.missing:
            lines.append(f"WARNING: {framework} settings grpoflow does not have (ignored): {', '.join(self.missing)}")
        return "\n".join(lines)



def whole_size(key: str, value: Any, t: Translation, what: str) -> int | None:
    """`value` as a size of 1 or more, or None with a sentence in `t.refused` naming `key` (`what`: its meaning)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    shown = "null" if value is None else value
    t.refused.append(f"{key}={shown} is not a size: {what} must be a whole number of 1 or more.")
    return None
