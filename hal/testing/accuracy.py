"""The accuracy measure of docs/contract.md: relative Frobenius error against a float64 evaluation."""

from __future__ import annotations

import torch

ACCURACY = 1e-2  # docs/contract.md: ||out - ref|| / ||ref|| against a float64 evaluation


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere makes it infinite, never a pass."""
    diff = (out.double() - ref.double()).norm()
    value = float(diff / ref.double().norm().clamp_min(1e-300))
    return value if value == value else float("inf")
