"""The launch-geometry contract of the requant (pure function: runs on any CPU)."""

from __future__ import annotations

import pytest
from hal.backends.requant import tuning
from hal.backends.requant.geometry import RequantGeometry, requant_launch_geometry

pytestmark = pytest.mark.cpu

DSV3_GROUPS = 7168 // 128  # 56
K3_GROUPS = 3584 // 128  # 28
EXPERT_COUNTS = (1, 8, 32, 56, 128, 256, 512, 1024, 4096)


def geometry(num_groups=DSV3_GROUPS, num_experts=56, **kw) -> RequantGeometry:
    return requant_launch_geometry(num_groups, num_experts, **kw)


def bytes_per_lane(g: RequantGeometry, warp_size: int) -> float:
    return g.g_block * tuning.GROUP_SIZE * tuning.FP8_BYTES / (g.num_warps * warp_size)


def test_unpacks_as_a_tuple():
    g_block, m_grid, row_cap = geometry(expected_rows=9, max_rows=128)
    assert (g_block, m_grid, row_cap) == tuple(geometry(expected_rows=9, max_rows=128))


def budget(num_experts: int) -> int:
    return 1 << ((tuning.SCARCE_PROGRAM_BUDGET // num_experts or 1).bit_length() - 1)


@pytest.mark.parametrize("num_experts", EXPERT_COUNTS)
def test_m_grid_is_bounded_and_monotone_in_rows(num_experts):
    previous = 0
    for expected_rows in range(0, 2049):
        m_grid = geometry(K3_GROUPS, num_experts, expected_rows=expected_rows).m_grid
        assert min(tuning.M_GRID_MIN, budget(num_experts)) <= m_grid <= tuning.M_GRID_MAX
        assert m_grid >= previous, f"E={num_experts} rows={expected_rows}"
        previous = m_grid


@pytest.mark.parametrize("num_experts", EXPERT_COUNTS)
def test_never_more_programs_than_an_expert_can_have_rows(num_experts):
    for max_rows in (0, 1, 2, 3, 5, 8, 31, 1024):
        for expected_rows in (None, 0, 1, 2, 9, 64, 1024):
            g = geometry(DSV3_GROUPS, num_experts, expected_rows=expected_rows, max_rows=max_rows)
            assert 1 <= g.m_grid <= max(max_rows, 1)


@pytest.mark.parametrize("num_experts", EXPERT_COUNTS)
def test_dispatcher_reporting_one_high_does_not_move_the_grid(num_experts):
    """The dispatcher reports (rows + E) // E: an exact average of 2^k rows arrives as 2^k + 1."""
    for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024):
        exact = geometry(num_experts=num_experts, expected_rows=rows).m_grid
        reported = geometry(num_experts=num_experts, expected_rows=rows + 1).m_grid
        assert reported == exact, f"E={num_experts} rows={rows}"


def test_no_estimate_sizes_the_grid_from_the_payload_rows_and_puts_no_cap():
    for num_experts in (8, 56, 512):
        g = geometry(K3_GROUPS, num_experts, max_rows=128)
        assert g.m_grid == tuning.LEGACY_M_GRID == 32
        assert g.row_cap == 128
        assert not g.has_overflow(128)
        assert geometry(K3_GROUPS, num_experts, max_rows=1).m_grid == 1
    # 512 experts of at most 16 rows: rows are scarce, one program per 4 rows
    assert geometry(DSV3_GROUPS, 512, max_rows=16).m_grid == 16 // tuning.SCARCE_ROWS_PER_PROGRAM


@pytest.mark.parametrize("warp_size", (32, 64))
@pytest.mark.parametrize("num_experts", (1, 8, 31, 32, 56, 256))
def test_bytes_per_lane_hold_across_warp_sizes(warp_size, num_experts):
    want = tuning.BYTES_PER_LANE_WIDE if num_experts >= 32 else tuning.BYTES_PER_LANE_NARROW
    for num_groups in (56, 64, 512):  # payloads wider than any tile
        g = geometry(num_groups, num_experts, expected_rows=16, warp_size=warp_size)
        assert bytes_per_lane(g, warp_size) == want


def test_warp_size_moves_only_the_tile():
    # (The one-wave rule counts column blocks, which a wider tile halves; at 8 experts both warp
    # sizes reach M_GRID_MAX, from 128 experts neither has room.)
    for num_experts in (8, 256):
        for expected_rows in (None, 1, 8, 32, 1024):
            g32 = geometry(num_experts=num_experts, expected_rows=expected_rows, warp_size=32)
            g64 = geometry(num_experts=num_experts, expected_rows=expected_rows, warp_size=64)
            assert (g32.m_grid, g32.row_cap) == (g64.m_grid, g64.row_cap)
            assert g64.g_block == 2 * g32.g_block


@pytest.mark.parametrize("warp_size", (32, 64))
def test_tile_never_exceeds_the_payload(warp_size):
    for num_groups in range(1, 130):
        for num_experts in (8, 56):
            g = geometry(num_groups, num_experts, expected_rows=64, warp_size=warp_size).g_block
            assert 1 <= g <= num_groups
            assert g & (g - 1) == 0, "Triton block shapes are powers of two"


def test_row_cap_is_twice_the_estimate_within_the_payload():
    for max_rows in (0, 1, 8, 128, 4096):
        for expected_rows in (0, 1, 4, 64, 4096):
            cap = geometry(num_experts=64, expected_rows=expected_rows, max_rows=max_rows).row_cap
            assert cap <= max_rows
            assert cap >= min(tuning.ROW_CAP_SLACK * expected_rows, max_rows)
            assert cap >= min(2 * expected_rows, max_rows)


def test_grid_shrinks_while_experts_fill_it_and_lifts_once_rows_carry_the_work():
    scarce = [geometry(num_experts=e, expected_rows=32).m_grid for e in (8, 64, 128, 256, 512)]
    assert scarce == sorted(scarce, reverse=True)
    assert scarce[0] == 32 and scarce[-1] == 32 // tuning.SCARCE_ROWS_PER_PROGRAM
    for num_experts in (8, 128, 512):
        assert geometry(num_experts=num_experts, expected_rows=1024).m_grid == 32
    for num_experts, rows in ((8, 1), (256, 1), (256, 8), (128, 32), (512, 1), (512, 8)):
        g = geometry(num_experts=num_experts, expected_rows=rows + 1)
        assert num_experts * g.m_grid <= max(tuning.SCARCE_PROGRAM_BUDGET,
                                             num_experts * rows // tuning.SCARCE_ROWS_PER_PROGRAM)
    # 512 experts: the budget is 2 programs per expert, below M_GRID_MIN
    assert geometry(DSV3_GROUPS, 512, expected_rows=3).m_grid == 2
    assert geometry(DSV3_GROUPS, 256, expected_rows=3).m_grid == tuning.M_GRID_MIN


def test_a_grid_resident_at_once_gives_programs_for_a_hot_expert():
    # 8 experts x 7168 columns: 8-group tiles, 7 column blocks, 8 x 32 x 7 = 1792 programs
    per_row = tuning.RESIDENT_PROGRAMS_PER_ROW
    assert geometry(DSV3_GROUPS, 8, expected_rows=9, max_rows=64).m_grid == 32
    assert geometry(DSV3_GROUPS, 8, expected_rows=3, max_rows=64).m_grid == 2 * per_row
    for reported in (1, 2, 3):
        g = geometry(DSV3_GROUPS, 8, expected_rows=reported, max_rows=64)
        assert g.m_grid == tuning.RESIDENT_M_GRID_MIN
        assert g.row_cap == g.m_grid  # no more rows than programs: nothing for the shared phase
    # 16 experts: 7 column blocks leave room for 16 programs per expert in one wave, not 32
    assert geometry(DSV3_GROUPS, 16, expected_rows=5, max_rows=64).m_grid == 16
    assert geometry(DSV3_GROUPS, 16, expected_rows=65, max_rows=1024).m_grid == 32
    # 256 experts: the full grid would be 32768 programs; the rows and the scarce budget decide
    assert geometry(DSV3_GROUPS, 256, expected_rows=9).m_grid == tuning.M_GRID_MIN


def test_small_payloads_stream_and_rows_go_two_at_a_time_once_programs_loop():
    g = geometry(DSV3_GROUPS, 8, expected_rows=9, max_rows=64)
    assert g.streaming and not g.paired  # 8 x 9 x 7168 B; one row per program
    big = geometry(DSV3_GROUPS, 512, expected_rows=129, max_rows=129)
    assert not big.streaming and big.paired  # 512 x 129 x 7168 B > STREAMING_MAX_BYTES
    assert geometry(DSV3_GROUPS, 8, expected_rows=513, max_rows=1024).paired  # 16 rows a program
    assert not geometry(DSV3_GROUPS, 8, expected_rows=2, max_rows=1).paired  # one row at most
    # past PAIRED_MAX_EXPERTS only a payload too big to stream, with an estimate, pairs
    many = tuning.PAIRED_MAX_EXPERTS * 2
    assert not geometry(DSV3_GROUPS, many, expected_rows=33, max_rows=64).paired
    assert geometry(DSV3_GROUPS, 512, expected_rows=513, max_rows=1024).paired
    assert not geometry(DSV3_GROUPS, 512, max_rows=1024).paired
    edge = tuning.STREAMING_MAX_BYTES // (DSV3_GROUPS * tuning.GROUP_SIZE)
    assert geometry(DSV3_GROUPS, 1, expected_rows=edge, max_rows=edge).streaming
    assert not geometry(DSV3_GROUPS, 1, expected_rows=edge + 1, max_rows=edge + 1).streaming


def test_very_many_experts_keep_every_row_with_its_expert():
    g = geometry(num_experts=tuning.OVERFLOW_MAX_EXPERTS + 1, expected_rows=2, max_rows=64)
    assert g.row_cap == 64


@pytest.mark.parametrize("bad", [dict(num_groups=0), dict(num_experts=0), dict(warp_size=0),
                                 dict(expected_rows=-1), dict(max_rows=-1), dict(group_size=0),
                                 dict(num_experts=True), dict(expected_rows=2.0)])
def test_bad_arguments_name_themselves(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        geometry(**bad)
