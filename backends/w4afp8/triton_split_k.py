"""The grid of the transposed W4AFP8 GEMMs (triton_decode.py, triton_planes.py) and how K is split
over it: grid = (n-blocks x SPLIT_K, m-programs, experts). Each m-program's first m-block (below
`split_blocks`) is split into SPLIT_K programs over the K groups; a hot expert's later m-blocks are
walked by split 0 alone over all of K. The splits of a tile count themselves in on its counter, and
the last to arrive owns the sums; how the partials meet (fp32 atomics into one slot, or a slot per
split summed in order) is each GEMM family's own."""

from __future__ import annotations

import triton
import triton.language as tl


def grid(m_programs: int, n: int, block_n: int, experts: int, split_k: int = 1) -> tuple:
    return (triton.cdiv(n, block_n) * split_k, m_programs, experts)


def split_tiles(experts: int, m_programs: int, n: int, block_n: int) -> int:
    """Tiles whose K splits count themselves in: one per (expert, m-program's first m-block,
    n-block)."""
    return experts * m_programs * triton.cdiv(n, block_n)


@triton.jit
def _program(SPLIT_K: tl.constexpr):
    """(n-block, K split, n-blocks, m-program, expert) of this program."""
    n_block = tl.program_id(0) // SPLIT_K
    split = tl.program_id(0) % SPLIT_K
    return n_block, split, tl.num_programs(0) // SPLIT_K, tl.program_id(1), tl.program_id(2)


@triton.jit
def _parts(m_block, split_blocks, SPLIT_K: tl.constexpr):
    """How many programs split m_block's K: SPLIT_K for an m-program's first m-block, else one."""
    return tl.where(m_block < split_blocks, SPLIT_K, 1)


@triton.jit
def _groups(split, parts, groups):
    """[first, end) of the K groups split `split` of `parts` walks."""
    return split * groups // parts, (split + 1) * groups // parts


@triton.jit
def _tile(expert, m_block, n_block, split_blocks, n_blocks):
    """The counter (and workspace) index of a split tile."""
    return (expert * split_blocks + m_block) * n_blocks + n_block


@triton.jit
def _arrive(counter_ptr, tile, parts):
    """Count this K split in; True for the last of `parts` to arrive, which then owns the sums."""
    tl.debug_barrier()  # every thread's partial sums are written before the count is
    return tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel") == parts - 1
