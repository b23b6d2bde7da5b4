"""The two bookends of the fused MoE: routes grouped into expert blocks before the GEMMs, and the
top-k sum after them. Both are one Triton launch each, read routing only from device memory and
never sync with the host, so a whole layer can be captured in a CUDA graph."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts,
                 LOCAL_EXPERTS: tl.constexpr, HAS_MAP: tl.constexpr):
    """The local expert of each route, or -1 for a dropped route (-1 id, an id outside
    [0, num_experts), or an expert on another rank). Never reads outside topk_ids or expert_map."""
    ids = tl.load(topk_ids_ptr + route, mask=route < num_routes, other=-1).to(tl.int32)
    routed = (ids >= 0) & (ids < num_experts)
    if HAS_MAP:
        # The address is clamped as well as masked: a dropped id never forms a pointer outside.
        expert = tl.load(expert_map_ptr + tl.where(routed, ids, 0), mask=routed, other=-1)
    else:
        expert = tl.where(routed, ids, -1)
    return tl.where((expert >= 0) & (expert < LOCAL_EXPERTS), expert, -1)


@triton.jit
def align_routes_kernel(topk_ids_ptr, expert_map_ptr, sorted_routes_ptr, block_expert_ptr, cursor_ptr,
                        counter_ptr, num_routes, num_experts, max_padded, max_blocks, num_counters,
                        LOCAL_EXPERTS: tl.constexpr, BINS: tl.constexpr, BLOCK_M: tl.constexpr,
                        CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr, HAS_MAP: tl.constexpr,
                        ZERO_COUNTERS: tl.constexpr):
    """One program: align_routes; with ZERO_COUNTERS also the GEMMs' K-split counters
    (split_k.py), which saves the call a memset launch."""
    align_routes(topk_ids_ptr, expert_map_ptr, sorted_routes_ptr, block_expert_ptr, cursor_ptr, num_routes,
                 num_experts, max_padded, max_blocks, LOCAL_EXPERTS, BINS, BLOCK_M, CHUNK, BLOCK_CHUNK,
                 HAS_MAP)
    if ZERO_COUNTERS:
        lanes = tl.arange(0, CHUNK)
        for start in range(0, num_counters, CHUNK):
            tl.store(counter_ptr + start + lanes, tl.zeros([CHUNK], dtype=tl.int32),
                     mask=start + lanes < num_counters)


@triton.jit
def align_routes(topk_ids_ptr, expert_map_ptr, sorted_routes_ptr, block_expert_ptr, cursor_ptr,
                 num_routes, num_experts, max_padded, max_blocks,
                 LOCAL_EXPERTS: tl.constexpr, BINS: tl.constexpr, BLOCK_M: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr, HAS_MAP: tl.constexpr):
    """One program's work. Routes (token * top_k + slot) are grouped by local expert into runs padded to
    BLOCK_M; sorted_routes holds the route of each padded row (num_routes for a pad row) and
    block_expert the expert of each BLOCK_M block (-1 past the last used block). BINS > the local
    experts: the last bins count dropped routes. The order of routes within an expert's run is
    whatever the atomics give; each row's result depends on its own route only, so the output
    does not."""
    bins = tl.arange(0, BINS)
    lanes = tl.arange(0, CHUNK)
    # Pass 1: routes per expert.
    counts = tl.zeros([BINS], dtype=tl.int32)
    for start in range(0, num_routes, CHUNK):
        expert = local_expert(topk_ids_ptr, expert_map_ptr, start + lanes, num_routes, num_experts,
                              LOCAL_EXPERTS, HAS_MAP)
        counts += tl.histogram(tl.where(expert >= 0, expert, LOCAL_EXPERTS), BINS)
    blocks = tl.where(bins < LOCAL_EXPERTS, (counts + BLOCK_M - 1) // BLOCK_M, 0)
    block_end = tl.cumsum(blocks, axis=0)  # inclusive: the first block after each expert's run
    used_blocks = tl.sum(blocks, axis=0)
    tl.store(cursor_ptr + bins, (block_end - blocks) * BLOCK_M)  # each expert's first padded row
    # The owner of block b is the number of experts whose run ends at or before b.
    block_lanes = tl.arange(0, BLOCK_CHUNK)
    for start in range(0, max_blocks, BLOCK_CHUNK):
        block = start + block_lanes
        owner = tl.sum((block_end[None, :] <= block[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + block, tl.where(block < used_blocks, owner, -1),
                 mask=block < max_blocks)
    for start in range(0, max_padded, CHUNK):
        row = start + lanes
        tl.store(sorted_routes_ptr + row, tl.zeros([CHUNK], dtype=tl.int32) + num_routes,
                 mask=row < max_padded)
    # The cursors and pad rows above are read and overwritten below by other threads.
    tl.debug_barrier()
    # Pass 2: each route takes the next row of its expert's run.
    for start in range(0, num_routes, CHUNK):
        route = start + lanes
        expert = local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts,
                              LOCAL_EXPERTS, HAS_MAP)
        live = expert >= 0
        row = tl.atomic_add(cursor_ptr + tl.where(live, expert, 0), 1, mask=live)
        tl.store(sorted_routes_ptr + row, route, mask=live)


@triton.jit
def count_routes_kernel(topk_ids_ptr, expert_map_ptr, counts_ptr, sorted_routes_ptr, num_routes,
                        num_experts, max_padded, LOCAL_EXPERTS: tl.constexpr, BINS: tl.constexpr,
                        CHUNK: tl.constexpr, HAS_MAP: tl.constexpr):
    """Many routes, first of two launches: count_routes, a program each."""
    count_routes(tl.program_id(0), tl.num_programs(0), topk_ids_ptr, expert_map_ptr, counts_ptr,
                 sorted_routes_ptr, num_routes, num_experts, max_padded, LOCAL_EXPERTS, BINS, CHUNK, HAS_MAP)


@triton.jit
def count_routes(pid, programs, topk_ids_ptr, expert_map_ptr, counts_ptr, sorted_routes_ptr, num_routes,
                 num_experts, max_padded, LOCAL_EXPERTS: tl.constexpr, BINS: tl.constexpr,
                 CHUNK: tl.constexpr, HAS_MAP: tl.constexpr):
    """Program pid of `programs` counts its CHUNK of routes per expert into its own row of counts
    [programs, BINS] (no atomics, nothing to zero) and fills its share of sorted_routes with the
    pad value."""
    lanes = tl.arange(0, CHUNK)
    expert = local_expert(topk_ids_ptr, expert_map_ptr, pid * CHUNK + lanes, num_routes, num_experts,
                          LOCAL_EXPERTS, HAS_MAP)
    counts = tl.histogram(tl.where(expert >= 0, expert, LOCAL_EXPERTS), BINS)
    tl.store(counts_ptr + pid * BINS + tl.arange(0, BINS), counts)
    for start in range(pid * CHUNK, max_padded, programs * CHUNK):
        row = start + lanes
        tl.store(sorted_routes_ptr + row, tl.zeros([CHUNK], dtype=tl.int32) + num_routes,
                 mask=row < max_padded)


@triton.jit
def scatter_routes_kernel(topk_ids_ptr, expert_map_ptr, counts_ptr, cursor_ptr, sorted_routes_ptr,
                          block_expert_ptr, num_routes, num_experts, max_blocks,
                          LOCAL_EXPERTS: tl.constexpr, BINS: tl.constexpr, BLOCK_M: tl.constexpr,
                          CHUNK: tl.constexpr, PROGRAMS_POW2: tl.constexpr, BLOCK_CHUNK: tl.constexpr,
                          HAS_MAP: tl.constexpr):
    """Many routes, second launch: every program reads all programs' counts, so each knows where
    each expert's run starts and where its own routes go inside it (after those of the programs
    before it), then places its chunk with atomics on its own cursors and writes its share of
    block_expert. Same layout as align_routes_kernel."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    bins = tl.arange(0, BINS)
    others = tl.arange(0, PROGRAMS_POW2)
    table = tl.load(counts_ptr + others[:, None] * BINS + bins[None, :], mask=others[:, None] < programs,
                    other=0)
    counts = tl.sum(table, axis=0)
    before = tl.sum(tl.where(others[:, None] < pid, table, 0), axis=0)
    blocks = tl.where(bins < LOCAL_EXPERTS, (counts + BLOCK_M - 1) // BLOCK_M, 0)
    block_end = tl.cumsum(blocks, axis=0)
    used_blocks = tl.sum(blocks, axis=0)
    tl.store(cursor_ptr + pid * BINS + bins, (block_end - blocks) * BLOCK_M + before)
    block_lanes = tl.arange(0, BLOCK_CHUNK)
    for start in range(pid * BLOCK_CHUNK, max_blocks, programs * BLOCK_CHUNK):
        block = start + block_lanes
        owner = tl.sum((block_end[None, :] <= block[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + block, tl.where(block < used_blocks, owner, -1),
                 mask=block < max_blocks)
    # The cursors stored above are advanced below by other threads of this program.
    tl.debug_barrier()
    route = pid * CHUNK + tl.arange(0, CHUNK)
    expert = local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts, LOCAL_EXPERTS,
                          HAS_MAP)
    live = expert >= 0
    row = tl.atomic_add(cursor_ptr + pid * BINS + tl.where(live, expert, 0), 1, mask=live)
    tl.store(sorted_routes_ptr + row, route, mask=live)


@triton.jit
def sum_routes_kernel(y_ptr, topk_ids_ptr, expert_map_ptr, out_ptr, num_routes, num_experts, hidden,
                      TOP_K: tl.constexpr, LOCAL_EXPERTS: tl.constexpr, HAS_MAP: tl.constexpr,
                      BLOCK_H: tl.constexpr):
    """out[m] = sum over the token's live routes of y[route] (already weighted), in fp32, in slot
    order: deterministic. Dropped routes were never written in y and are never read."""
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < hidden
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        route = token * TOP_K + slot
        expert = local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts,
                              LOCAL_EXPERTS, HAS_MAP)
        row = y_ptr + route.to(tl.int64) * hidden
        live_cols = tl.where(expert >= 0, hidden, 0)
        acc += tl.load(row + cols, mask=cols < live_cols, other=0.0).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)
