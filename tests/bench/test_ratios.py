"""The geometric mean the side-by-side benchmarks print: points that did not run stay out of it."""

import math

import pytest

from hal.bench.ratios import geomean

pytestmark = pytest.mark.cpu


def test_geomean_of_measured_ratios():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.5, 2.0, 1.0]) == pytest.approx(1.0)


def test_points_that_did_not_run_are_left_out():
    assert geomean([None, 2.0, float("nan"), 8.0]) == pytest.approx(4.0)
    assert math.isnan(geomean([None, float("nan")]))
    assert math.isnan(geomean([]))
