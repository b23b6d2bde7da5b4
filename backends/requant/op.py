"""The requant op: validate, choose the launch, run the Triton kernel."""

from __future__ import annotations

from typing import Optional, Union

import torch
from hal.backends.requant import triton_kernels, tuning
from hal.backends.requant.device import DeviceTraits, device_traits
from hal.backends.requant.geometry import RequantGeometry, legacy_column_blocks, requant_launch_geometry

from hal.caps import GpuCaps
from hal.inputs import check_masked_inputs, check_requant_args, require

GEOMETRIES = ("tuned", "legacy")


def _check(x, x_scale, masked_m, output_scale, out, expected_rows, geometry, warp_size,
           traits: DeviceTraits):
    require(x.dim() == 3,
            f"x has shape {tuple(getattr(x, 'shape', ()))}: expected (experts, max_m, hidden)")
    hidden = x.shape[2]
    require(hidden % tuning.GROUP_SIZE == 0,
            f"x has hidden size {hidden}: expected a multiple of {tuning.GROUP_SIZE}")
    check_masked_inputs(x.shape[0], hidden, x.device, x, x_scale, masked_m, expected_rows)
    check_requant_args(x, output_scale, out, traits.fp8_dtype, f"this device's FP8 ({traits.source})")
    require(isinstance(geometry, RequantGeometry) or geometry in GEOMETRIES,
            f"geometry={geometry!r} is not allowed: expected 'tuned', 'legacy' or a RequantGeometry")
    if isinstance(geometry, RequantGeometry):
        g = geometry.g_block
        require(g >= 1 and g & (g - 1) == 0, f"geometry.g_block={g}: expected a power of two")
        require(geometry.m_grid >= 1, f"geometry.m_grid={geometry.m_grid}: expected >= 1")
        require(geometry.row_cap >= 0, f"geometry.row_cap={geometry.row_cap}: expected >= 0")
    require(warp_size is None or (isinstance(warp_size, int) and warp_size > 0
                                  and warp_size & (warp_size - 1) == 0),
            f"warp_size={warp_size!r} is not allowed: expected None or a power of two")


def resolve_geometry(geometry, num_groups: int, num_experts: int, max_m: int,
                     expected_rows: Optional[int], warp_size: int) -> Union[RequantGeometry, str]:
    if geometry == "tuned":
        return requant_launch_geometry(num_groups, num_experts, tuning.GROUP_SIZE, expected_rows,
                                       warp_size, max_rows=max_m)
    return geometry


def fp8_per_token_to_per_tensor(x: torch.Tensor, x_scale: torch.Tensor, masked_m: torch.Tensor,
                                output_scale: torch.Tensor, out: Optional[torch.Tensor] = None,
                                expected_rows: Optional[int] = None,
                                geometry: Union[str, RequantGeometry] = "tuned",
                                warp_size: Optional[int] = None, *, gpu: Optional[GpuCaps] = None,
                                check: bool = True) -> torch.Tensor:
    """Per-token-group FP8 [E, max_m, hidden] (x_scale fp32 [E, max_m, hidden/128], row- or
    column-major in its last two dims) -> per-tensor FP8 with the static fp32 `output_scale`,
    saturating at the device FP8's max. Rows at or beyond masked_m[e] are neither read nor written.

    expected_rows  the host's rows-per-expert estimate, as the dispatcher reports it; sizes the
                   m-grid and the row cap. None keeps the legacy m-grid of 32 and no cap.
    geometry       "tuned", "legacy" (the legacy launch, the benchmark baseline) or an explicit
                   RequantGeometry (tests sweep these; the bytes never depend on it).
    warp_size      overrides the warp size of hal's capabilities for this device.
    gpu            the GpuCaps to take warp size and FP8 encoding from; default hal.probe().
    check          False skips validation (and its host syncs) on hot paths."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    traits = device_traits(x.device, gpu)
    if check:
        _check(x, x_scale, masked_m, output_scale, out, expected_rows, geometry, warp_size, traits)
    if out is None:
        out = torch.empty(x.shape, dtype=traits.fp8_dtype, device=x.device)
    num_experts, max_m, hidden = x.shape
    if num_experts == 0 or max_m == 0 or hidden == 0:
        return out
    num_groups = hidden // tuning.GROUP_SIZE
    scale_strides = x_scale.stride()
    launch = resolve_geometry(geometry, num_groups, num_experts, max_m, expected_rows,
                              warp_size or traits.warp_size)
    if launch == "legacy":
        grid = (legacy_column_blocks(hidden), tuning.LEGACY_M_GRID, num_experts)
        triton_kernels.requant_legacy_kernel[grid](
            x, x_scale, masked_m, output_scale, out, max_m, hidden, *scale_strides, traits.fp8_max,
            TILE=tuning.LEGACY_TILE_ELEMENTS, GROUP=tuning.GROUP_SIZE, num_warps=tuning.LEGACY_WARPS)
        return out
    row_cap = min(launch.row_cap, max_m)
    grid = (launch.column_blocks(num_groups), launch.m_grid, num_experts)
    overflow = launch.has_overflow(max_m)
    triton_kernels.requant_tuned_kernel[grid](
        x, x_scale, masked_m, output_scale, out, num_experts, max_m, hidden, num_groups, row_cap,
        *scale_strides, traits.fp8_max, G_BLOCK=launch.g_block, GROUP=tuning.GROUP_SIZE,
        HAS_OVERFLOW=overflow,
        # Without a second phase the expert count must not force a recompile per model.
        EXPERTS_POW2=triton_kernels.experts_pow2(num_experts) if overflow else 1,
        HAS_TAIL=num_groups % launch.g_block != 0, STREAMING=launch.streaming,
        PAIRED=launch.paired, num_warps=launch.num_warps)
    return out
