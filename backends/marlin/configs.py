"""Launch-config choice for the Marlin MoE GEMM: a pure function of (GPU caps, compiled kernel
attributes, spec, token bucket), so it runs and is tested on any machine with recorded profiles and
synthetic attributes.

The candidates come from csrc/cuda/marlin_moe_configs.h (parsed here, so the compiled table and this
list cannot disagree). Two policies:

  occupancy    every (block_m, config, K split) is priced by a cost model (gemm_cost) in which
               blocks per SM, from the register file, shared memory and thread slots, set how fast
               an SM streams; block_m, shared by both GEMMs, goes to the cheapest layer. Among a
               GEMM's configs within COST_TIE of the cheapest, the most weight bytes in flight per
               block wins (the 256-wide, 3-stage tile at decode), then fewer K splits; for bf16 on
               sm_90a a wgmma tile (block_m 48 and 64) replaces the same tile on mma.sync where it
               holds at least as many blocks.
  first_valid  the baseline: block_m from the padding rule (block_m_for), the first candidate in
               table order that fits the shape and the shared memory, the fewest K splits that
               fill the GPU.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import Optional

import attrs

from hal.caps import GpuCaps
from hal.spec import MoESpec

CONFIG_HEADER = "cuda/marlin_moe_configs.h"  # read from the installed kernel sources (hal.jit)
POLICIES = ("occupancy", "first_valid")

# --- tuning constants -------------------------------------------------------------------------
BLOCK_M_CHOICES = (8, 16, 32, 48, 64)  # rows per MoE block the kernels are compiled for
# The first_valid baseline's block_m rule: what one more MoE block costs besides its rows, in rows
# of compute (the block streams its expert's weight slab once more and pays a pipeline fill).
BLOCK_OVERHEAD_ROWS = 16
# Blocks per SM the chooser asks for at most: more resident blocks hide more latency, and past 4
# the register file of these kernels (96-255 registers a thread) holds no more anyway.
MAX_BLOCKS_PER_SM = 4
# CUDA reserves 1 KiB of shared memory per resident block on sm_80 and later.
SMEM_RESERVED_PER_BLOCK = 1024
# Registers are allocated per warp in units of 256 (sm_80 / sm_90 allocation granularity).
REG_ALLOC_UNIT = 256
# Split K only while each split keeps at least this many pipeline stages of work (thread_k each):
# fewer and the prologue/epilogue and the fp32 atomics cost more than the extra parallelism buys.
MIN_K_TILES_PER_SPLIT = 4
MAX_SPLITS = 16
# Thread blocks along M per expected MoE block: the kernels walk the device-side block count, so
# a grid smaller than the worst case is always correct; twice the uniform-routing estimate absorbs
# skewed routings without launching the many blocks the worst-case bound would (they would only
# read the count and exit, a few microseconds at decode).
GRID_M_SLACK = 2
# --- the cost model (policy "occupancy") -------------------------------------------------------
# A GEMM's modeled time, in bytes streamed at one SM's share of the memory bandwidth: the busiest
# SM runs ceil(thread blocks / SMs) blocks one after another, each block's work is the larger of
# its mainloop's bytes (int4 weight tile, bf16 activations) and its multiply-adds over
# MACS_PER_BYTE, then its epilogue's output bytes (they follow the mainloop), plus
# cta_fixed_bytes (pipeline fill, scale loads, epilogue); an SM with r
# resident blocks works at r / (r + HALF_RATE_BLOCKS) of its rate (one block stalls the SM at
# every stage barrier; a second one fills those stalls). Activation bytes count in full, for every
# row of the block, although they come from L2 and padding rows are not read at all: a block
# stages its rows' activations for every K stage through the same shared-memory pipeline as the
# weights, and padding rows cost it the same stores, ldmatrix and mma rows. Output bytes count for
# routed rows only (output_bytes). Checked on the H200 against two recorded sweeps over seven MoE
# layers (benchmarks/marlin_peer.py --sweep-tokens; docs/backends/marlin.md): at 16-256 tokens
# within 0.9% of the fastest on average, 5.2% at worst; at 1-8 tokens (every config and K split)
# 3.1% and 14.2%.
MACS_PER_BYTE = 64  # W4A16 mma.sync multiply-adds per streamed byte where compute and memory balance
# Dequantizing a weight tile costs a block as much as this many rows of multiply-adds (the lop3,
# sub and mul per register run beside the mma, once per block however many rows it holds).
DEQUANT_ROWS = 16
# A block's fixed cost is a time: CTA_FIXED_BYTES at one SM's share of the bandwidth of the GPU the
# constants were fitted on (the H200: 4814 GB/s over 132 SMs, about 112 ns). Elsewhere it is the same
# time at that GPU's own share (cta_fixed_bytes): fewer bytes where the share is smaller, so K splits
# cost less. On the H100 (3350 GB/s) that took the rule from 8.0% to 6.9% above the fastest measured
# choice on average over a recorded 4-32 token sweep, 23% to 15% at worst (qwen3-235b-a22b at 8
# tokens: GEMM 1 split 4 ways, 197 us, where unsplit it ran 236 us).
CTA_FIXED_BYTES = 4096
FITTED_BYTES_PER_SM_S = 4814.3e9 / 132
HALF_RATE_BLOCKS = 1.0
OUTPUT_BYTES = 4  # an fp32 partial (GEMM 1 with K splits) or atomic (GEMM 2) per output element
# Configs within this fraction of the cheapest count as equal; among them the most resident blocks
# per SM win, then the most weight bytes in flight per block (stages x tile), then fewer K splits,
# then the lower cost, and last a tile's wgmma twin (bf16 on sm_90a; same geometry, so the same
# modeled cost where it holds as many blocks per SM) over its mma.sync one: the twin was faster at
# all 24 pairs timed at block_m 64 and 1000-2048 tokens, and in 23 of the 24 layers where the rule
# took a block_m 48-64 twin at 128-3000 tokens (docs/backends/marlin.md, Config choice).
COST_TIE = 0.02
# The layer's epilogue fusions, in the order of the op's `fusion` argument (Fusion in
# csrc/cuda/marlin_moe_launch.h): five, four or three launches.
FUSIONS = ("none", "activation", "activation_and_rounding")
# Token buckets: plans are cached per power-of-two bucket of the batch size, up to this cap.
MAX_TOKEN_BUCKET = 1 << 16


@attrs.frozen
class LaunchConfig:
    index: int  # position in the compiled table
    block_m: int
    thread_k: int
    thread_n: int
    threads: int
    stages: int
    mma: int = 0  # 0: mma.sync; 1: wgmma (builds for bf16 on sm_90a only)

    def pipeline_smem_bytes(self) -> int:
        """Dynamic shared memory the kernel asks for (mirror of Tile::kSmemBytes)."""
        warps_n = self.thread_n // 64
        units = self.block_m * self.thread_k // 8 + self.thread_k // 16 * warps_n * 32 + self.thread_n // 8
        if self.mma:  # whole 1024-byte stages, and the slack to align the first
            return self.stages * math.ceil(units / 64) * 64 * 16 + 1024
        warps_k = self.threads // 32 // warps_n
        acc = 4 * (self.block_m // 8) * 4
        reduce = warps_n * acc * 32 * 4 if warps_k > 1 else 0
        return max(self.stages * units * 16, reduce)

    def describe(self) -> str:
        return (f"m{self.block_m} k{self.thread_k} n{self.thread_n} t{self.threads} "
                f"s{self.stages}" + (" wgmma" if self.mma else ""))


@attrs.frozen
class KernelAttrs:
    """cudaFuncGetAttributes of one compiled config (or synthetic values in tests)."""

    num_regs: int
    static_smem: int
    dynamic_smem: int
    local_bytes: int = 0


@attrs.frozen
class GemmChoice:
    config: LaunchConfig
    splits: int
    blocks_per_sm: int
    limiter: str  # what bounds blocks_per_sm: regs | smem | threads | cap
    expected_ctas: int
    cost: float = 0.0  # modeled time (gemm_cost), comparable between choices of one GEMM

    def describe(self) -> str:
        split = f" x{self.splits} K-splits" if self.splits > 1 else ""
        return (f"{self.config.describe()}{split}, {self.blocks_per_sm} blocks/SM "
                f"(bound by {self.limiter}), ~{self.expected_ctas} live blocks, modeled "
                f"{self.cost / 1e6:.2f}")


def _parse_header(text: str) -> tuple:
    """The table of a wgmma build (bf16 on sm_90a): every block_m's mma.sync configs, then every
    block_m's wgmma ones (other builds stop before those)."""
    numbers = r"\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\)"

    def expand(per_block: str, listing: str) -> list:
        """The rows of `per_block`(BM) for each block_m that the define `listing` names, in order."""
        tiles = re.search(rf"#define {per_block}\(BM\)(.*?)\n\s*\n", text, re.S)
        body = re.search(rf"#define {listing}\b(.*?)\n\s*\n", text + "\n\n", re.S)
        if tiles is None or body is None:
            raise RuntimeError(f"{CONFIG_HEADER}: {per_block} or {listing} not found")
        configs = re.findall(r"HAL_MARLIN_CONFIG\(BM," + numbers, tiles.group(1))
        blocks = [int(b) for b in re.findall(rf"\b{per_block}\((\d+)\)", body.group(1))]
        return [(bm, *map(int, c)) for bm in blocks for c in configs]

    rows = (expand("HAL_MARLIN_CONFIGS_FOR_BLOCK", "HAL_MARLIN_ALL_CONFIGS")
            + expand("HAL_MARLIN_WGMMA_CONFIGS_FOR_BLOCK", "HAL_MARLIN_WGMMA_CONFIGS"))
    return tuple(LaunchConfig(i, *row) for i, row in enumerate(rows))


@functools.lru_cache(maxsize=1)
def candidates() -> tuple:
    """Every compiled config, in table order (the index the kernel op takes)."""
    from hal import jit

    return _parse_header(jit.source_file(CONFIG_HEADER).read_text())


def token_bucket(tokens: int) -> int:
    """Plans are cached per bucket: the next power of two, capped."""
    return min(MAX_TOKEN_BUCKET, 1 << max(0, math.ceil(math.log2(max(tokens, 1)))))


def _route_count_pmf(spec: MoESpec, tokens: int):
    """(count, probability) pairs of the routes one expert receives under uniform routing:
    Binomial(tokens, top_k / num_experts), over the counts that carry any weight."""
    n, p = tokens, min(1.0, spec.top_k / spec.num_experts)
    if p >= 1.0:
        return [(n, 1.0)]
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    lo, hi = max(0, int(mean - 10 * sd) - 1), min(n, int(mean + 10 * sd) + 2)
    log_q = math.log1p(-p)
    out = []
    for c in range(lo, hi + 1):
        log_pmf = (math.lgamma(n + 1) - math.lgamma(c + 1) - math.lgamma(n - c + 1)
                   + (c * math.log(p) if c else 0.0) + (n - c) * log_q)
        out.append((c, math.exp(log_pmf)))
    return out


@functools.lru_cache(maxsize=1024)
def blocks_per_expert(spec: MoESpec, tokens: int, block_m: int) -> float:
    """Expected MoE blocks of one expert: E[ceil(count / block_m)]."""
    return sum(pr * -(-c // block_m) for c, pr in _route_count_pmf(spec, tokens))


@functools.lru_cache(maxsize=256)
def block_m_for(spec: MoESpec, tokens: int) -> int:
    """The compiled block size with the least expected work per expert: padded rows plus
    BLOCK_OVERHEAD_ROWS per block. Small blocks waste no rows but re-stream the weights once per
    block; large ones pad (an expert with 65 rows fills two blocks of 64)."""
    def cost(bm):
        return blocks_per_expert(spec, tokens, bm) * (bm + BLOCK_OVERHEAD_ROWS)
    return min(BLOCK_M_CHOICES, key=lambda bm: (cost(bm), bm))


def expected_blocks(spec: MoESpec, tokens: int, block_m: int) -> int:
    """MoE blocks of local experts the routing makes for `tokens` under uniform routing (the
    planner cannot see the routing without a host sync, and the kernel tolerates any other)."""
    return max(1, round(spec.local_experts * blocks_per_expert(spec, tokens, block_m)))


def max_blocks(spec: MoESpec, tokens: int, block_m: int) -> int:
    """Worst-case MoE blocks (the workspace bound the C++ side uses)."""
    routes = tokens * spec.top_k
    return -(-routes // block_m) + min(spec.num_experts, routes)


def grid_m(spec: MoESpec, tokens: int, block_m: int) -> int:
    """Thread blocks along M for a call of `tokens` tokens."""
    return max(1, min(max_blocks(spec, tokens, block_m),
                      GRID_M_SLACK * expected_blocks(spec, tokens, block_m)))


def blocks_per_sm(gpu: GpuCaps, config: LaunchConfig, attrs_: KernelAttrs, cap: int) -> tuple:
    """(blocks, limiter); 0 blocks when the config cannot launch on this GPU at all."""
    smem = attrs_.static_smem + attrs_.dynamic_smem
    optin = gpu.smem_per_block_optin or gpu.smem_per_block or 0
    if smem > optin or config.threads > (gpu.max_threads_per_block or 1024):
        return 0, "smem" if smem > optin else "threads"
    warps = config.threads // 32
    regs_per_warp = math.ceil(attrs_.num_regs * 32 / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    if gpu.regs_per_block and regs_per_warp * warps > gpu.regs_per_block:
        return 0, "regs"
    limits = {
        "regs": (gpu.regs_per_sm // regs_per_warp) // warps if gpu.regs_per_sm else cap,
        "smem": (gpu.smem_per_sm // (smem + SMEM_RESERVED_PER_BLOCK)) if gpu.smem_per_sm else cap,
        "threads": gpu.max_threads_per_sm // config.threads if gpu.max_threads_per_sm else cap,
        "cap": cap,
    }
    limiter = min(limits, key=lambda k: (limits[k], k != "cap"))
    return limits[limiter], limiter


def splits_for(config: LaunchConfig, n: int, k: int, ctas: int, slots: int) -> int:
    """The baseline's K splits: the fewest (a power of two) that give every concurrent slot a block,
    keeping at least MIN_K_TILES_PER_SPLIT stages of thread_k per split."""
    splits = 1
    while (ctas * splits < slots and splits * 2 <= MAX_SPLITS
           and k % (splits * 2 * config.thread_k) == 0
           and k // (splits * 2) >= MIN_K_TILES_PER_SPLIT * config.thread_k):
        splits *= 2
    return splits


def split_options(config: LaunchConfig, k: int) -> list:
    """Every K split (a power of two up to MAX_SPLITS) that divides K into whole stages and keeps at
    least MIN_K_TILES_PER_SPLIT of them per split."""
    out, splits = [], 1
    while (splits <= MAX_SPLITS and k % (splits * config.thread_k) == 0
           and (splits == 1 or k // splits >= MIN_K_TILES_PER_SPLIT * config.thread_k)):
        out.append(splits)
        splits *= 2
    return out


def gemm_shape(spec: MoESpec, gemm: int) -> tuple:
    """(n, k) of the layer's GEMM 1 (x @ W13) or GEMM 2 (act @ W2)."""
    if gemm not in (1, 2):
        raise ValueError(f"gemm={gemm!r} is not allowed: expected 1 or 2")
    return (spec.w13_rows, spec.hidden_size) if gemm == 1 else (spec.hidden_size, spec.intermediate_size)


def fits(config: LaunchConfig, n: int, k: int) -> bool:
    return n % config.thread_n == 0 and k % config.thread_k == 0


def inflight_bytes(config: LaunchConfig) -> int:
    """Weight bytes one block has in flight: its pipeline stages of int4 tile."""
    return config.stages * config.thread_k * config.thread_n // 2


def routed_rows(spec: MoESpec, tokens: int, block_m: int) -> float:
    """Expected routed (non-padding) rows of a MoE block: an expert's expected routes over its
    expected blocks."""
    per_expert = blocks_per_expert(spec, tokens, block_m)
    return min(float(block_m), tokens * spec.top_k / spec.num_experts / per_expert) if per_expert else 0.0


def output_bytes(spec: MoESpec, gemm: int, splits: int) -> float:
    """Bytes a block moves per output element of a routed row in its epilogue (Epilogue in
    marlin_moe_gemm.cuh): GEMM 2's fp32 atomic; GEMM 1's fp32 partial and its read by the
    activation kernel, or with one split (activated in registers) the activation in the dtype (half the
    columns when gated)."""
    if gemm == 2:
        return OUTPUT_BYTES
    if splits > 1:
        return 2 * OUTPUT_BYTES
    return 2.0 if spec.activation == "relu2" else 1.0


def gemm_cost(gpu: GpuCaps, spec: MoESpec, tokens: int, config: LaunchConfig, per_sm: int, splits: int,
              n: int, k: int, gemm: int, serial_epilogue: bool = True) -> float:
    """Modeled time of GEMM `gemm` (1 or 2; see MACS_PER_BYTE above), in bytes at one SM's share
    of the memory bandwidth. The epilogue's outputs follow the mainloop, so they add to its time;
    serial_epilogue False counts them inside the mainloop's max (the model before, an A/B baseline:
    it hid a compute-bound block's fp32 K-split partials, and split GEMM 1 where the same config
    unsplit ran 3.7-9.3% faster on the H200)."""
    blocks = spec.local_experts * blocks_per_expert(spec, tokens, config.block_m)
    ctas = max(1.0, blocks) * (n // config.thread_n) * splits
    rounds = math.ceil(ctas / (gpu.sm_count or 1))
    k_split = k / splits
    # Activations count for every row of the block: padding rows are zero-filled, not read, but
    # they cost the block its shared-memory stores, ldmatrix and mma rows all the same. Outputs
    # count for routed rows only: padding rows are never written.
    memory = config.thread_n * k_split / 2 + config.block_m * k_split * 2
    outputs = routed_rows(spec, tokens, config.block_m) * config.thread_n * output_bytes(spec, gemm, splits)
    compute = (config.block_m + DEQUANT_ROWS) * config.thread_n * k_split / MACS_PER_BYTE
    block = max(memory, compute) + outputs if serial_epilogue else max(memory + outputs, compute)
    resident = min(per_sm, rounds)
    return rounds * (block + cta_fixed_bytes(gpu)) * (resident + HALF_RATE_BLOCKS) / resident


def cta_fixed_bytes(gpu: GpuCaps) -> float:
    """A block's fixed cost in bytes at one SM's share of this GPU's bandwidth (CTA_FIXED_BYTES
    where the bandwidth or SM count is unknown)."""
    if not gpu.mem_bandwidth_gbps or not gpu.sm_count:
        return CTA_FIXED_BYTES
    return CTA_FIXED_BYTES * gpu.mem_bandwidth_gbps * 1e9 / gpu.sm_count / FITTED_BYTES_PER_SM_S


def choose_gemm(gpu: GpuCaps, table: dict, spec: MoESpec, tokens: int, block_m: int, gemm: int,
                policy: str = "occupancy", serial_epilogue: bool = True) -> GemmChoice:
    """The config and K split for GEMM `gemm` of the layer (1: x @ W13, 2: act @ W2) at one
    block_m. `table` maps LaunchConfig.index -> KernelAttrs."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not allowed: expected one of {', '.join(POLICIES)}")
    n, k = gemm_shape(spec, gemm)
    m_blocks = expected_blocks(spec, tokens, block_m)
    sm_count = gpu.sm_count or 1
    scored = []
    for config in candidates():
        if config.block_m != block_m or not fits(config, n, k) or config.index not in table:
            continue
        per_sm, limiter = blocks_per_sm(gpu, config, table[config.index], MAX_BLOCKS_PER_SM)
        if per_sm == 0:
            continue
        ctas = m_blocks * (n // config.thread_n)
        if policy == "first_valid":
            splits = splits_for(config, n, k, ctas, sm_count * per_sm)
            return GemmChoice(config, splits, per_sm, limiter, ctas * splits,
                              gemm_cost(gpu, spec, tokens, config, per_sm, splits, n, k, gemm))
        for splits in split_options(config, k):
            cost = gemm_cost(gpu, spec, tokens, config, per_sm, splits, n, k, gemm, serial_epilogue)
            scored.append(GemmChoice(config, splits, per_sm, limiter, ctas * splits, cost))
    if not scored:
        raise ValueError(f"no compiled Marlin config fits n={n}, k={k}, block_m={block_m} on "
                         f"{gpu.name or gpu.arch} (shared memory opt-in {gpu.smem_per_block_optin} B)")
    cheapest = min(c.cost for c in scored)
    near = [c for c in scored if c.cost <= cheapest * (1 + COST_TIE)]
    return min(near, key=lambda c: (-c.blocks_per_sm, -inflight_bytes(c.config), c.splits, c.cost,
                                    -c.config.mma))


def fusion_for(splits13: int) -> str:
    """Which pointwise stages run in the GEMMs' epilogues (FUSIONS). Where GEMM 1 runs unsplit it
    activates in registers and writes the GEMM-2 input in the dtype, with no fp32 round trip, and
    the rounding kernel rounds GEMM 2's sums (four launches). Where GEMM 1 splits K, the activation
    kernel sums the partials (five launches). On the H200 (docs/backends/marlin.md) the fused
    activation ran 1.1-7.2% ahead of the activation kernel; GEMM 2's fused rounding, whose
    last-arrival count makes every block wait for its fp32 atomics to land, ran behind the rounding
    kernel at every measured point (0.4-3.5% up to 128 tokens, up to 20% above); the fused split
    reduction (the last split of each tile sums the partials) behind the activation kernel on
    average (1.6%), and 11-24% at 1024-3000 tokens."""
    return "none" if splits13 > 1 else "activation"


@attrs.frozen
class LayerChoice:
    tokens_bucket: int
    block_m: int
    gemm13: GemmChoice
    gemm2: GemmChoice
    policy: str
    # (block_m, modeled layer cost) of every block size the occupancy policy priced, cheapest
    # first: why this block_m (empty for first_valid, which takes the padding rule's).
    block_m_costs: tuple = ()

    @property
    def fusion(self) -> str:
        return fusion_for(self.gemm13.splits)

    @property
    def cost(self) -> float:
        return self.gemm13.cost + self.gemm2.cost


def choose_layer(gpu: GpuCaps, table: dict, spec: MoESpec, tokens_bucket: int, policy: str = "occupancy",
                 serial_epilogue: bool = True) -> LayerChoice:
    """Both GEMMs of the layer for one token bucket; they share block_m (one routing). The
    occupancy policy models every compiled block_m with its best configs and takes the cheapest
    (ties to the smaller block); first_valid takes block_m_for's padding rule. serial_epilogue:
    see gemm_cost."""
    def at(block_m):
        g13 = choose_gemm(gpu, table, spec, tokens_bucket, block_m, 1, policy, serial_epilogue)
        g2 = choose_gemm(gpu, table, spec, tokens_bucket, block_m, 2, policy, serial_epilogue)
        return LayerChoice(tokens_bucket, block_m, g13, g2, policy)

    if policy == "first_valid":
        return at(block_m_for(spec, tokens_bucket))
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not allowed: expected one of {', '.join(POLICIES)}")
    options, errors = [], []
    for block_m in BLOCK_M_CHOICES:
        try:
            options.append(at(block_m))
        except ValueError as exc:
            errors.append(str(exc))
    if not options:
        raise ValueError("; ".join(errors))
    options.sort(key=lambda c: (c.cost, c.block_m))
    return attrs.evolve(options[0], block_m_costs=tuple((c.block_m, c.cost) for c in options))


def attrs_table(rows: Sequence[Sequence[int]]) -> dict:
    """The kernel_attributes op's rows -> {config index: KernelAttrs}."""
    return {i: KernelAttrs(num_regs=int(r[7]), static_smem=int(r[8]), dynamic_smem=int(r[6]),
                           local_bytes=int(r[9])) for i, r in enumerate(rows)}


def mma_sync_only(table: dict) -> dict:
    """`table` without its wgmma configs: what a build without wgmma would offer the rule."""
    return {i: a for i, a in table.items() if not candidates()[i].mma}


def check_table_matches(rows: Sequence[Sequence[int]]) -> Optional[str]:
    """A compiled table whose geometry differs from the header's is a stale build: say so. A build
    without wgmma holds the mma.sync configs only."""
    want = [(c.block_m, c.thread_k, c.thread_n, c.threads, c.stages, c.mma, c.pipeline_smem_bytes())
            for c in candidates()]
    got = [tuple(int(v) for v in r[:7]) for r in rows]
    mma_sync = [w for w in want if w[5] == 0]
    return None if got in (want, mma_sync) else f"compiled config table {got} != header {want}"
