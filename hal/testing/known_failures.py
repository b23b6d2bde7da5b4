"""Contract cases the product is known to fail today. Each runs as xfail(strict=True), so the fix
that makes it pass turns it into a failure until its entry here is removed with the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import attrs


@attrs.frozen
class KnownFailure:
    test: str  # the conformance test's function name
    reason: str  # the exact behaviour that breaks the contract
    backends: Optional[frozenset] = None  # None: every backend (the failure is in hal itself)
    where: Optional[Callable] = None  # a predicate on the spec; None: every spec

    def applies(self, test: str, case) -> bool:
        return (test == self.test and (self.backends is None or case.backend in self.backends)
                and (self.where is None or self.where(case.spec)))


KNOWN_FAILURES: tuple = ()


def known_failure(test: str, case) -> Optional[str]:
    """The reason `test` is expected to fail for `case`, or None."""
    for known in KNOWN_FAILURES:
        if known.applies(test, case):
            return known.reason
    return None
