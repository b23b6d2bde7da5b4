"""A backend's answer to "can you run this spec here?": accepted with notes, or rejected with every
reason, so a user reads all that stands in the way and not only the first.

An accepted verdict may be `explicit_only`: the backend runs the spec, but only when a caller names
it (prefer= or the op's override variable); automatic selection passes over it and the trace says
so. The Triton interpreter on CPU is the case in point: correct, and far too slow to be chosen."""

from __future__ import annotations

import attrs


@attrs.frozen
class Verdict:
    ok: bool
    reasons: tuple = attrs.field(default=(), converter=tuple)  # why not, when ok is False
    notes: tuple = attrs.field(default=(), converter=tuple)  # what it will do, when ok is True
    explicit_only: bool = False  # accepted, but never auto-selected

    @classmethod
    def accept(cls, *notes: str, explicit_only: bool = False) -> Verdict:
        return cls(True, (), notes, explicit_only)

    @classmethod
    def reject(cls, *reasons: str) -> Verdict:
        return cls(False, reasons, ())

    @classmethod
    def from_reasons(cls, reasons, notes=(), *, explicit_only: bool = False) -> Verdict:
        """Accept when `reasons` is empty. Backends collect every failing condition, then call this."""
        reasons = tuple(reasons)
        if reasons:
            return cls(False, reasons, ())
        return cls(True, (), tuple(notes), explicit_only)

    def summary(self) -> str:
        return "; ".join(self.notes if self.ok else self.reasons) or ("ok" if self.ok else "rejected")
