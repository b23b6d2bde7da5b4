"""Collects one caps section's values together with where each came from, or why it is missing.

Every probe step runs inside `attempt(...)`: an exception there becomes the reason for each field the
step would have filled, so a failing step costs only its own fields and the probe never raises."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs


class Findings:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.unknown: dict[str, str] = {}

    def found(self, name: str, value: Any, source: str) -> None:
        """Record a value. A None value is not a finding: call `missing` for it."""
        if value is None:
            return
        self.values[name] = value
        self.sources[name] = source
        self.unknown.pop(name, None)

    def missing(self, name: str, reason: str) -> None:
        """Say why a field is unknown, unless an earlier step already found it."""
        if name not in self.values:
            self.unknown.setdefault(name, reason)

    def has(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    @contextmanager
    def attempt(self, *names: str) -> Iterator[None]:
        """Run one probe step; if it raises, each of `names` not yet found gets the error as reason."""
        try:
            yield
        except Exception as exc:  # the probe never raises: the failure becomes data
            reason = f"{type(exc).__name__}: {exc}"
            for name in names:
                self.missing(name, reason)

    def fields_of(self, cls) -> dict[str, Any]:
        """The found values that are fields of attrs class `cls` (dotted sub-field names excluded)."""
        names = {f.name for f in attrs.fields(cls)}
        return {k: v for k, v in self.values.items() if k in names}
