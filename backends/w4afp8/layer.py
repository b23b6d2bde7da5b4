"""The masked W4AFP8 layer on the GPU: the prepared weights and the two GEMM launches.

    GEMM 1   x [E, max_m, H] FP8 (per-tensor, or per-token-group and requantized in registers)
             @ W13 -> activation -> FP8 h [E, max_m, I] with 1 / w2_input_scale
    GEMM 2   h @ W2 -> bf16 out [E, max_m, H]

Only rows below masked_m[e] are read or written, h included."""

from __future__ import annotations

from typing import Optional

import attrs
import torch
import triton.language as tl

from backends.w4afp8 import configs, triton_decode, triton_kernels, triton_planes
from hal.spec import MoESpec

# torch dtype of the MMA operands -> the Triton dtype the kernels convert them to.
DOT_DTYPES = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e4m3fnuz: tl.float8e4b8,
              torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@attrs.frozen
class PreparedW4AFp8:
    """The checkpoint's uint4b8 weights blocked by K group, as the GEMMs read them: each group's
    [N, 128] tile is one contiguous run, K contiguous per output column. q13 int32
    [E, H / 128, w13_rows, 16] (gated: gate rows [0, I), up rows [I, 2I)), s13 bf16
    [E, H / 128, w13_rows] in the same column order, q2 int32 [E, I / 128, H, 16], s2 bf16
    [E, I / 128, H], and the static per-tensor input scales as fp32 [1] tensors."""

    q13: torch.Tensor
    s13: torch.Tensor
    q2: torch.Tensor
    s2: torch.Tensor
    w13_input_scale: torch.Tensor
    w2_input_scale: torch.Tensor


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
    return PreparedW4AFp8(
        q13=_blocked(q13), s13=s13.to(torch.bfloat16).contiguous(), q2=_blocked(weights.w2.to(device)),
        s2=weights.w2_scale.to(device=device, dtype=torch.bfloat16).contiguous(),
        w13_input_scale=_input_scale(weights.w13_input_scale, "w13_input_scale", device),
        w2_input_scale=_input_scale(weights.w2_input_scale, "w2_input_scale", device))


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
    tiles = triton_decode.workspace_slots(experts, m_programs, n, tile.block_n, 1)
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
    tiles = triton_decode.workspace_slots(experts, m_programs, n, tile.block_n, 1)
    sums = torch.empty(tiles * accumulators * split_k * tile.block_n * tile.block_m,
                       dtype=torch.float32, device=device)
    return sums, torch.zeros(tiles, dtype=torch.int32, device=device)


def gemm1(spec: MoESpec, x: torch.Tensor, x_scale: Optional[torch.Tensor], masked_m: torch.Tensor,
          data: PreparedW4AFp8, h: torch.Tensor, tile: configs.GemmTile, m_programs: int,
          dot_dtype: torch.dtype, magic_unpack: bool = False, split_k: int = 1) -> None:
    """h = fp8(act(x @ W13) / s2) on live rows. x_scale None: x is per-tensor FP8 with scale s13;
    else x is per-token-group FP8 and is requantized to that per-tensor FP8 in registers.
    A transposed tile runs triton_decode's GEMM (weights on the MMA's M side), with magic_unpack
    its PTX unpack when the MMA is bf16 and K split over split_k programs; the "fp8" path runs
    triton_kernels' GEMM (split_k 1)."""
    E, max_m, hidden = x.shape
    inter = spec.intermediate_size
    group_scaled = x_scale is not None
    strides = x_scale.stride() if group_scaled else (0, 0, 0)
    args = (x, x_scale if group_scaled else x, masked_m)
    scalars = (max_m, hidden, inter, spec.w13_rows, *strides, float(torch.finfo(x.dtype).max),
               float(spec.swiglu_alpha), float(spec.swiglu_limit))
    common = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, GROUP_K=configs.GROUP_K,
                  ACTIVATION=triton_kernels.ACTIVATION_CODES[spec.activation], GROUP_SCALED=group_scaled,
                  DOT_DTYPE=DOT_DTYPES[dot_dtype], **launch_options(tile))
    if tile.path == "planes":
        ws, counters = _ordered_workspace(E, m_programs, inter, tile, 2, split_k, x.device)
        triton_planes.w4a8_planes_gemm1_kernel[
            triton_decode.grid(m_programs, inter, tile.block_n, E, split_k)](
            *args, data.q13, data.s13, data.w13_input_scale, data.w2_input_scale, h, ws, counters,
            m_programs, *scalars, SPLIT_K=split_k, MAGIC=magic_unpack, **common)
    elif tile.transposed:
        ws, counters = _split_workspace(E, m_programs, inter, tile, 2, split_k, x.device)
        triton_decode.w4a8_decode_gemm1_kernel[
            triton_decode.grid(m_programs, inter, tile.block_n, E, split_k)](
            *args, data.q13.view(torch.int16), data.s13, data.w13_input_scale, data.w2_input_scale, h,
            ws, counters, m_programs, *scalars, SPLIT_K=split_k,
            MAGIC=magic_unpack and dot_dtype == torch.bfloat16, **common)
    else:
        triton_kernels.w4a8_gemm1_kernel[triton_kernels.grid(m_programs, inter, tile.block_n, E)](
            *args, data.q13, data.s13, data.w13_input_scale, data.w2_input_scale, h, *scalars, **common)


def gemm2(spec: MoESpec, h: torch.Tensor, masked_m: torch.Tensor, data: PreparedW4AFp8,
          out: torch.Tensor, tile: configs.GemmTile, m_programs: int, dot_dtype: torch.dtype,
          magic_unpack: bool = False, split_k: int = 1) -> None:
    """out = bf16((h @ W2) * s2) on live rows; split_k > 1 (transposed tiles only) splits K."""
    E, max_m, inter = h.shape
    hidden = spec.hidden_size
    common = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, GROUP_K=configs.GROUP_K,
                  DOT_DTYPE=DOT_DTYPES[dot_dtype], **launch_options(tile))
    if tile.path == "planes":
        ws, counters = _ordered_workspace(E, m_programs, hidden, tile, 1, split_k, h.device)
        triton_planes.w4a8_planes_gemm2_kernel[
            triton_decode.grid(m_programs, hidden, tile.block_n, E, split_k)](
            h, masked_m, data.q2, data.s2, data.w2_input_scale, out, ws, counters, m_programs, max_m,
            inter, hidden, SPLIT_K=split_k, MAGIC=magic_unpack, **common)
    elif tile.transposed:
        ws, counters = _split_workspace(E, m_programs, hidden, tile, 1, split_k, h.device)
        triton_decode.w4a8_decode_gemm2_kernel[
            triton_decode.grid(m_programs, hidden, tile.block_n, E, split_k)](
            h, masked_m, data.q2.view(torch.int16), data.s2, data.w2_input_scale, out, ws, counters,
            m_programs, max_m, inter, hidden, SPLIT_K=split_k,
            MAGIC=magic_unpack and dot_dtype == torch.bfloat16, **common)
    else:
        triton_kernels.w4a8_gemm2_kernel[triton_kernels.grid(m_programs, hidden, tile.block_n, E)](
            h, masked_m, data.q2, data.s2, data.w2_input_scale, out, max_m, inter, hidden, **common)
