"""Fixtures of the triton_moe tests: the float64 oracle, the weights they share, and Triton's
interpreter on CPU."""

from __future__ import annotations

import attrs
import pytest
import torch
from hal.backends.reference import ops

from hal.synth import random_expert_map, random_weights
from hal.testing.triton_interpreter import fp8_casts_through_torch


def _oracle(spec, x, topk_weights, topk_ids, weights) -> torch.Tensor:
    """hal.backends.reference in float64: dropped (-1) routes add nothing there too."""
    return ops.moe_tokens(spec, x, topk_weights, topk_ids, weights, compute_dtype=torch.float64)


def _groups(t: torch.Tensor, cols: int) -> torch.Tensor:
    """[rows, cols] -> [rows, groups, 128] float64, zero-padded."""
    return torch.nn.functional.pad(t.double(), (0, (-cols) % 128)).view(t.shape[0], -1, 128)


def _dequantize_groups(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 [rows, cols] times fp32 scales [rows, ceil(cols / 128)] -> float64 [rows, cols]."""
    cols = q.shape[1]
    return (_groups(q, cols) * scale.double()[:, :, None]).view(q.shape[0], -1)[:, :cols]


def _check_e4m3_groups(q, scale, ref, rtol_scale=1e-5):
    """e4m3 q [rows, cols] with scales [rows, groups] against the float64 values they stand for:
    each scale is its 128-column slice's max |value| / 448, that value maps to +-448, and every
    value is within e4m3's rounding (half a unit in the last of 3 mantissa bits: 2^-4 relative;
    2^-10 of the scale below the normal range)."""
    cols = ref.shape[1]
    ref_groups = _groups(ref, cols)
    amax = ref_groups.abs().amax(-1)
    assert torch.allclose(scale.double(), amax / 448, rtol=rtol_scale, atol=0), "scales are not max / 448"
    q_groups = _groups(q, cols)
    assert bool((q_groups.abs().amax(-1) == 448).all()), "a slice's max does not map to 448"
    s = scale.double()[:, :, None]
    rounding = torch.maximum(ref_groups.abs() * 2.0**-4, s * 2.0**-10)
    bound = rounding * (1 + 4 * rtol_scale) + s * 448 * rtol_scale
    assert bool(((q_groups * s - ref_groups).abs() <= bound).all()), "a value is off by more than rounding"


def _oracle_w8a8(spec, x, topk_weights, topk_ids, weights) -> torch.Tensor:
    """The float64 oracle of the same layer with act_quant="fp8_g128": each GEMM's input
    quantized to e4m3 per row and 128 columns, as the w8a8 kernels do."""
    return _oracle(attrs.evolve(spec, act_quant="fp8_g128"), x, topk_weights, topk_ids, weights)


def _weights_for(spec, seed: int, device) -> object:
    w = random_weights(spec, device=device, seed=seed)
    if spec.num_local_experts is not None:
        w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=seed + 1, device=device))
    return w


@pytest.fixture
def oracle():
    return _oracle


@pytest.fixture
def oracle_w8a8():
    return _oracle_w8a8


@pytest.fixture
def e4m3_groups():
    """(check, dequantize) for per-row, per-128-column e4m3 values and their scales."""
    return _check_e4m3_groups, _dequantize_groups


@pytest.fixture
def weights_for():
    return _weights_for


@pytest.fixture(scope="module")
def interpreter():
    """Run the kernels in Triton's interpreter on CPU, fp8 casts rounded by torch."""
    with fp8_casts_through_torch():
        yield
