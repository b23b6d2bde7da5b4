"""A backend's answer to "can you run this spec here?": accepted with notes, or rejected with every
reason, so a user reads all that stands in the way and not only the first."""

from __future__ import annotations

import attrs


@attrs.frozen
class Verdict:
    ok: bool
    reasons: tuple = attrs.field(default=(), converter=tuple)  # why not, when ok is False
    notes: tuple = attrs.field(default=(), converter=tuple)  # what it will do, when ok is True

    @classmethod
    def accept(cls, *notes: str) -> Verdict:
        return cls(True, (), notes)

    @classmethod
    def reject(cls, *reasons: str) -> Verdict:
        return cls(False, reasons, ())

    @classmethod
    def from_reasons(cls, reasons, notes=()) -> Verdict:
        """Accept when `reasons` is empty. Backends collect every failing condition, then call this."""
        reasons = tuple(reasons)
        return cls(not reasons, reasons, () if reasons else tuple(notes))

    def summary(self) -> str:
        return "; ".join(self.notes if self.ok else self.reasons) or ("ok" if self.ok else "rejected")
