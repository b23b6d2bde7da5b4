"""The requant launch geometry: a pure function of the payload, the expert count, the rows the host
expects and the warp size. No tensor and no device is touched, so it is tested on any machine and
`plan()` can print it before a launch."""

from __future__ import annotations

from typing import Optional

import attrs

from backends.requant import tuning


@attrs.frozen
class RequantGeometry:
    """How the tuned kernel is launched.

    g_block  scale groups per tile: a tile is [g_block, group_size] elements of one row
    m_grid   programs per expert along the row axis
    row_cap  rows per expert handled by that expert's programs; rows at or beyond it are shared by
             every program in a second phase. A cap >= the payload's rows means no second phase.

    Unpacks as the tuple (g_block, m_grid, row_cap)."""

    g_block: int
    m_grid: int
    row_cap: int

    def __iter__(self):
        return iter((self.g_block, self.m_grid, self.row_cap))

    @property
    def num_warps(self) -> int:
        return tuning.TUNED_WARPS

    def column_blocks(self, num_groups: int) -> int:
        return -(-num_groups // self.g_block)

    def has_overflow(self, max_rows: int) -> bool:
        return self.row_cap < max_rows


def pow2_floor(n: int) -> int:
    """The largest power of two <= n, for n >= 1."""
    return 1 << (n.bit_length() - 1)


def _need_int(name: str, value, low: int):
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r} is not allowed: expected an int >= {low}")


def tile_groups(num_groups: int, num_experts: int, group_size: int, warp_size: int) -> int:
    """Scale groups per tile: bytes per lane x lanes per program, in whole groups, a power of two
    (Triton's block shapes are), never wider than the payload."""
    bytes_per_lane = (tuning.BYTES_PER_LANE_WIDE if num_experts >= tuning.WIDE_TILE_MIN_EXPERTS
                      else tuning.BYTES_PER_LANE_NARROW)
    tile_bytes = bytes_per_lane * warp_size * tuning.TUNED_WARPS
    groups = max(1, tile_bytes // (group_size * tuning.FP8_BYTES))
    return min(pow2_floor(groups), pow2_floor(num_groups))


def m_grid_for(num_experts: int, expected_rows: Optional[int], column_blocks: int) -> int:
    """Programs per expert along rows. The dispatcher reports (rows + E) // E, one high at exact
    averages, so the estimate is rounded down to a power of two: rounding up would double the grid
    at every power of two. A grid small enough to be resident at once gets more programs per
    expected row (RESIDENT_PROGRAMS_PER_ROW), so a hot expert's rows spread over them."""
    if expected_rows is None:
        return tuning.M_GRID_MAX
    rows = pow2_floor(max(expected_rows, 1))
    m_grid = min(max(rows, tuning.M_GRID_MIN), tuning.M_GRID_MAX)
    if rows < tuning.SCARCE_ROWS_BELOW:
        budget = pow2_floor(max(tuning.SCARCE_PROGRAM_BUDGET // num_experts, 1))
        m_grid = min(m_grid, max(budget, tuning.M_GRID_MIN))
    if num_experts * tuning.M_GRID_MAX * column_blocks <= tuning.ONE_WAVE_PROGRAMS:
        resident = max(tuning.RESIDENT_PROGRAMS_PER_ROW * rows, tuning.RESIDENT_M_GRID_MIN)
        m_grid = max(m_grid, min(resident, tuning.M_GRID_MAX))
    return m_grid


def requant_launch_geometry(num_groups: int, num_experts: int, group_size: int = tuning.GROUP_SIZE,
                            expected_rows: Optional[int] = None, warp_size: int = 32,
                            max_rows: int = 2**30) -> RequantGeometry:
    """The tuned launch for a payload of `num_groups` scale groups per row over `num_experts`
    experts of at most `max_rows` rows, on a GPU of `warp_size` lanes.

    expected_rows is the host's rows-per-expert estimate, as the dispatcher reports it; None keeps
    the legacy m-grid of 32 and no cap (row_cap = max_rows)."""
    _need_int("num_groups", num_groups, 1)
    _need_int("num_experts", num_experts, 1)
    _need_int("group_size", group_size, 1)
    _need_int("warp_size", warp_size, 1)
    _need_int("max_rows", max_rows, 0)
    if expected_rows is not None:
        _need_int("expected_rows", expected_rows, 0)
    g_block = tile_groups(num_groups, num_experts, group_size, warp_size)
    m_grid = m_grid_for(num_experts, expected_rows, -(-num_groups // g_block))
    if expected_rows is None or num_experts > tuning.OVERFLOW_MAX_EXPERTS:
        row_cap = max_rows
    else:
        row_cap = min(max(tuning.ROW_CAP_SLACK * expected_rows, m_grid), max_rows)
    return RequantGeometry(g_block, m_grid, row_cap)


def legacy_column_blocks(hidden: int) -> int:
    """Column blocks of the legacy launch: flat tiles of LEGACY_TILE_ELEMENTS, the last one masked."""
    return -(-hidden // tuning.LEGACY_TILE_ELEMENTS)
