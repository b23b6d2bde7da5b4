"""The per-call launch decision of the requant, as `kernel.plan()` returns it and `hal select`
prints it: which tile, how many programs, whether rows are shared in a second phase."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import attrs
from hal.backends.requant import tuning
from hal.backends.requant.geometry import legacy_column_blocks, requant_launch_geometry

if TYPE_CHECKING:  # device.py imports torch; a plan is built without it
    from hal.backends.requant.device import DeviceTraits

GEMM_NOTE = "GEMM stages run on backends/reference until a fast W4A8 GEMM exists"


@attrs.frozen
class RequantPlan:
    variant: str  # "tuned" | "legacy"
    hidden: int
    num_experts: int
    max_m: int
    expected_rows: Optional[int]
    tile_elements: int
    g_block: Optional[int]  # scale groups per tile; None for the legacy flat tile
    m_grid: int
    row_cap: int
    second_phase: bool
    streaming: bool
    paired: bool
    column_blocks: int
    num_warps: int
    bytes_per_lane: float
    warp_size: int
    fp8_dtype: str
    traits_source: str

    @property
    def programs(self) -> int:
        return self.column_blocks * self.m_grid * self.num_experts

    def describe(self) -> str:
        if self.variant == "legacy":
            tile = (f"legacy flat tile of {self.tile_elements} elements, scale gathered per element, "
                    f"{self.num_warps} warps ({self.bytes_per_lane:g} B per lane)")
            rows = f"m-grid {self.m_grid} fixed, no row cap"
        else:
            tile = (f"tile [{self.g_block}, {tuning.GROUP_SIZE}] = {self.tile_elements} elements, one "
                    f"scale load per group, {self.num_warps} warps ({self.bytes_per_lane:g} B per lane "
                    f"at warp size {self.warp_size})")
            cap = (f"rows >= {self.row_cap} of any expert shared by all programs in a second phase"
                   if self.second_phase else "no second phase (row cap >= max_m)")
            moves = ("evict-first loads, streaming stores" if self.streaming
                     else "default cache policy") + (", rows two at a time" if self.paired else "")
            rows = f"m-grid {self.m_grid} (expected rows {self.expected_rows}), {cap}; {moves}"
        return (f"requant {self.variant}: {tile}; {rows}; grid {self.column_blocks} x {self.m_grid} x "
                f"{self.num_experts} = {self.programs} programs; output {self.fp8_dtype} "
                f"(warp size and FP8 from {self.traits_source})")


def requant_plan(variant: str, hidden: int, num_experts: int, max_m: int,
                 expected_rows: Optional[int], traits: DeviceTraits) -> RequantPlan:
    fp8 = str(traits.fp8_dtype).replace("torch.", "")
    if variant == "legacy":
        lanes = tuning.LEGACY_WARPS * traits.warp_size
        return RequantPlan("legacy", hidden, num_experts, max_m, expected_rows,
                           tuning.LEGACY_TILE_ELEMENTS, None, tuning.LEGACY_M_GRID, max_m, False,
                           False, False, legacy_column_blocks(hidden), tuning.LEGACY_WARPS,
                           tuning.LEGACY_TILE_ELEMENTS * tuning.FP8_BYTES / lanes, traits.warp_size,
                           fp8, traits.source)
    groups = hidden // tuning.GROUP_SIZE
    geometry = requant_launch_geometry(groups, num_experts, tuning.GROUP_SIZE, expected_rows,
                                       traits.warp_size, max_rows=max_m)
    tile = geometry.g_block * tuning.GROUP_SIZE
    return RequantPlan("tuned", hidden, num_experts, max_m, expected_rows, tile, geometry.g_block,
                       geometry.m_grid, geometry.row_cap, geometry.has_overflow(max_m),
                       geometry.streaming, geometry.paired, geometry.column_blocks(groups),
                       geometry.num_warps,
                       tile * tuning.FP8_BYTES / (geometry.num_warps * traits.warp_size),
                       traits.warp_size, fp8, traits.source)


@attrs.frozen
class MaskedMoEPlan:
    requant: RequantPlan
    live_experts: Optional[int]
    rows: Optional[int]

    def describe(self) -> str:
        live = "" if self.live_experts is None else f"{self.rows} rows on {self.live_experts} live experts; "
        return f"w4afp8 masked MoE: {live}{self.requant.describe()}; {GEMM_NOTE}"
