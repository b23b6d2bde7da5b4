"""The masked W4AFP8 layer on the GPU: the prepared weights and the two GEMM launches.

    GEMM 1   x [E, max_m, H] FP8 (per-tensor, or per-token-group and requantized in registers)
             @ W13 -> activation -> FP8 h [E, max_m, I] with 1 / w2_input_scale
    GEMM 2   h @ W2 -> bf16 out [E, max_m, H]

Only rows below masked_m[e] are read or written, h included."""

from __future__ import annotations

import math
from typing import Optional

import attrs
import torch
import triton.language as tl
from hal.backends.w4afp8 import (
    configs,
    triton_decode,
    triton_feed,
    triton_kernels,
    triton_planes,
    triton_split_k,
)

from hal.spec import MoESpec

# torch dtype of the MMA operands -> the Triton dtype the kernels convert them to.
DOT_DTYPES = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e4m3fnuz: tl.float8e4b8,
              torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


# folded or not -> the MMA dtypes triton_decode's PTX unpack writes
_MAGIC_DOT_DTYPES = {False: (torch.bfloat16,), True: (torch.float16,)}


@attrs.frozen
class PreparedW4AFp8:
    """The checkpoint's uint4b8 weights blocked by K group, as the GEMMs read them: each group's
    [N, 128] tile is one contiguous run, K contiguous per output column. q13 int32
    [E, H / 128, w13_rows, 16] (gated: gate rows [0, I), up rows [I, 2I)), s13 bf16
    [E, H / 128, w13_rows] in the same column order, q2 int32 [E, I / 128, H, 16], s2 bf16
    [E, I / 128, H], and the static per-tensor input scales as fp32 [1] tensors. fold13 / fold2:
    the power of two the folded path multiplies each weight tensor's scales by (`fold_shift`), or
    None where its scales cannot be folded exactly."""

    q13: torch.Tensor
    s13: torch.Tensor
    q2: torch.Tensor
    s2: torch.Tensor
    w13_input_scale: torch.Tensor
    w2_input_scale: torch.Tensor
    fold13: Optional[float] = None
    fold2: Optional[float] = None

    @property
    def foldable(self) -> bool:
        return self.fold13 is not None and self.fold2 is not None


# fp16: the smallest normal, and the largest (q - 8) * s * 2^c the folded path lets a weight reach
# (|q - 8| <= 8 times 2^12 is 2^15, below fp16's 65504).
FP16_MIN_NORMAL = 2.0**-14
FOLDED_SCALE_MAX = 2.0**12


def fold_shift(scales: torch.Tensor) -> Optional[float]:
    """The power of two 2^c that puts every nonzero |s| * 2^c in [2^-14, 2^12]: there (q - 8) * s *
    2^c is a normal fp16 with at most 11 significant bits, so the folded weight tile is exact.
    None where the scales span more than that range or are not finite."""
    magnitudes = scales.detach().float().abs()
    nonzero = magnitudes[magnitudes > 0]
    if nonzero.numel() == 0:
        return 1.0
    top, low = float(nonzero.max()), float(nonzero.min())
    if not math.isfinite(top):
        return None
    shift = 2.0 ** math.floor(math.log2(FOLDED_SCALE_MAX / top))
    return shift if low * shift >= FP16_MIN_NORMAL else None


def _input_scale(value: torch.Tensor, name: str, device) -> torch.Tensor:
    scale = value.to(device=device, dtype=torch.float32).reshape(1)
    number = float(scale)
    if not 0 < number < float("inf"):
        raise ValueError(f"weights.{name}={number}: expected a finite value > 0")
    return scale


def _blocked(packed: torch.Tensor) -> torch.Tensor:
    """GPTQ int32 [E, K / 8, N] -> [E, K / 128, N, 16]: a K group of one column is 16 consecutive
    words, and a group's columns follow one another."""
    E, words, N = packed.shape
    per_group = configs.GROUP_K // 8
    return packed.reshape(E, words // per_group, per_group, N).transpose(2, 3).contiguous()


def prepare(spec: MoESpec, weights, device: torch.device) -> PreparedW4AFp8:
    """Repack once: block the GPTQ containers by K group with K contiguous per output column, and
    split swiglu_oai's interleaved gate/up columns into two halves."""
    q13, s13 = weights.w13.to(device), weights.w13_scale.to(device)
    if spec.activation == "swiglu_oai":
        rows = spec.w13_rows
        order = torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)]).to(device)
        q13, s13 = q13.index_select(-1, order), s13.index_select(-1, order)
    s13 = s13.to(torch.bfloat16).contiguous()
    s2 = weights.w2_scale.to(device=device, dtype=torch.bfloat16).contiguous()
    return PreparedW4AFp8(
        q13=_blocked(q13), s13=s13, q2=_blocked(weights.w2.to(device)), s2=s2,
        w13_input_scale=_input_scale(weights.w13_input_scale, "w13_input_scale", device),
        w2_input_scale=_input_scale(weights.w2_input_scale, "w2_input_scale", device),
        fold13=fold_shift(s13), fold2=fold_shift(s2))


def launch_options(tile: configs.GemmTile) -> dict:
    """Triton launch options of a tile: warps, stages and, where the tile holds one, a register cap."""
    options = dict(num_warps=tile.num_warps, num_stages=tile.num_stages)
    if tile.max_registers is not None:
        options["maxnreg"] = tile.max_registers
    return options


def _split_workspace(experts: int, m_programs: int, n: int, tile: configs.GemmTile, accumulators: int,
                     split_k: int, device) -> tuple:
    """(fp32 workspace, int32 counters) of a split-K launch, zeroed in one allocation; empty
    tensors without a split."""
    if split_k == 1:
        empty = torch.empty(0, dtype=torch.float32, device=device)
        return empty, empty.view(torch.int32)
    tiles = triton_split_k.split_tiles(experts, m_programs, n, tile.block_n)
    sums = tiles * accumulators * tile.block_n * tile.block_m
    buffer = torch.zeros(sums + tiles, dtype=torch.float32, device=device)
    return buffer[:sums], buffer[sums:].view(torch.int32)


def _ordered_workspace(experts: int, m_programs: int, n: int, tile: configs.GemmTile,
                       accumulators: int, split_k: int, device) -> tuple:
    """(fp32 workspace, zeroed int32 counters) of a split-K planes launch: every split stores its
    partial tile in its own slot, so only the counters start at zero; empty tensors without a
    split."""
    if split_k == 1:
        empty = torch.empty(0, dtype=torch.float32, device=device)
        return empty, empty.view(torch.int32)
    tiles = triton_split_k.split_tiles(experts, m_programs, n, tile.block_n)
    sums = torch.empty(tiles * accumulators * split_k * tile.block_n * tile.block_m,
                       dtype=torch.float32, device=device)
    return sums, torch.zeros(tiles, dtype=torch.int32, device=device)


def requant_to_f16(x: torch.Tensor, x_scale: torch.Tensor, masked_m: torch.Tensor, data: PreparedW4AFp8,
                   out: torch.Tensor) -> None:
    """out (fp16 [E, max_m, H]) = the per-tensor FP8 values of per-token-group FP8 x on live rows."""
    E, max_m, hidden = x.shape
    triton_feed.requant_to_f16_kernel[triton_feed.grid(E, hidden, max_m)](
        x, x_scale, masked_m, data.w13_input_scale, out, max_m, hidden, *x_scale.stride(),
        float(torch.finfo(x.dtype).max), BLOCK_H=triton_feed.BLOCK_H, GROUP_K=configs.GROUP_K,
        num_warps=triton_feed.NUM_WARPS)


def gemm1(spec: MoESpec, x: torch.Tensor, x_scale: Optional[torch.Tensor], masked_m: torch.Tensor,
          data: PreparedW4AFp8, h: torch.Tensor, tile: configs.GemmTile, m_programs: int,
          dot_dtype: torch.dtype, magic_unpack: bool = False, split_k: int = 1,
          fp8_dtype: Optional[torch.dtype] = None) -> None:
    """h = fp8(act(x @ W13) / s2) on live rows. x_scale None: x holds per-tensor FP8 values with
    scale s13 (as FP8, or as fp16 on the folded path); else x is per-token-group FP8 and is
    requantized to that per-tensor FP8 in registers. h holds FP8 values of fp8_dtype (default x's
    dtype): as FP8, or as fp16 on the folded path.
    A transposed tile runs triton_decode's GEMM (weights on the MMA's M side), with magic_unpack
    its PTX unpack when the MMA is 16-bit and K split over split_k programs, the weight scales
    folded into the fp16 tile on the "folded" path; the "fp8" path runs triton_kernels' GEMM
    (split_k 1)."""
    E, max_m, hidden = x.shape
    inter = spec.intermediate_size
    group_scaled = x_scale is not None
    strides = x_scale.stride() if group_scaled else (0, 0, 0)
    args = (x, x_scale if group_scaled else x, masked_m)
    fp8_dtype = fp8_dtype or x.dtype
    scalars = (max_m, hidden, inter, spec.w13_rows, *strides, float(torch.finfo(fp8_dtype).max),
               float(spec.swiglu_alpha), float(spec.swiglu_limit))
    fold = tile.path == "folded"
    common = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, GROUP_K=configs.GROUP_K,
                  ACTIVATION=triton_kernels.ACTIVATION_CODES[spec.activation], GROUP_SCALED=group_scaled,
                  DOT_DTYPE=DOT_DTYPES[dot_dtype], **launch_options(tile))
    if tile.path == "planes":
        ws, counters = _ordered_workspace(E, m_programs, inter, tile, 2, split_k, x.device)
        triton_planes.w4a8_planes_gemm1_kernel[
            triton_split_k.grid(m_programs, inter, tile.block_n, E, split_k)](
            *args, data.q13, data.s13, data.w13_input_scale, data.w2_input_scale, h, ws, counters,
            m_programs, *scalars, SPLIT_K=split_k, MAGIC=magic_unpack, **common)
    elif tile.transposed:
        ws, counters = _split_workspace(E, m_programs, inter, tile, 2, split_k, x.device)
        triton_decode.w4a8_decode_gemm1_kernel[
            triton_split_k.grid(m_programs, inter, tile.block_n, E, split_k)](
            *args, data.q13.view(torch.int16), data.s13, data.w13_input_scale, data.w2_input_scale, h,
            ws, counters, m_programs, *scalars, data.fold13 if fold else 1.0, SPLIT_K=split_k,
            MAGIC=magic_unpack and dot_dtype in _MAGIC_DOT_DTYPES[fold], FOLD=fold,
            FP8=DOT_DTYPES[fp8_dtype], **common)
    else:
        triton_kernels.w4a8_gemm1_kernel[triton_kernels.grid(m_programs, inter, tile.block_n, E)](
            *args, data.q13, data.s13, data.w13_input_scale, data.w2_input_scale, h, *scalars, **common)


def gemm2(spec: MoESpec, h: torch.Tensor, masked_m: torch.Tensor, data: PreparedW4AFp8,
          out: torch.Tensor, tile: configs.GemmTile, m_programs: int, dot_dtype: torch.dtype,
          magic_unpack: bool = False, split_k: int = 1) -> None:
    """out = bf16((h @ W2) * s2) on live rows; split_k > 1 (transposed tiles only) splits K."""
    E, max_m, inter = h.shape
    hidden = spec.hidden_size
    fold = tile.path == "folded"
    common = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, GROUP_K=configs.GROUP_K,
                  DOT_DTYPE=DOT_DTYPES[dot_dtype], **launch_options(tile))
    if tile.path == "planes":
        ws, counters = _ordered_workspace(E, m_programs, hidden, tile, 1, split_k, h.device)
        triton_planes.w4a8_planes_gemm2_kernel[
            triton_split_k.grid(m_programs, hidden, tile.block_n, E, split_k)](
            h, masked_m, data.q2, data.s2, data.w2_input_scale, out, ws, counters, m_programs, max_m,
            inter, hidden, SPLIT_K=split_k, MAGIC=magic_unpack, **common)
    elif tile.transposed:
        ws, counters = _split_workspace(E, m_programs, hidden, tile, 1, split_k, h.device)
        triton_decode.w4a8_decode_gemm2_kernel[
            triton_split_k.grid(m_programs, hidden, tile.block_n, E, split_k)](
            h, masked_m, data.q2.view(torch.int16), data.s2, data.w2_input_scale, out, ws, counters,
            m_programs, max_m, inter, hidden, data.fold2 if fold else 1.0, SPLIT_K=split_k,
            MAGIC=magic_unpack and dot_dtype in _MAGIC_DOT_DTYPES[fold], FOLD=fold, **common)
    else:
        triton_kernels.w4a8_gemm2_kernel[triton_kernels.grid(m_programs, hidden, tile.block_n, E)](
            h, masked_m, data.q2, data.s2, data.w2_input_scale, out, max_m, inter, hidden, **common)
