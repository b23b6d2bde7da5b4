"""The summary every side-by-side benchmark prints over its speed ratios: the geometric mean."""

from __future__ import annotations

import math
import statistics


def geomean(ratios) -> float:
    """The geometric mean of the measured ratios. A point that did not run (None or NaN) is left
    out rather than read as a ratio; with none measured the answer is NaN."""
    measured = [r for r in ratios if r is not None and r == r]
    return statistics.geometric_mean(measured) if measured else math.nan
