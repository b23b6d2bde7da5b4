"""Launch configs from the spec, the token count and the GPU's capabilities alone: one rule that
covers every shape, written so `plan()` can say why each number was chosen. Pure Python (no torch,
no Triton), so it is tested on recorded profiles anywhere.

- BLOCK_M follows the routes of a busy local expert (the M of each expert's GEMM: the mean per
  expert plus two standard deviations), from 16 (the smallest tensor-core tile) to 128 where the
  GPU has the shared memory for it, so that one block holds an expert's routes.
- Decode is a weight stream: BLOCK_N (64 at most: on the H200, gpt-oss-120b mxfp4 at 64 tokens ran
  2.4x slower with 128) shrinks until there are about two programs per SM to keep enough loads in
  flight; BLOCK_K is 128 (one fp8 block / int4 group / four mxfp4 groups per step).
- Prefill is compute-bound: 128-wide N tiles (for gate and up each when fused), BLOCK_K 64 for
  16-bit weights and fp8 converted to 16 bits, 128 for 4-bit weights and fp8 activations. On the
  H200 (qwen3-30b-a3b bf16, 4096 tokens) 128 x 128 tiles with 3 stages beat 128 x 64 with 4 by 8%.
- Stages: as many as fit the opt-in shared memory, 2 to 4 (2 on AMD, whose pipeliner streams
  through registers).
- Repacked mxfp4 and int4 (their default paths, mxfp4_repacked and int4_repacked): no GEMV;
  swap-AB at every size (the decoded weights as wgmma's register operand), 64 weight rows per tile
  at BLOCK_M 16 and 128 from 32; GEMM 1's tile holds gate and up rows together.
- fp8 weights are converted to the activation dtype in registers (w8a16) by default: quantizing
  activations to e4m3 (per row, per 128 columns) costs about 4% relative error against the float64
  oracle on random data, over the 1e-2 of the MoE contract. w8a8 (fp8 x fp8 dots, the numerics
  DeepSeek-V3 serves with) is asked for explicitly with fp8_act=True, on GPUs with fp8 tensor cores;
  its tiles (`_gemm_w8a8`) take whole 128-column scale groups per K step and, at prefill, per N
  tile, and the rule keeps the w8a16 GEMV where that path applies (faster there). fp8_act="x2" holds
  each activation as two e4m3 terms (the second is what the first leaves, in units of the same
  per-row, per-128-column scale) on the same tiles, two fp8 x fp8 dots per K step chained on one
  accumulator before the scales: 3.1e-3 to 3.6e-3 off the oracle on the H200 (w8a16 4.3e-3 to
  4.5e-3). On GPUs with wgmma the rule takes it by default where blocks of at most 64 rows group
  routes by expert (W8A8X2_MAX_BLOCK_M; its 64-row tiles W8A8X2_PREFILL_GEMM1 / _GEMM2).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import attrs

FORMAT_CODES = {"bf16": 0, "fp8_block128": 1, "mxfp4": 2, "int4_g128": 3}
# fp8_act values other than None: w8a16, w8a8, w8a8 with two e4m3 terms per activation.
FP8_ACT_VALUES = (False, True, "x2")
FP8_ACT_NAMES = {1: "w8a8", 2: "w8a8x2"}
FP8_TERMS = {1: "e4m3", 2: "two e4m3 terms"}  # how plan() names a quantized activation
ACTIVATION_CODES = {"silu": 0, "swiglu_oai": 1, "relu2": 2}
MIN_BLOCK_M = 16  # the smallest M of a tensor-core dot
BLOCK_M_128_MIN_ROUTES = 48
# Formats with a GEMV step, and those the rule sends there: on the H200 at 1 token the GEMV path
# beat the grouped GEMMs for fp8 (qwen3-30b-a3b 26.2 vs 28.6 us, deepseek-v3 EP rank 37.1 vs 57.1)
# and mxfp4 (gpt-oss-120b 90.9 vs 105.9) and lost for bf16 (qwen3-30b-a3b 34.0 vs 31.1,
# mixtral-8x7b 215.7 vs 171.9): 16-bit weights need no conversion, and the pipelined tensor-core
# loop streams them faster.
GEMV_FORMATS = ("bf16", "fp8_block128", "mxfp4")
# The rule takes the GEMV path where the per-route tensor-core GEMM 1 would have fewer than this
# many programs per SM (local routes x I / 32-wide N tiles): on the H200 at 1 token the GEMV ran
# deepseek-v3's EP rank (fp8, about one local route: 64 programs) in 37.1 us against 50.7 for
# per-route GEMMs, and gpt-oss-120b mxfp4 (4 routes: 360 programs; the GEMV's exact bit decode is
# cheaper than dot_scaled's upcast) in 90.9 against 100.3, while qwen3-30b-a3b fp8 (8 routes: 192
# programs) ran per-route GEMMs in 24.0 against 26.2 and bf16 lost on the GEMV everywhere.
GEMV_RULE_PROGRAMS_PER_SM = {"fp8_block128": 1, "mxfp4": 4}
GEMV_RULE_TILE_N = 32
GEMV_ROUTE_SHARE = 4
GEMV_PROGRAMS_PER_SM = 4  # resident programs' loads in flight cover the memory latency
GEMV_MAX_BLOCK_N = 32
GEMV_MIN_BLOCK_N = 4
GEMV_TILE_VALUES = {"bf16": 4096, "fp8_block128": 4096, "mxfp4": 8192}
PROGRAMS_PER_SM = 2  # at decode, enough programs streaming weights to cover memory latency
MIN_DECODE_BLOCK_N = 32
# Repacked mxfp4's swap-AB decode tiles (64 weight rows, BLOCK_M 16): 4 stages in flight. With the
# step-major words a stage is one contiguous run, and fewer stages let more programs share an SM
# (benchmarks/triton_moe_stages.py --sweep): gpt-oss-120b at 8 tokens 152.3 us against 159.2 on 6
# stages and 170.6 on 8 (H100), 150.7 against 159.1 (H200); at 64 tokens 535.5 against 559.3 (H100).
# With the row-major words before, 6 stages had been faster (H100, 8 tokens: 185.8 against 202.7).
MXFP4_DECODE_STAGES = 4
# bf16 decode GEMM 2 over a long K (mixtral-8x7b's 14336: 112 steps of 128): 3 stages, so three of
# its 16- or 32-row programs share an SM where 4 stages leave room for two, and each long weight
# row streams beside more of them. On an H100 (benchmarks/triton_moe_stages.py --sweep),
# mixtral-8x7b at 64 tokens 913.7 us against 956.8 (GEMM 2 307.9 against 348.6), at 8 tokens 846.8
# against 865.1; layers of 6-23 steps (qwen3-30b-a3b, qwen3-235b-a22b, gpt-oss-120b at 8 and 64
# tokens) moved by 0.4% or less either way, so they keep 4, and so do per-route blocks (1 token:
# not measured).
LONG_K_DECODE_STEPS = 64
LONG_K_DECODE_STAGES = 3
DEFAULT_SMS = 108
DEFAULT_SMEM = 99 * 1024
DEFAULT_L2 = 40 << 20
MAX_GROUP_M = 16
# Per-route blocks (decode, few routes): every route's block walks the N tiles together with up to
# this many others. A few routes still share an expert (32 routes over 128 experts: about 3.5 do);
# walking each route's N tiles in turn, they read the shared weights from memory twice, at different
# times. vLLM 0.33.0's tuned H100 table for gpt-oss-120b groups 64 blocks at 8 tokens. On an H100
# (benchmarks/triton_moe_stages.py --sweep regrouped), gpt-oss-120b bf16 at 8 tokens: 494.5 us
# against 541.0 without groups (GEMM 1 329.4 against 360.5), 513.1 in groups of 16.
PER_ROUTE_GROUP_M = 64
# K split over programs (split_k.py) where a decode GEMM of 4-bit weights would not give every SM
# a program (an EP rank at 1 token: GEMM 1 of one block on deepseek-v3's experts is 64 programs on
# 132 SMs, each stage of each holding 4 KB of weights): powers of two up to SPLIT_K_MAX while the
# programs stay within PROGRAMS_PER_SM per SM and each split keeps SPLIT_K_MIN_STEPS K steps. On
# an H100 (benchmarks/triton_moe_stages.py --sweep split_k, deepseek-v3's EP rank at 1 token),
# int4 GEMM 1 took 17.0-17.9 us split 2, 4 or 8 ways against 22.2 whole, and GEMM 2 (16 K steps)
# 11.2-12.2 split against 10.5; bf16 GEMM 1, whose stages hold 16 KB, 36.0-38.1 split against 33.9.
SPLIT_K_MAX = 8
SPLIT_K_MIN_STEPS = 16
# w8a16 prefill on GPUs with wgmma, from this BLOCK_M: GEMM 1 swap-AB (the e4m3 weights scaled into
# bf16 in registers are wgmma's register operand, x comes straight from memory, so the dots chain
# on the accumulator and stay in flight; in the usual order the scaled tile is stored to shared
# memory every K step and each dot is waited for), BLOCK_K 128 (one block scale per step), groups
# of at most 8 blocks. On the H200 at 4096 tokens (benchmarks/triton_moe_stages.py --sweep):
# qwen3-30b-a3b GEMM 1 719.8 us against 825.3 in the usual order (call 1130.7 against 1232.7),
# deepseek-v3's EP rank 938.9 against 1102.0 (1465.3 against 1625.4); GEMM 2 (K 768 / 2048) ran
# slower swapped (433.9 against 366.1, 528.8 against 478.9), and at 512 tokens (BLOCK_M 64) every
# swapped config ran slower (483.7 us at best against 303.1).
W8A16_SWAP_MIN_BLOCK_M = 128
W8A16_SWAP_GROUP_M = 8
# fp8 weights by default on GPUs with wgmma: w8a8x2 (two e4m3 terms per activation, within the
# contract) where blocks of at most 64 rows group routes by expert, else w8a16 (its GEMV, or a
# block per route, where few routes rarely share an expert: there x2 tied and adds the
# quantization launch). There w8a16's conversion of every weight tile to bf16 in registers costs
# more than a second fp8 dot chained on the first. On the H200 (benchmarks/triton_moe_peer.py
# --fp8-act w8a8x2, w8a16 timed beside it): 8 tokens, deepseek-v3's EP rank 116.8 us against
# 129.0, kimi-k2's 112.3 against 119.6, qwen3-235b-a22b 261.7 against 282.8 (qwen3-30b-a3b 92.2
# against 90.4); 64 tokens (BLOCK_M 16) 318.1 against 369.3 on deepseek-v3's EP rank, 586.3
# against 657.2 on qwen3-235b-a22b; 512 tokens on the EP ranks (BLOCK_M 32) 431.3 against 608.2
# and 617.2 against 882.7; 1 token (per-route GEMMs) within 1%. At BLOCK_M 64 (W8A8X2_PREFILL_*
# tiles) the stages benchmark's sweep: qwen3-30b-a3b at 512 tokens 282.7 us against w8a16's 304.4,
# qwen3-235b-a22b 937.3 against 1100.7. Where w8a16 takes 128-row blocks (4096 tokens), x2 on
# 64-row blocks was slower on two layers (qwen3-30b-a3b 1160.9 us against 1135.2, qwen3-235b-a22b
# 4158.5 against 4140.4) and 2% faster on deepseek-v3's EP rank (1428.5 against 1464.4), so
# w8a16 stays there.
W8A8X2_MAX_BLOCK_M = 64
# w8a8x2 tiles at 64-row blocks, each block's N tiles in turn, as timed. GEMM 1: swap-AB (the
# weights in wgmma's M, 128 per tile), 8 warps, 3 stages; in the usual order (the w8a8 prefill
# tiles) each of its K steps waits for four dots and x2 ran 1.2-1.4x slower than w8a16
# (qwen3-30b-a3b at 512 tokens 389.7 us against w8a16's 304.4; GEMM 1 258.0 against 147.7 swapped).
# GEMM 2 (one accumulator): the usual order, 4 warps, 4 stages; beside GEMM 1 swapped the call ran
# 1.0-1.3% faster than with GEMM 2 swapped on 8 warps (qwen3-30b-a3b at 512 tokens 280.3 us
# against 284.0, qwen3-235b-a22b 953.7 against 963.5; at 4096 tokens 1.9%).
W8A8X2_PREFILL_GEMM1 = dict(block_n=128, block_k=128, num_warps=8, num_stages=3, swap_ab=True)
W8A8X2_PREFILL_GEMM2 = dict(block_n=128, block_k=128, num_warps=4, num_stages=4, swap_ab=False)
# The mxfp4 and int4 paths on weights repacked by prepare_weights (the GEMMs at every size, no GEMV).
REPACKED = "repacked"
FP8_MMA_CAPABILITY = (8, 9)  # Ada and Hopper have e4m3 tensor cores; Ampere does not
# 128-row tiles hold 128 x 128 fp32 accumulators (two when gate and up are fused): a fourth stage
# measured slower on the H200 (qwen3-30b-a3b bf16, 4096 tokens, both GEMMs on 128-wide tiles).
MAX_STAGES_BLOCK_M_128 = 3
# bf16 GEMM 2 at 128-row blocks on GPUs with wgmma, where four 48 KiB stages fit: 256-wide N tiles
# on 4 stages (one 128 x 256 fp32 accumulator, as many registers as GEMM 1's gate and up tiles):
# each x tile loaded to shared memory feeds twice the columns, and the deeper pipeline covers the
# longer loads. On an H100 (benchmarks/triton_moe_stages.py --sweep, two runs; GEMM 2 alone, 256
# wide on 4 stages against 128 wide on 3): mixtral-8x7b at 4096 tokens 1828.8 us against 2081.4,
# at 512 420.3 against 449.9; at 4096 tokens qwen3-30b-a3b 290.8 against 307.2, qwen3-235b-a22b
# 1010.2 against 1083.2, gpt-oss-120b 932.0 against 971.9. 256 wide on 3 stages gained less on
# four layers (qwen3-235b-a22b 1093.1 us); on mixtral-8x7b at 4096 tokens the two depths swapped
# places between the runs (1753.3 against 1828.8 us in one, 1820.4 against 1755.3 in the other).
# 128 wide on 4 stages lost (qwen3-30b-a3b 348.5 against 303.9): the H200 reading above.
WIDE_PREFILL_GEMM2_BLOCK_N = 256
WIDE_PREFILL_STAGES = 4
# GEMM 1 there on 4 stages too, where a busy expert's rows span at most this many blocks: most of
# its weight tiles then come from memory, whose latency the fourth stage covers; where more blocks
# share each tile, L2 serves it to all but the first. On an H100 (--sweep deeper, two runs, GEMM 1
# alone, 4 stages against 3): mixtral-8x7b at 512 tokens (2 blocks) 753.9 / 743.7 us against
# 800.8 / 798.0, gpt-oss-120b at 4096 (2) 1786.0 / 1771.7 against 1888.1 / 1873.4, qwen3-30b-a3b
# (3) 498.9 against 525.6, qwen3-235b-a22b (3) 1955.5 / 1954.9 against 1953.9 / 1962.8, and
# mixtral-8x7b at 4096 (9 blocks) 3617.4 against 3583.6.
DEEP_GEMM1_MAX_EXPERT_BLOCKS = 4
W8A8_MAX_BLOCK_M = 64
W8A8_DECODE_MIN_BLOCK_N = 64


def token_bucket(tokens: int) -> int:
    """Configs are chosen per power-of-two bucket of tokens."""
    return 1 << max(0, math.ceil(math.log2(max(tokens, 1))))


@attrs.frozen
class GemmConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False  # W @ x.T: the weights dequantized in registers are the dot's first operand
    group_m: int = 1  # blocks that walk the N tiles together (1: each block's N tiles in turn)
    split_k: int = 1  # programs that share each tile's K steps (split_k.py)

    def describe(self) -> str:
        swap = " swap-AB" if self.swap_ab else ""
        group = f" group {self.group_m}" if self.group_m > 1 else ""
        split = f" split-K {self.split_k}" if self.split_k > 1 else ""
        return (f"BN {self.block_n} BK {self.block_k} warps {self.num_warps} stages {self.num_stages}"
                f"{swap}{group}{split}")


@attrs.frozen
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int

    def describe(self) -> str:
        return f"BN {self.block_n} BK {self.block_k} warps {self.num_warps}"


@attrs.frozen
class LaunchConfig:
    tokens_bucket: int
    block_m: int
    gemm1: GemmConfig
    gemm2: GemmConfig
    fp8_act: bool  # fp8 weights: True w8a8 (dynamic per-row activation quantization), False w8a16
    reasons: tuple  # one sentence per choice
    # The decode path (gemv.py) where set: GEMV 1 + activation, GEMV 2 + top-k sum; the GEMM
    # configs above are then unused.
    gemv1: Optional[GemvConfig] = None
    gemv2: Optional[GemvConfig] = None
    # Few routes, GEMMs without the grouping launch: each BLOCK_M block is one route.
    per_route: bool = False
    # w8a8: GEMM 1's output written as e4m3 + scales by its epilogue (else stored in 16 bits and
    # quantized in GEMM 2's registers). The layer's input is quantized by one launch before GEMM 1.
    h_fp8: bool = False
    # w8a8: e4m3 terms per activation (2: a high and a low term in units of one scale).
    act_terms: int = 1

    def describe(self) -> str:
        if self.gemv1 is not None:
            return f"GEMV1 [{self.gemv1.describe()}] GEMV2 + top-k sum [{self.gemv2.describe()}]"
        mode = ""
        if self.fp8_act:
            mode = (f" {FP8_ACT_NAMES[self.act_terms]}, h "
                    + ("e4m3 from GEMM1's epilogue" if self.h_fp8 else "quantized in GEMM2"))
        return (f"BLOCK_M {self.block_m}; GEMM1 [{self.gemm1.describe()}] GEMM2 [{self.gemm2.describe()}]"
                f"{mode}")


def _weight_bits(fmt: str) -> float:
    """Bits of one weight element as the kernel streams it through shared memory."""
    return {"bf16": 16, "fp8_block128": 8, "mxfp4": 4, "int4_g128": 4}[fmt]


def busiest_expert_routes(routes_per_expert: float) -> float:
    """Routes of a typically busy expert: the per-expert count of uniform routing is about Poisson,
    so the mean plus two standard deviations."""
    return routes_per_expert + 2 * math.sqrt(routes_per_expert)


def choose_block_m(routes_per_expert: float, smem: int) -> int:
    """The smallest tile that holds a busy expert's routes in one block, so that its weights are
    streamed once: an expert whose routes spill into a second block reads them twice, and below
    ~100 routes per expert the weights, not the tensor cores, bound the call (on the H200,
    mixtral-8x7b at 64 tokens, 16 routes per expert, ran at 77% of the copy rate with BLOCK_M 16).
    128 needs 160 KiB of shared memory per block, and at least BLOCK_M_128_MIN_ROUTES routes per
    expert so that half the rows of a tile are live."""
    busy = busiest_expert_routes(routes_per_expert)
    for candidate in (16, 32, 64):
        if busy <= candidate:
            return candidate
    if routes_per_expert >= BLOCK_M_128_MIN_ROUTES and smem >= 160 * 1024:
        return 128
    return 64


def _stage_bytes(block_m: int, block_n: int, block_k: int, tiles_n: int, a_bits: int,
                 w_bits: float) -> float:
    return block_m * block_k * a_bits / 8 + tiles_n * block_n * block_k * w_bits / 8


def _stages(block_m: int, block_n: int, block_k: int, tiles_n: int, a_bits: int, w_bits: float,
            smem: int, amd: bool) -> int:
    fit = int(smem // max(_stage_bytes(block_m, block_n, block_k, tiles_n, a_bits, w_bits), 1))
    return max(2, min(2 if amd else 4, fit))


def _gemm(n: int, tiles_n: int, block_m: int, blocks: float, decode: bool, fmt: str, fp8_act: bool,
          a_bits: int, sms: int, smem: int, amd: bool) -> GemmConfig:
    w_bits = _weight_bits(fmt)
    if decode:
        block_k = 128
        block_n = 64
        while block_n > MIN_DECODE_BLOCK_N and blocks * math.ceil(n / block_n) < PROGRAMS_PER_SM * sms:
            block_n //= 2
        warps = 4
    else:
        block_n = 128
        # fp8 activations are quantized per 128 columns, one K step each.
        block_k = 128 if fp8_act or fmt in ("int4_g128", "mxfp4") else 64
        warps = 8 if block_m >= 128 else 4
    # Two stages must fit: narrower N, then shorter K steps (whole fp8 blocks, int4 groups and
    # pairs of mxfp4 groups stay whole), on GPUs with little shared memory (64 KiB on AMD).
    min_k = 64 if fmt == "mxfp4" else 32
    while _stage_bytes(block_m, block_n, block_k, tiles_n, a_bits, w_bits) * 2 > smem:
        if block_n > 32:
            block_n //= 2
        elif block_k > min_k:
            block_k //= 2
        else:
            break
    stages = _stages(block_m, block_n, block_k, tiles_n, a_bits, w_bits, smem, amd)
    if block_m >= 128:
        stages = min(stages, MAX_STAGES_BLOCK_M_128)
    return GemmConfig(block_n, block_k, warps, stages)


def _repacked_tiles(fmt: str, tiles_1: int, block_m: int, smem: int, amd: bool,
                    swap_ab: Optional[bool]) -> tuple:
    """Repacked mxfp4 or int4 (gate and up rows in one GEMM 1 tile): swap-AB, the decoded weights as
    the dot's register operand (wgmma's M, no round trip through shared memory), with 64 weight rows
    per tile (one wgmma M) at BLOCK_M 16 (MXFP4_DECODE_STAGES deep), 1 token included, and 128 from
    BLOCK_M 32 (three stages). Two stages on AMD. Chosen by timing each config alone on gpt-oss-120b
    mxfp4 on the H200 and the H100 (the figures are in docs/backends/triton_moe.md); int4 has the
    same bytes per weight and per step."""
    rows = 64 if block_m <= 16 else 128
    warps = 8 if block_m >= 128 else 4

    def tile(tiles_n: int) -> GemmConfig:
        block_n = rows // tiles_n
        stage = _stage_bytes(block_m, block_n, 128, tiles_n, 16, _weight_bits("mxfp4"))
        stages = max(2, min(2 if amd else MXFP4_DECODE_STAGES if rows == 64 else 3, int(smem // stage)))
        return GemmConfig(block_n, 128, warps, stages, swap_ab=swap_ab is not False)

    gemm1, gemm2 = tile(tiles_1), tile(1)
    order = "swap-AB, the decoded weights as wgmma's register operand" if gemm1.swap_ab else "weights second"
    return gemm1, gemm2, f"repacked {fmt}: {order}, {rows} weight rows per tile (gate and up rows together)"


def _gemm_w8a8(n: int, tiles_n: int, block_m: int, blocks: float, decode: bool, sms: int,
               smem: int, act_terms: int) -> GemmConfig:
    """fp8 x fp8 tiles (NVIDIA sm_89+). BLOCK_K 128: one activation scale and one weight block
    scale per K step. Decode: swap-AB (the weights fill wgmma's M, the block's few rows its N, as
    vLLM 0.33.0 does on Hopper for M tiles below 64), BLOCK_N from 128 halving to
    W8A8_DECODE_MIN_BLOCK_N (wgmma's M is 64) until there are PROGRAMS_PER_SM programs per SM, and as
    many stages as let two programs share an SM (2 to 4). Prefill: 128-wide N tiles, so GEMM 1's
    epilogue quantizes whole 128-column groups of its output; 8 warps where gate and up are two
    accumulators (with the fp32 product of each K step that is 4 x BLOCK_M x 128 values held per
    program), else 4. On the H200 (qwen3-30b-a3b, 4096 tokens): GEMM 1 457.6 us with 8 warps against
    583.7 with 4, GEMM 2 262.4 with 4 against 386.7 with 8; BLOCK_M 128 with 128-wide gate and up
    tiles spills registers (GEMM 1 1205 us). w8a8x2 at prefill: W8A8X2_PREFILL_GEMM1 / _GEMM2,
    fewer stages only where they would not fit."""
    if act_terms == 2 and not decode:
        tile = W8A8X2_PREFILL_GEMM1 if tiles_n > 1 else W8A8X2_PREFILL_GEMM2
        # two e4m3 terms per activation (16 bits), the weight tile once
        stage = _stage_bytes(block_m, tile["block_n"], tile["block_k"], tiles_n, 16, 8)
        return GemmConfig(**dict(tile, num_stages=max(2, min(tile["num_stages"], int(smem // stage)))))
    block_k = 128
    stage = (lambda bn: _stage_bytes(block_m, bn, block_k, tiles_n, 8, _weight_bits("fp8_block128")))
    block_n = 128
    if decode:
        while block_n > W8A8_DECODE_MIN_BLOCK_N and blocks * math.ceil(n / block_n) < PROGRAMS_PER_SM * sms:
            block_n //= 2
        stages = max(2, min(4, int(smem // (2 * stage(block_n)))))
        return GemmConfig(block_n, block_k, 4, stages, swap_ab=True)
    while stage(block_n) * 2 > smem and block_n > 32:
        block_n //= 2
    return GemmConfig(block_n, block_k, 8 if tiles_n > 1 else 4, max(2, min(4, int(smem // stage(block_n)))))


def needs_grouping(n: int, block_n: int, expert_blocks: int, sms: int) -> bool:
    """Prefill: whether a GEMM's blocks must walk the N tiles in groups for a busy expert's weight
    tiles to be read from memory once. Walking each block's N tiles in turn, one program per SM,
    about sms / N-tiles blocks are in flight, consecutive ones, and blocks are sorted by expert:
    where they hold all of a busy expert's blocks, they read each weight tile at about the same
    time and L2 serves all but the first anyway, and a group only spreads the blocks' activation
    rows over more of L2. On an H100 (benchmarks/triton_moe_stages.py --sweep regrouped; each GEMM
    alone, without groups against groups of group_m): mixtral-8x7b's GEMM 1 at 4096 tokens (112
    N tiles of 128, a busy expert's 9 blocks of 128 rows) needs them, 5427.6 us against 3569.9;
    gpt-oss-120b's GEMM 2 (12 tiles of 256, 2 blocks) ran 874.4 against 938.5, qwen3-235b-a22b's
    (16 tiles, 3 blocks) 988.2 against 1001.9; fp8's swap-AB GEMM 1 (16 tiles of 128) at 4096
    tokens 714.3 against 751.4 on qwen3-30b-a3b (groups of 16, above the W8A16_SWAP_GROUP_M the
    rule takes there) and 921.5 against 958.1 on deepseek-v3's EP rank (groups of 4);
    each other GEMM timed (bf16 at 512 and 4096 tokens, fp8 at 4096) ran at most 0.4% slower
    without groups, or faster (up to 2.7%)."""
    return sms / math.ceil(n / block_n) < expert_blocks


def group_m(block_m: int, k: int, a_bits: int, l2_bytes: int) -> int:
    """Prefill: how many blocks walk the N tiles together, so each weight tile is read from memory
    once for all of them while it sits in L2 (an expert's weights exceed L2 for the large layers:
    mixtral-8x7b's w13 is 235 MB; walking one block's N tiles at a time streams them once per
    block). The blocks' activation rows, read once per N tile, are held to a quarter of L2."""
    g = MAX_GROUP_M
    while g > 1 and g * block_m * k * a_bits / 8 > l2_bytes / 4:
        g //= 2
    return g


def choose(spec, gpu, tokens: int, fp8_act: Union[bool, str, None] = None, gemv: Optional[bool] = None,
           swap_ab: Optional[bool] = None, mxfp4_path: str = REPACKED, int4_path: str = REPACKED,
           grouped_n: Optional[bool] = None) -> LaunchConfig:
    """The launch config for `tokens` tokens (rounded up to their bucket). fp8_act=True asks for
    w8a8 on fp8 weights, "x2" for w8a8 with two e4m3 terms per activation (the rule keeps w8a16
    where the GEMV path is faster, see below), False for w8a16; None leaves it to the rule (w8a8x2
    on GPUs with wgmma at blocks of at most W8A8X2_MAX_BLOCK_M rows, else w8a16); gemv=False keeps
    the grouped GEMMs at decode, gemv=True takes the GEMV path for every format that has one where
    routes are few enough; swap_ab forces the operand order of dequantized weights (fp8 w8a16, mxfp4
    through dot_scaled) either way; mxfp4_path and int4_path name the weights' layout (REPACKED or
    the checkpoint's paths, kernel.MXFP4_PATHS / INT4_PATHS); grouped_n=False walks each block's N
    tiles in turn everywhere, True groups the blocks wherever the rule may at prefill (None: where
    needs_grouping says; per-route blocks are grouped unless grouped_n is False)."""
    bucket = token_bucket(tokens)
    sms = (gpu.sm_count if gpu is not None else None) or DEFAULT_SMS
    smem = (gpu.smem_per_block_optin if gpu is not None else None) or DEFAULT_SMEM
    amd = gpu is not None and gpu.vendor == "amd"
    E = spec.local_experts
    routes = bucket * spec.top_k * spec.local_experts / spec.num_experts
    per_expert = routes / E
    block_m = choose_block_m(per_expert, smem)
    reasons = [f"{per_expert:.1f} routes per local expert expected at {bucket} tokens, a busy one "
               f"{busiest_expert_routes(per_expert):.0f} -> BLOCK_M {block_m}"]
    experts_hit = min(E, max(routes, 1.0))
    blocks = experts_hit * math.ceil(max(per_expert, 1.0) / block_m)
    expert_blocks = math.ceil(busiest_expert_routes(per_expert) / block_m)  # a busy expert's routes
    decode = block_m <= 32
    fp8 = spec.weight_format == "fp8_block128"
    # The interpreter (no GPU) runs fp8 dots in software.
    fp8_mma = gpu is None or _has_fp8_mma(gpu)
    # Where the 16-bit GEMV path runs, and where each block is one route (both reused below): w8a8x2 pays
    # only elsewhere, where a block's rows share each weight tile.
    on_gemv = gemv is not False and uses_gemv(spec, bucket, False, sms, gemv)
    route_blocks = few_routes(spec, bucket) and not spec.is_ep
    x2_by_rule = (fp8 and fp8_act is None and gpu is not None and gpu.features.wgmma and fp8_mma
                  and block_m <= W8A8X2_MAX_BLOCK_M and not on_gemv and not route_blocks)
    if x2_by_rule:
        fp8_act = "x2"
    act_terms = 2 if fp8_act == "x2" else 1
    if fp8 and fp8_act and not fp8_mma:
        reasons.append("w8a8 asked for, but this GPU has no fp8 tensor cores: w8a16")
    fp8_act = fp8 and bool(fp8_act) and fp8_mma
    if fp8_act and on_gemv:
        # On the H200 at 1 token: deepseek-v3's EP rank 19.4 us on the GEMV against 37.8 w8a8
        # (21.5 with the input quantized by the launch, timed alone), kimi-k2's 14.7 against 24.1.
        fp8_act = False
        reasons.append("w8a8 asked for, but with this few routes the w8a16 GEMV (more accurate) is faster")
    elif fp8_act and act_terms == 2:
        why = (f"BLOCK_M {block_m}: a second fp8 dot costs less than converting every weight tile to "
               "16 bits" if x2_by_rule else "asked for")
        reasons.append(f"w8a8x2 ({why}): each activation as two e4m3 terms in units of one scale per row "
                       "and 128 columns (the second is what the first leaves), two fp8 x fp8 dots per K step "
                       "chained on one accumulator, within the 1e-2 contract")
    elif fp8_act:
        reasons.append("w8a8 asked for: fp8 activations quantized per row and 128 columns, fp8 x fp8 dots")
    elif fp8:
        reasons.append("w8a16: e4m3 weights converted in registers, 16-bit activations keep the 1e-2 "
                       "contract (w8a8, about 4% off, is asked for with fp8_act=True)")
    a_bits = 8 if fp8_act else 16
    tiles_1 = 2 if spec.gated else 1
    if fp8_act:
        if block_m > W8A8_MAX_BLOCK_M:
            block_m = W8A8_MAX_BLOCK_M
            blocks = experts_hit * math.ceil(max(per_expert, 1.0) / block_m)
            reasons.append(f"w8a8: BLOCK_M {block_m} (the fp32 product of each K step doubles the "
                           "accumulators held in registers)")
        gemm1 = _gemm_w8a8(spec.intermediate_size, tiles_1, block_m, blocks, decode, sms, smem, act_terms)
        gemm2 = _gemm_w8a8(spec.hidden_size, 1, block_m, blocks, decode, sms, smem, act_terms)
        if swap_ab is False:
            gemm1, gemm2 = attrs.evolve(gemm1, swap_ab=False), attrs.evolve(gemm2, swap_ab=False)
        elif swap_ab:
            gemm1, gemm2 = attrs.evolve(gemm1, swap_ab=True), attrs.evolve(gemm2, swap_ab=True)
    else:
        gemm1 = _gemm(spec.intermediate_size, tiles_1, block_m, blocks, decode, spec.weight_format, fp8_act,
                      a_bits, sms, smem, amd)
        gemm2 = _gemm(spec.hidden_size, 1, block_m, blocks, decode, spec.weight_format, fp8_act, a_bits, sms,
                      smem, amd)
        wide_prefill = (spec.weight_format == "bf16" and block_m >= 128 and gpu is not None
                        and gpu.features.wgmma)
        if wide_prefill and _stages(block_m, WIDE_PREFILL_GEMM2_BLOCK_N, gemm2.block_k, 1, a_bits,
                                    _weight_bits("bf16"), smem, amd) >= WIDE_PREFILL_STAGES:
            gemm2 = attrs.evolve(gemm2, block_n=WIDE_PREFILL_GEMM2_BLOCK_N, num_stages=WIDE_PREFILL_STAGES)
            reasons.append(f"bf16 at BLOCK_M {block_m} (wgmma): GEMM 2 on {WIDE_PREFILL_GEMM2_BLOCK_N}-wide "
                           f"N tiles and {WIDE_PREFILL_STAGES} stages, each x tile feeding twice the columns")
        if (wide_prefill and expert_blocks <= DEEP_GEMM1_MAX_EXPERT_BLOCKS
                and _stages(block_m, gemm1.block_n, gemm1.block_k, tiles_1, a_bits, _weight_bits("bf16"),
                            smem, amd) >= WIDE_PREFILL_STAGES):
            gemm1 = attrs.evolve(gemm1, num_stages=WIDE_PREFILL_STAGES)
            reasons.append(f"GEMM 1 on {WIDE_PREFILL_STAGES} stages: a busy expert's {expert_blocks} blocks "
                           "read most of its weight tiles from memory, not from L2")
        steps = math.ceil(spec.intermediate_size / gemm2.block_k)
        if decode and spec.weight_format == "bf16" and steps >= LONG_K_DECODE_STEPS and not route_blocks:
            gemm2 = attrs.evolve(gemm2, num_stages=min(gemm2.num_stages, LONG_K_DECODE_STAGES))
            reasons.append(f"GEMM 2's {steps} K steps at decode: {gemm2.num_stages} stages, so more of its "
                           "programs share an SM")
    repacked = ((spec.weight_format == "mxfp4" and mxfp4_path == REPACKED)
                or (spec.weight_format == "int4_g128" and int4_path == REPACKED))
    if repacked:
        gemm1, gemm2, why = _repacked_tiles(spec.weight_format, tiles_1, block_m, smem, amd, swap_ab)
        reasons.append(why)
    # Not for mxfp4, whose prefill is bound by the e2m1 decode in registers, not by weight reads
    # (measured with dot_scaled): on the H200 gpt-oss-120b at 4096 tokens ran 5008 us with groups of
    # 16 against 4803 without. Elsewhere where needs_grouping says so.
    x2_prefill = fp8_act and act_terms == 2 and not decode  # its tiles as timed (W8A8X2_PREFILL_*)
    if not decode and grouped_n is not False and spec.weight_format != "mxfp4" and not x2_prefill:
        l2 = (gpu.l2_bytes if gpu is not None else None) or DEFAULT_L2

        def grouping(n: int, block_n: int, k: int) -> int:
            needed = grouped_n or needs_grouping(n, block_n, expert_blocks, sms)
            return group_m(block_m, k, a_bits, l2) if needed else 1

        gemm1 = attrs.evolve(gemm1, group_m=grouping(spec.intermediate_size, gemm1.block_n, spec.hidden_size))
        gemm2 = attrs.evolve(gemm2, group_m=grouping(spec.hidden_size, gemm2.block_n, spec.intermediate_size))
        if max(gemm1.group_m, gemm2.group_m) > 1:
            reasons.append(f"groups of {gemm1.group_m}/{gemm2.group_m} blocks (GEMM 1/2) walk the N tiles "
                           "together where the blocks in flight, one per SM, hold fewer than a busy "
                           f"expert's {expert_blocks}: each weight tile is read once per group while it "
                           f"sits in {l2 >> 20} MiB of L2")
        else:
            reasons.append(f"each block walks its N tiles in turn: the blocks in flight, one per SM, hold a "
                           f"busy expert's {expert_blocks}, which read each weight tile while it sits in L2")
    if (fp8 and not fp8_act and swap_ab is None and block_m >= W8A16_SWAP_MIN_BLOCK_M and gpu is not None
            and gpu.features.wgmma):
        gemm1 = attrs.evolve(gemm1, swap_ab=True, block_k=128, group_m=min(gemm1.group_m, W8A16_SWAP_GROUP_M),
                             num_stages=min(3, _stages(block_m, gemm1.block_n, 128, tiles_1, a_bits,
                                                       _weight_bits(spec.weight_format), smem, amd)))
        reasons.append("w8a16 prefill: GEMM1 swap-AB with BLOCK_K 128, the scaled weights as wgmma's "
                       "register operand and x straight from memory, so its dots stay in flight across K "
                       "steps")
    h_fp8 = fp8_act and gemm1.block_n == 128
    if fp8_act:
        if gemm1.swap_ab:
            reasons.append(f"{FP8_ACT_NAMES[act_terms]}: swap-AB, the weights as the dot's first operand "
                           "(wgmma's M)")
        # Quantizing x in GEMM 1's registers instead (no launch, but once per N tile, on each K
        # step's critical path): on the H200 GEMM 1 took 4-55% longer at decode (deepseek-v3's EP
        # rank at 8 tokens 69.1 against 48.2 us).
        reasons.append(f"{FP8_ACT_NAMES[act_terms]}: x quantized once per call, in the grouping launch; h "
                       + (f"written as {FP8_TERMS[act_terms]} + scales by GEMM1's epilogue (128-wide N tiles)"
                          if h_fp8 else "stored in 16 bits, quantized in GEMM2's registers"))
    if swap_ab and ((fp8 and not fp8_act) or (spec.weight_format == "mxfp4" and mxfp4_path != "bits")):
        # On request for both GEMMs: on the H200 swap-AB for both ran slower: qwen3-30b-a3b fp8
        # at 512 tokens 430.6 us against 303.5, gpt-oss-120b mxfp4 through dot_scaled at 4096
        # tokens 12027 against 4760 (the w8a16 prefill's GEMM 1 alone gains, above).
        gemm1, gemm2 = attrs.evolve(gemm1, swap_ab=True), attrs.evolve(gemm2, swap_ab=True)
        reasons.append("swap-AB (asked for): W @ x.T, the dequantized weights as the dot's first operand")
    if decode:
        reasons.append(f"decode: ~{blocks:.0f} expert blocks; BLOCK_N {gemm1.block_n}/{gemm2.block_n} "
                       f"gives >= {PROGRAMS_PER_SM} programs per SM on {sms} SMs where N allows")
    else:
        reasons.append(f"prefill: N tiles of {gemm1.block_n}/{gemm2.block_n} per program (GEMM 1's for gate "
                       "and up each when fused)")
    reasons.append(f"stages from {smem // 1024} KiB of shared memory per block" + (" (AMD: 2)" if amd else "")
                   + (" (w8a8x2's 64-row tiles: 3 at most)" if x2_prefill else ""))
    if gemv is False or repacked or not uses_gemv(spec, bucket, fp8_act, sms, gemv):
        # Without an expert map, as vLLM 0.33.0's naive block assignment: under EP most routes
        # are elsewhere and the local ones share experts more often (deepseek-v3's EP rank at 8
        # tokens: 146.2 us per route against 128.5 grouped).
        per_route = route_blocks
        if decode and _weight_bits(spec.weight_format) == 4:
            units = max(routes, 1.0) if per_route else blocks
            programs1 = units * math.ceil(spec.intermediate_size / gemm1.block_n)
            programs2 = units * math.ceil(spec.hidden_size / gemm2.block_n)
            gemm1 = attrs.evolve(gemm1, split_k=split_k_for(programs1, spec.hidden_size, gemm1.block_k, sms))
            gemm2 = attrs.evolve(gemm2, split_k=split_k_for(programs2, spec.intermediate_size, gemm2.block_k,
                                                            sms))
            if max(gemm1.split_k, gemm2.split_k) > 1:
                reasons.append(f"K split {gemm1.split_k}/{gemm2.split_k} ways (GEMM 1/2): ~{units:.0f} "
                               f"blocks' N tiles leave SMs idle; the last split of a tile sums the partials "
                               "in split order and runs the epilogue")
        if per_route:
            reasons.append(f"{bucket * spec.top_k} routes over {spec.num_experts} experts (x "
                           f"{GEMV_ROUTE_SHARE} <= experts): one block per route, its expert read from "
                           "topk_ids by the GEMMs, no grouping launch")
            if grouped_n is not False:
                gemm1 = attrs.evolve(gemm1, group_m=PER_ROUTE_GROUP_M)
                gemm2 = attrs.evolve(gemm2, group_m=PER_ROUTE_GROUP_M)
                reasons.append(f"the routes walk the N tiles together (groups of {PER_ROUTE_GROUP_M}), so "
                               "routes that share an expert read each weight tile while it sits in L2")
        return LaunchConfig(bucket, block_m, gemm1, gemm2, fp8_act, tuple(reasons), per_route=per_route,
                            h_fp8=h_fp8, act_terms=act_terms if fp8_act else 1)
    gemv1 = _gemv(spec.intermediate_size, spec.hidden_size, max(routes, 1.0), spec.weight_format, sms)
    gemv2 = _gemv(spec.hidden_size, spec.intermediate_size, bucket, spec.weight_format, sms)
    reasons = [r for r in reasons if "w8a" in r]
    reasons.append(f"{bucket * spec.top_k} routes over {spec.num_experts} experts (x {GEMV_ROUTE_SHARE} <= "
                   "experts): experts rarely share a route, so one GEMV per route on the CUDA cores, no "
                   "grouping, the top-k sum inside GEMV 2: two launches")
    reasons.append(f"BLOCK_N {gemv1.block_n}/{gemv2.block_n} gives >= {GEMV_PROGRAMS_PER_SM} programs per "
                   f"SM on {sms} SMs where N allows; BLOCK_K fills "
                   f"{GEMV_TILE_VALUES[spec.weight_format]}-value tiles")
    return LaunchConfig(bucket, block_m, gemm1, gemm2, fp8_act, tuple(reasons), gemv1, gemv2)


def split_k_for(programs: float, k: int, block_k: int, sms: int) -> int:
    """How many programs share each tile's K steps: 1 where `programs` give every SM one."""
    split = 1
    if programs >= sms:
        return split
    steps = math.ceil(k / block_k)
    while (split * 2 <= SPLIT_K_MAX and programs * split * 2 <= sms * PROGRAMS_PER_SM
           and steps // (split * 2) >= SPLIT_K_MIN_STEPS):
        split *= 2
    return split


def _gemv(n: int, k: int, units: float, fmt: str, sms: int) -> GemvConfig:
    """BLOCK_N halves from GEMV_MAX_BLOCK_N until `units` (routes or tokens) x N tiles give
    GEMV_PROGRAMS_PER_SM programs per SM; BLOCK_K then makes the tile GEMV_TILE_VALUES values
    (about 8 KiB of bf16, 4 KiB of fp8 or mxfp4 per load), no longer than K needs."""
    block_n = GEMV_MAX_BLOCK_N
    while block_n > GEMV_MIN_BLOCK_N and units * math.ceil(n / block_n) < GEMV_PROGRAMS_PER_SM * sms:
        block_n //= 2
    values = GEMV_TILE_VALUES[fmt]
    unit = 32 if fmt == "mxfp4" else 128  # one mxfp4 scale group / one fp8 scale block
    block_k = max(unit, min(values // block_n, 1 << math.ceil(math.log2(max(k, unit)))))
    return GemvConfig(block_n, block_k, 8 if values > 4096 else 4)


def few_routes(spec, bucket: int) -> bool:
    """Experts rarely share a route (the rule of vLLM 0.33.0's naive block assignment: routes x 4
    <= experts), so grouping routes by expert saves no weight reads."""
    return bucket * spec.top_k * GEMV_ROUTE_SHARE <= spec.num_experts


def uses_gemv(spec, bucket: int, fp8_act: bool, sms: int, forced: Optional[bool] = None) -> bool:
    """The decode GEMV path: few routes, 16-bit activations, and (by the rule) a tensor-core GEMM 1
    too small to keep the GPU streaming (GEMV_RULE_PROGRAMS_PER_SM); forced=True: every format
    with a GEMV step."""
    fmt = spec.weight_format
    if fp8_act or not few_routes(spec, bucket) or fmt not in GEMV_FORMATS:
        return False
    if forced:
        return True
    local_routes = max(bucket * spec.top_k * spec.local_experts / spec.num_experts, 1.0)
    programs = local_routes * math.ceil(spec.intermediate_size / GEMV_RULE_TILE_N)
    return programs < GEMV_RULE_PROGRAMS_PER_SM.get(fmt, 0) * sms


def _has_fp8_mma(gpu) -> bool:
    if gpu is None or gpu.vendor != "nvidia":
        return False
    cc: Optional[tuple] = gpu.compute_capability
    return cc is not None and cc >= FP8_MMA_CAPABILITY


def max_rows(tokens: int, spec, block_m: int) -> tuple:
    """(padded rows, blocks) that any routing of `tokens` tokens can need: every route, plus at
    most BLOCK_M - 1 pad rows per expert that receives a route."""
    routes = tokens * spec.top_k
    blocks = math.ceil(routes / block_m) + min(spec.local_experts, routes)
    return blocks * block_m, blocks
