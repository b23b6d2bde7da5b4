"""GPTQ uint4b8 -> the Marlin MoE tile layout (csrc/cuda/marlin_moe_gemm.cuh), in plain torch, on
whatever device the weights are on. Done once, in prepare_weights.

The kernel multiplies with mma.sync m16n8k16 and the weight tile as the A operand (16 output
channels x 16 k). Lane l = 4g + t of a warp holds, per 16x16 tile, the A fragment registers
  R0 = (n=g,   k=2t..2t+1)   R1 = (n=g+8, k=2t..2t+1)
  R2 = (n=g,   k=2t+8..+9)   R3 = (n=g+8, k=2t+8..+9)
and dequantizes register i from (word >> 4i) & 0x000f000f (low half: nibble i, high half: nibble
i + 4). So nibble position p = 4*parity + 2*khalf + nhalf holds the element with
k = 16*kb + 8*khalf + 2t + parity and n = 64*nc + 16*j + 8*nhalf + g, and the words are stored as
[E][N/64][K/16][32 lanes][4 tiles j]: one 16-byte load per lane per 16 x 64 piece, and the pieces
of one 64-column slab follow each other along K, so a thread block streams whole kilobytes.
"""

from __future__ import annotations

import torch

from hal.spec import INT4_PACK

NIBBLE_SHIFTS = tuple(range(0, 32, 4))
TILE_K = 16  # k of one mma tile
SLAB_N = 64  # output channels one warp's 16-byte load covers (4 tiles of 16)


def gptq_nibbles(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [..., K/8, N] (eight 4-bit values along K, lowest first) -> uint8 [..., K, N]."""
    shifts = torch.tensor(NIBBLE_SHIFTS, dtype=torch.int32, device=qweight.device)
    nib = (qweight.unsqueeze(-2) >> shifts.view(-1, 1)) & 0xF  # [..., K/8, 8, N]
    return nib.flatten(-3, -2).to(torch.uint8)


def _tile_view(nibbles: torch.Tensor) -> torch.Tensor:
    """[K, N] -> [kb, khalf, t, parity, nc, j, nhalf, g]."""
    K, N = nibbles.shape
    return nibbles.view(K // TILE_K, 2, 4, 2, N // SLAB_N, 4, 2, 8)


# [kb, khalf, t, parity, nc, j, nhalf, g] -> [nc, kb, g, t, j, parity, khalf, nhalf]
_TO_PACKED = (4, 0, 7, 2, 5, 3, 1, 6)


def _check(qweight: torch.Tensor, name: str):
    if qweight.dtype != torch.int32 or qweight.dim() != 3:
        raise ValueError(f"{name} must be int32 [E, K/8, N], got {qweight.dtype} {tuple(qweight.shape)}")
    K, N = qweight.shape[1] * INT4_PACK, qweight.shape[2]
    if K % TILE_K or N % SLAB_N:
        raise ValueError(f"{name} has K={K}, N={N}: expected K a multiple of {TILE_K} and N a "
                         f"multiple of {SLAB_N}")


def repack_expert(qweight: torch.Tensor) -> torch.Tensor:
    """One expert: int32 [K/8, N] -> int32 [N/64, K/16, 32, 4]."""
    nib = gptq_nibbles(qweight)
    K, N = nib.shape
    tiles = _tile_view(nib).permute(*_TO_PACKED).reshape(N // SLAB_N, K // TILE_K, 32, 4, 8)
    shifts = torch.tensor(NIBBLE_SHIFTS, dtype=torch.int64, device=qweight.device)
    words = (tiles.to(torch.int64) << shifts).sum(-1)  # nibbles are disjoint: sum == or
    words = torch.where(words >= 1 << 31, words - (1 << 32), words)
    return words.to(torch.int32)


def repack(qweight: torch.Tensor, name: str = "qweight") -> torch.Tensor:
    """int32 [E, K/8, N] GPTQ -> int32 [E, N/64, K/16, 32, 4], one expert at a time so the int64
    intermediate stays one expert big."""
    _check(qweight, name)
    E, K8, N = qweight.shape
    out = torch.empty((E, N // SLAB_N, K8 * INT4_PACK // TILE_K, 32, 4), dtype=torch.int32,
                      device=qweight.device)
    for e in range(E):
        out[e] = repack_expert(qweight[e])
    return out


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of repack, to nibbles: int32 [E, N/64, K/16, 32, 4] -> uint8 [E, K, N]."""
    E, NC, KB = packed.shape[:3]
    shifts = torch.tensor(NIBBLE_SHIFTS, dtype=torch.int32, device=packed.device)
    nib = (packed.unsqueeze(-1) >> shifts) & 0xF  # [E, nc, kb, 32, 4, 8]
    nib = nib.view(E, NC, KB, 8, 4, 4, 2, 2, 2)  # [E, nc, kb, g, t, j, parity, khalf, nhalf]
    inverse = [0] + [1 + _TO_PACKED.index(d) for d in range(8)]
    return nib.permute(*inverse).reshape(E, KB * TILE_K, NC * SLAB_N).to(torch.uint8)


def fragment_element(lane: int, reg: int, half: int) -> tuple:
    """(n, k) within a 16x16 tile of the element that mma.sync m16n8k16's A fragment puts in
    register `reg` (0..3), half `half` (0 low, 1 high) of lane `lane` (PTX ISA, "Matrix Fragments
    for mma.m16n8k16")."""
    g, t = lane // 4, lane % 4
    row = g + 8 * (reg & 1)
    col = 2 * t + half + 8 * (reg >> 1)
    return row, col


# GEMM 1's epilogue applies the activation to the columns one thread holds: columns g and g + 8 of
# each of its four 16-wide tiles. So the gated activations' gate and up halves are interleaved by
# 16: physical column 32q + r is gate (r < 16) or up (r >= 16) of intermediate column 16q + r % 16,
# and tiles j and j + 1 of a thread hold gate and up of the same columns.
GATE_UP_RUN = 16


def gate_up_columns(activation: str, intermediate_size: int) -> torch.Tensor:
    """The spec's GEMM-1 column of each physical column (int64 [w13_rows]): silu's gate is
    [0, I) and up [I, 2I), swiglu_oai's gate 2i and up 2i + 1 (docs/contract.md); relu2 has no
    pairs and keeps its order."""
    inter = intermediate_size
    if activation == "relu2":
        return torch.arange(inter)
    if inter % GATE_UP_RUN:
        raise ValueError(f"intermediate_size={inter} must be a multiple of {GATE_UP_RUN}")
    p = torch.arange(2 * inter)
    i = (p // (2 * GATE_UP_RUN)) * GATE_UP_RUN + p % GATE_UP_RUN  # intermediate column
    up = (p % (2 * GATE_UP_RUN)) >= GATE_UP_RUN
    if activation == "silu":
        return torch.where(up, inter + i, i)
    if activation == "swiglu_oai":
        return 2 * i + up.long()
    raise ValueError(f"activation={activation!r} is not one of silu, swiglu_oai, relu2")
