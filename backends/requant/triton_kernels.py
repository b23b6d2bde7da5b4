"""Triton kernels of the requant: per-token-group FP8 -> per-tensor FP8 on the DeepEP masked layout.

    out[e, r, k] = fp8(clamp((float(x[e, r, k]) * x_scale[e, r, k // 128]) * (1 / output_scale)))

in fp32, in that order, the reciprocal correctly rounded (div_rn): bit-exact with
hal.backends.reference.ops.requant_fp8. Rows at or beyond masked_m[e] are neither read nor written;
masked_m is clamped to [0, max_m] in the kernels, as the reference does.

Only tl APIs present in both Triton 3.6 (the GPU host) and 3.9 (the CPU interpreter runs) are used."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _requant_values(x, scale, inv_output_scale, fp8_max):
    """The arithmetic both kernels share, so tuned and legacy launches write the same bytes."""
    y = (x.to(tl.float32) * scale) * inv_output_scale
    return tl.clamp(y, -fp8_max, fp8_max, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _inverse_output_scale(output_scale_ptr):
    return tl.math.div_rn(1.0, tl.load(output_scale_ptr).to(tl.float32))


@triton.jit
def _live_rows(masked_m, max_m):
    """masked_m clamped to [0, max_m]: check=False skips validation, and a bad count must not move
    a row index outside the expert's max_m rows. Two integer ops per expert, once per program."""
    return tl.minimum(tl.maximum(masked_m, 0), max_m)


@triton.jit
def _load(ptr, mask, MASKED: tl.constexpr, STREAMING: tl.constexpr):
    """STREAMING: read once, so the line is the first the L2 gives up."""
    if MASKED:
        if STREAMING:
            values = tl.load(ptr, mask=mask, other=0.0, eviction_policy="evict_first")
        else:
            values = tl.load(ptr, mask=mask, other=0.0)
    else:
        if STREAMING:
            values = tl.load(ptr, eviction_policy="evict_first")
        else:
            values = tl.load(ptr)
    return values


@triton.jit
def _store(ptr, values, mask, MASKED: tl.constexpr, STREAMING: tl.constexpr):
    """STREAMING: a cache-streaming store (.cs), the output is not read again by this kernel."""
    if MASKED:
        if STREAMING:
            tl.store(ptr, values, mask=mask, cache_modifier=".cs")
        else:
            tl.store(ptr, values, mask=mask)
    else:
        if STREAMING:
            tl.store(ptr, values, cache_modifier=".cs")
        else:
            tl.store(ptr, values)


@triton.jit
def _tile_offsets(expert, row, max_m, hidden, column_block, scale_stride_e, scale_stride_m,
                  scale_stride_g, G_BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """Element offsets of one row's [G_BLOCK, GROUP] tile, its scale offsets, its group indices."""
    groups = column_block * G_BLOCK + tl.arange(0, G_BLOCK)
    columns = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    # int64: E x max_m x hidden passes 2**31 elements at 512 experts x 1024 rows x 7168.
    row_start = (expert.to(tl.int64) * max_m + row) * hidden
    scale_row = expert.to(tl.int64) * scale_stride_e + tl.cast(row, tl.int64) * scale_stride_m
    return row_start + columns, scale_row + groups * scale_stride_g, groups


@triton.jit
def _requant_rows(x_ptr, scale_ptr, out_ptr, expert, row, limit, row_step, max_m, hidden,
                  num_groups, column_block, scale_stride_e, scale_stride_m, scale_stride_g,
                  inv_output_scale, fp8_max, G_BLOCK: tl.constexpr, GROUP: tl.constexpr,
                  HAS_TAIL: tl.constexpr, STREAMING: tl.constexpr, PAIRED: tl.constexpr):
    """One tile of row `row` (G_BLOCK whole scale groups, one scale load per group) and, PAIRED,
    of row `row + row_step` if it is below `limit`: both rows' loads are issued before
    either is used, so two rows are in flight. Both phases of the tuned kernel call this, so a
    row's bytes do not depend on which phase or pairing wrote it."""
    x_offsets, scale_offsets, groups = _tile_offsets(
        expert, row, max_m, hidden, column_block, scale_stride_e, scale_stride_m, scale_stride_g,
        G_BLOCK, GROUP)
    live = groups < num_groups  # constant along a group, so the 128 bytes of a group stay one vector
    x = _load(x_ptr + x_offsets, live[:, None], HAS_TAIL, STREAMING)
    scale = _load(scale_ptr + scale_offsets, live, HAS_TAIL, STREAMING)
    if PAIRED:
        x2_offsets, scale2_offsets, _ = _tile_offsets(
            expert, row + row_step, max_m, hidden, column_block, scale_stride_e, scale_stride_m,
            scale_stride_g, G_BLOCK, GROUP)
        # The row test as a vector along the groups: Triton's interpreter rejects a scalar mask.
        live2 = live & ((groups * 0 + row + row_step) < limit)
        x2 = _load(x_ptr + x2_offsets, live2[:, None], True, STREAMING)
        scale2 = _load(scale_ptr + scale2_offsets, live2, True, STREAMING)
    y = _requant_values(x, scale[:, None], inv_output_scale, fp8_max)
    _store(out_ptr + x_offsets, y.to(out_ptr.dtype.element_ty), live[:, None], HAS_TAIL, STREAMING)
    if PAIRED:
        y2 = _requant_values(x2, scale2[:, None], inv_output_scale, fp8_max)
        _store(out_ptr + x2_offsets, y2.to(out_ptr.dtype.element_ty), live2[:, None], True, STREAMING)


@triton.jit
def requant_tuned_kernel(x_ptr, scale_ptr, masked_m_ptr, output_scale_ptr, out_ptr,
                         num_experts, max_m, hidden, num_groups, row_cap,
                         scale_stride_e, scale_stride_m, scale_stride_g, fp8_max,
                         G_BLOCK: tl.constexpr, GROUP: tl.constexpr, HAS_OVERFLOW: tl.constexpr,
                         EXPERTS_POW2: tl.constexpr, HAS_TAIL: tl.constexpr,
                         STREAMING: tl.constexpr, PAIRED: tl.constexpr):
    """grid = (column blocks, m_grid, experts).

    Phase 1: program (c, p, e) requantizes rows p, p + m_grid, ... below min(masked_m[e], row_cap),
    two at a time when PAIRED.
    Phase 2 (HAS_OVERFLOW): the rows at or beyond row_cap, over all experts, form one flat list
    ordered by expert; the m_grid x experts programs of column block c share it round-robin, last
    m-programs first, and a flat index f goes back to (expert, row) through the prefix sum of
    per-expert overflow counts.
    HAS_TAIL: the last column block is partial (num_groups % G_BLOCK), so group masks are needed.
    STREAMING: evict-first loads and cache-streaming stores."""
    column_block = tl.program_id(0)
    m_program = tl.program_id(1)
    expert = tl.program_id(2)
    m_grid = tl.num_programs(1)
    if HAS_OVERFLOW:
        # Issued first, so its latency hides under phase 1.
        expert_ids = tl.arange(0, EXPERTS_POW2)
        all_rows = _live_rows(tl.load(masked_m_ptr + expert_ids, mask=expert_ids < num_experts,
                                      other=0), max_m)
    rows = _live_rows(tl.load(masked_m_ptr + expert), max_m)
    inv_output_scale = _inverse_output_scale(output_scale_ptr)

    limit = tl.minimum(rows, row_cap)
    if PAIRED:
        for row in tl.range(m_program, limit, 2 * m_grid):
            _requant_rows(x_ptr, scale_ptr, out_ptr, expert, row, limit, m_grid,
                          max_m, hidden, num_groups, column_block, scale_stride_e, scale_stride_m,
                          scale_stride_g, inv_output_scale, fp8_max, G_BLOCK, GROUP, HAS_TAIL,
                          STREAMING, True)
    else:
        for row in tl.range(m_program, limit, m_grid):
            _requant_rows(x_ptr, scale_ptr, out_ptr, expert, row, limit, 0, max_m, hidden,
                          num_groups, column_block, scale_stride_e, scale_stride_m, scale_stride_g,
                          inv_output_scale, fp8_max, G_BLOCK, GROUP, HAS_TAIL, STREAMING, False)

    if HAS_OVERFLOW:
        overflow = tl.maximum(all_rows - row_cap, 0)
        total = tl.sum(overflow, 0)
        # Flat slots go to the highest m-programs of every expert first: those are the ones phase 1
        # left without a row (program p has one only below its expert's rows), so a hot expert's
        # programs do not also take its overflow.
        first = (m_grid - 1 - m_program) * num_experts + expert
        # Most programs have no shared row; they skip the prefix sum and its barriers.
        if first < total:
            ends = tl.cumsum(overflow, 0)  # ends[e]: one past expert e's last flat index
            for flat in tl.range(first, total, m_grid * num_experts):
                before = ends <= flat  # experts whose overflow rows all come before `flat`
                owner = tl.sum(before.to(tl.int32), 0)
                owner_start = tl.max(tl.where(before, ends, 0), 0)
                _requant_rows(x_ptr, scale_ptr, out_ptr, owner, row_cap + (flat - owner_start),
                              max_m, 0, max_m, hidden, num_groups, column_block, scale_stride_e,
                              scale_stride_m, scale_stride_g, inv_output_scale, fp8_max, G_BLOCK,
                              GROUP, HAS_TAIL, STREAMING, False)


@triton.jit
def requant_legacy_kernel(x_ptr, scale_ptr, masked_m_ptr, output_scale_ptr, out_ptr,
                          max_m, hidden, scale_stride_e, scale_stride_m, scale_stride_g, fp8_max,
                          TILE: tl.constexpr, GROUP: tl.constexpr):
    """The legacy launch, kept as the benchmark baseline: grid = (hidden / TILE, 32, experts), a
    flat TILE-element tile and a scale gathered per element. Same arithmetic, same bytes."""
    column_block = tl.program_id(0)
    m_program = tl.program_id(1)
    expert = tl.program_id(2)
    rows = _live_rows(tl.load(masked_m_ptr + expert), max_m)
    inv_output_scale = _inverse_output_scale(output_scale_ptr)
    columns = column_block * TILE + tl.arange(0, TILE)
    live = columns < hidden
    for row in tl.range(m_program, rows, tl.num_programs(1)):
        row_start = (expert.to(tl.int64) * max_m + row) * hidden
        x = tl.load(x_ptr + row_start + columns, mask=live, other=0.0)
        scale_row = expert.to(tl.int64) * scale_stride_e + tl.cast(row, tl.int64) * scale_stride_m
        scale = tl.load(scale_ptr + scale_row + (columns // GROUP) * scale_stride_g, mask=live,
                        other=0.0)
        y = _requant_values(x, scale, inv_output_scale, fp8_max)
        tl.store(out_ptr + row_start + columns, y.to(out_ptr.dtype.element_ty), mask=live)


def experts_pow2(num_experts: int) -> int:
    return triton.next_power_of_2(num_experts)
