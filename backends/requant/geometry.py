"""The requant launch geometry: a pure function of the payload, the expert count, the rows the host
expects and the warp size. No tensor and no device is touched, so it is tested on any machine and
`plan()` can print it before a launch."""

from __future__ import annotations

from typing import Optional

import attrs
from hal.backends.requant import tuning


@attrs.frozen
class RequantGeometry:
    """How the tuned kernel is launched.

    g_block    scale groups per tile: a tile is [g_block, group_size] elements of one row
    m_grid     programs per expert along the row axis
    row_cap    rows per expert handled by that expert's programs; rows at or beyond it are shared by
               every program in a second phase. A cap >= the payload's rows means no second phase.
    streaming  loads evict-first and stores cache-streaming (.cs): what a small payload gains
    paired     a program's rows two at a time, both rows' loads in flight together

    Unpacks as the tuple (g_block, m_grid, row_cap); streaming and paired never change the bytes."""

    g_block: int
    m_grid: int
    row_cap: int
    streaming: bool = False
    paired: bool = False

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


def m_grid_for(num_experts: int, expected_rows: Optional[int], column_blocks: int,
               max_rows: int) -> int:
    """Programs per expert along rows. The estimate is the dispatcher's rows per expert, reported
    as (rows + E) // E, one high at exact averages, so it is rounded down to a power of two
    (rounding up would double the grid at every power of two); without one, the rows the payload
    holds per expert (max_rows) bound every expert's rows and stand in for it. Never more programs
    than an expert can have rows."""
    estimate = max_rows if expected_rows is None else expected_rows
    rows = pow2_floor(max(estimate, 1))
    m_grid = min(max(rows, tuning.M_GRID_MIN), tuning.M_GRID_MAX)
    if rows < tuning.SCARCE_ROWS_BELOW:
        budget = pow2_floor(max(tuning.SCARCE_PROGRAM_BUDGET // num_experts, 1))
        m_grid = min(m_grid, max(budget, rows // tuning.SCARCE_ROWS_PER_PROGRAM))
    resident = pow2_floor(max(tuning.ONE_WAVE_PROGRAMS // (num_experts * column_blocks), 1))
    if expected_rows is not None and resident > m_grid:
        # Programs that fit in the one wave cost nothing while they wait: a hot expert's rows
        # spread over them.
        wanted = max(tuning.RESIDENT_PROGRAMS_PER_ROW * rows, tuning.RESIDENT_M_GRID_MIN)
        m_grid = max(m_grid, min(wanted, tuning.M_GRID_MAX, resident))
    return max(1, min(m_grid, max_rows))


def streams(num_experts: int, estimate: int, num_groups: int, group_size: int) -> bool:
    """Cache hints pay while the payload is small: its live FP8 bytes (one way) at the estimate."""
    return num_experts * estimate * num_groups * group_size * tuning.FP8_BYTES <= tuning.STREAMING_MAX_BYTES


def requant_launch_geometry(num_groups: int, num_experts: int, group_size: int = tuning.GROUP_SIZE,
                            expected_rows: Optional[int] = None, warp_size: int = 32,
                            max_rows: int = 2**30) -> RequantGeometry:
    """The tuned launch for a payload of `num_groups` scale groups per row over `num_experts`
    experts of at most `max_rows` rows, on a GPU of `warp_size` lanes.

    expected_rows is the host's rows-per-expert estimate, as the dispatcher reports it; None sizes
    the grid from max_rows and puts no cap (row_cap = max_rows)."""
    _need_int("num_groups", num_groups, 1)
    _need_int("num_experts", num_experts, 1)
    _need_int("group_size", group_size, 1)
    _need_int("warp_size", warp_size, 1)
    _need_int("max_rows", max_rows, 0)
    if expected_rows is not None:
        _need_int("expected_rows", expected_rows, 0)
    g_block = tile_groups(num_groups, num_experts, group_size, warp_size)
    m_grid = m_grid_for(num_experts, expected_rows, -(-num_groups // g_block), max_rows)
    if expected_rows is None or num_experts > tuning.OVERFLOW_MAX_EXPERTS:
        row_cap = max_rows
    else:
        row_cap = min(max(tuning.ROW_CAP_SLACK * expected_rows, m_grid), max_rows)
    estimate = max_rows if expected_rows is None else min(expected_rows, max_rows)
    streaming = streams(num_experts, estimate, num_groups, group_size)
    loops = estimate >= tuning.PAIRED_ROWS_PER_PROGRAM * m_grid
    paired = loops and (num_experts <= tuning.PAIRED_MAX_EXPERTS
                        or (expected_rows is not None and not streaming))
    return RequantGeometry(g_block, m_grid, row_cap, streaming=streaming, paired=paired)


def legacy_column_blocks(hidden: int) -> int:
    """Column blocks of the legacy launch: flat tiles of LEGACY_TILE_ELEMENTS, the last one masked."""
    return -(-hidden // tuning.LEGACY_TILE_ELEMENTS)
