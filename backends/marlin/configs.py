"""Launch-config choice for the Marlin MoE GEMM: a pure function of (GPU caps, compiled kernel
attributes, spec, token bucket), so it runs and is tested on any machine with recorded profiles and
synthetic attributes.

The candidates come from csrc/cuda/marlin_moe_configs.h (parsed here, so the compiled table and this
list cannot disagree). Two policies:

  occupancy    blocks per SM from the register file, shared memory and thread slots, capped at
               SMALL_M_BLOCK_CAP for small batches and LARGE_M_BLOCK_CAP otherwise; the most
               concurrent blocks win; ties go to more waves of blocks (up to TARGET_WAVES) for
               small batches, then to the larger tile.
  first_valid  the baseline: the first candidate in table order that fits the shape and the shared
               memory.
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
# What one more MoE block costs besides its rows, in rows of compute: the block streams its
# expert's weight slab once more (from HBM or L2) and pays a pipeline fill and an epilogue. At
# ~3 TB/s and ~300 TFLOP/s of W4A16 mma.sync, streaming an expert costs about as much as 25 rows of
# its compute; blocks of one expert that run together share L2, hence the lower 16.
BLOCK_OVERHEAD_ROWS = 16
# Tokens at or below which a batch counts as "small M" (decode): up to 4 blocks per SM then pay,
# since each block holds few rows and latency hiding comes from more blocks in flight. Above it the
# blocks are large and 2 per SM already keep the tensor cores fed.
SMALL_M_TOKENS = 64
SMALL_M_BLOCK_CAP = 4
LARGE_M_BLOCK_CAP = 2
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
# Problem parallelism, the tie-break between configs of equal occupancy for small batches: up to
# this many waves of thread blocks over the resident slots, more waves win (more weight loads in
# flight, a smaller tail; measured on the H200, 64-wide tiles beat 256-wide ones by 3-7% at 8-64
# tokens). Large batches have waves to spare, and there the larger tile wins: it re-reads the
# activations fewer times (1.4-1.75x over the 64-wide first-valid config at 2048 tokens).
TARGET_WAVES = 8
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

    def pipeline_smem_bytes(self) -> int:
        """Dynamic shared memory the kernel asks for (mirror of Tile::kSmemBytes)."""
        warps_n = self.thread_n // 64
        warps_k = self.threads // 32 // warps_n
        stage = (self.block_m * self.thread_k // 8 + self.thread_k // 16 * warps_n * 32
                 + self.thread_n // 8) * 16
        acc = 4 * (self.block_m // 8) * 4
        reduce = warps_n * acc * 32 * 4 if warps_k > 1 else 0
        return max(self.stages * stage, reduce)

    def describe(self) -> str:
        return (f"m{self.block_m} k{self.thread_k} n{self.thread_n} t{self.threads} "
                f"s{self.stages}")


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

    def describe(self) -> str:
        split = f" x{self.splits} K-splits" if self.splits > 1 else ""
        return (f"{self.config.describe()}{split}, {self.blocks_per_sm} blocks/SM "
                f"(bound by {self.limiter}), ~{self.expected_ctas} live blocks")


def _parse_header(text: str) -> tuple:
    line = re.search(r"HAL_MARLIN_CONFIGS_FOR_BLOCK\(BM\)(.*?)\n\s*\n", text, re.S)
    if line is None:
        raise RuntimeError(f"{CONFIG_HEADER}: HAL_MARLIN_CONFIGS_FOR_BLOCK not found")
    per_block = re.findall(r"HAL_MARLIN_CONFIG\(BM,\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\)", line.group(1))
    all_part = text[text.index("#define HAL_MARLIN_ALL_CONFIGS"):]
    blocks = [int(b) for b in re.findall(r"HAL_MARLIN_CONFIGS_FOR_BLOCK\((\d+)\)", all_part)]
    out = []
    for bm in blocks:
        for tk, tn, th, st in per_block:
            out.append(LaunchConfig(len(out), bm, int(tk), int(tn), int(th), int(st)))
    return tuple(out)


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
    """Fewest K splits (a power of two) that give every concurrent slot a block, keeping at least
    MIN_K_TILES_PER_SPLIT stages of thread_k per split."""
    splits = 1
    while (ctas * splits < slots and splits * 2 <= MAX_SPLITS
           and k % (splits * 2 * config.thread_k) == 0
           and k // (splits * 2) >= MIN_K_TILES_PER_SPLIT * config.thread_k):
        splits *= 2
    return splits


def fits(config: LaunchConfig, n: int, k: int) -> bool:
    return n % config.thread_n == 0 and k % config.thread_k == 0


def choose_gemm(gpu: GpuCaps, table: dict, spec: MoESpec, tokens: int, block_m: int, n: int, k: int,
                policy: str = "occupancy") -> GemmChoice:
    """The config for one GEMM of n outputs over k inputs. `table` maps LaunchConfig.index ->
    KernelAttrs."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not allowed: expected one of {', '.join(POLICIES)}")
    small = tokens <= SMALL_M_TOKENS
    cap = SMALL_M_BLOCK_CAP if small else LARGE_M_BLOCK_CAP
    m_blocks = expected_blocks(spec, tokens, block_m)
    sm_count = gpu.sm_count or 1
    scored = []
    for config in candidates():
        if config.block_m != block_m or not fits(config, n, k) or config.index not in table:
            continue
        per_sm, limiter = blocks_per_sm(gpu, config, table[config.index], cap)
        if per_sm == 0:
            continue
        ctas = m_blocks * (n // config.thread_n)
        slots = sm_count * per_sm
        splits = splits_for(config, n, k, ctas, slots)
        choice = GemmChoice(config, splits, per_sm, limiter, ctas * splits)
        if policy == "first_valid":
            return choice
        area = config.thread_n * config.thread_k
        if small:
            waves = min(ctas * splits / slots, TARGET_WAVES)
            scored.append(((per_sm, waves, -splits, area), choice))
        else:
            scored.append(((per_sm, -splits, area), choice))
    if not scored:
        raise ValueError(f"no compiled Marlin config fits n={n}, k={k}, block_m={block_m} on "
                         f"{gpu.name or gpu.arch} (shared memory opt-in {gpu.smem_per_block_optin} B)")
    return max(scored, key=lambda item: item[0])[1]


@attrs.frozen
class LayerChoice:
    tokens_bucket: int
    block_m: int
    gemm13: GemmChoice
    gemm2: GemmChoice
    policy: str


def choose_layer(gpu: GpuCaps, table: dict, spec: MoESpec, tokens_bucket: int,
                 policy: str = "occupancy") -> LayerChoice:
    """Both GEMMs of the layer for one token bucket; they share block_m (one routing)."""
    block_m = block_m_for(spec, tokens_bucket)
    g13 = choose_gemm(gpu, table, spec, tokens_bucket, block_m, spec.w13_rows, spec.hidden_size, policy)
    g2 = choose_gemm(gpu, table, spec, tokens_bucket, block_m, spec.hidden_size,
                     spec.intermediate_size, policy)
    return LayerChoice(tokens_bucket, block_m, g13, g2, policy)


def attrs_table(rows: Sequence[Sequence[int]]) -> dict:
    """The kernel_attributes op's rows -> {config index: KernelAttrs}."""
    return {i: KernelAttrs(num_regs=int(r[6]), static_smem=int(r[7]), dynamic_smem=int(r[5]),
                           local_bytes=int(r[8])) for i, r in enumerate(rows)}


def check_table_matches(rows: Sequence[Sequence[int]]) -> Optional[str]:
    """A compiled table whose geometry differs from the header's is a stale build: say so."""
    want = [(c.block_m, c.thread_k, c.thread_n, c.threads, c.stages, c.pipeline_smem_bytes())
            for c in candidates()]
    got = [tuple(int(v) for v in r[:6]) for r in rows]
    return None if want == got else f"compiled config table {got} != header {want}"
