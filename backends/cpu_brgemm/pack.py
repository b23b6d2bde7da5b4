"""prepare_weights for the CPU fused MoE: checkpoint tensors -> VNNI panels of BLOCK_N output
columns, once. Each panel holds K/2 rows of BLOCK_N (k even, k odd) pairs, the order both the
TinyGEMM decoders and BRGEMM's bf16 B operand read; scales go next to their panel in the order the
decoders read them."""

from __future__ import annotations

from typing import Optional

import attrs
import torch
from hal.backends.cpu_brgemm.policy import BLOCK_N

from hal.spec import FP8_BLOCK, MXFP4_GROUP, MoESpec, MoEWeights

_EMPTY = torch.empty(0)


@attrs.frozen
class PackedMoE:
    w13: torch.Tensor  # uint8 [E, w13_rows / 32, panel bytes]
    w13_scale: torch.Tensor  # fp8: fp32 [E, panels, ceil(H/128)]; mxfp4: e8m0 [E, panels, H]; bf16: empty
    w2: torch.Tensor  # uint8 [E, H / 32, panel bytes]
    w2_scale: torch.Tensor
    b13: Optional[torch.Tensor]  # fp32 [E, w13_rows], rows in the packed order
    b2: Optional[torch.Tensor]  # fp32 [E, H]
    expert_map: Optional[torch.Tensor]  # int32 [num_experts]


def w13_row_order(spec: MoESpec) -> torch.Tensor:
    """Packed row -> checkpoint row. swiglu_oai checkpoints interleave gate and up rows; packing
    them as [gate; up] lets every gated activation read gate panel p and up panel p + I/32."""
    rows = torch.arange(spec.w13_rows)
    if spec.activation == "swiglu_oai":
        return torch.cat((rows[0::2], rows[1::2]))
    return rows


def _vnni_panels(w: torch.Tensor) -> torch.Tensor:
    """[E, N, K] of 1- or 2-byte elements -> uint8 [E, N/32, K/2 * 32 * 2 * itemsize]."""
    E, N, K = w.shape
    panels = w.reshape(E, N // BLOCK_N, BLOCK_N, K // 2, 2).permute(0, 1, 3, 2, 4).contiguous()
    return panels.view(torch.uint8).reshape(E, N // BLOCK_N, -1)


def _fp8_panel_scales(scale: torch.Tensor, row_order: torch.Tensor) -> torch.Tensor:
    """Block scales [E, ceil(N/128), ceil(K/128)] -> one row per panel [E, N/32, ceil(K/128)]."""
    blocks = (row_order // FP8_BLOCK).view(-1, BLOCK_N)
    if not bool((blocks == blocks[:, :1]).all()):
        raise ValueError("a 32-row panel straddles two fp8 scale blocks: the row order is not "
                         "panel-aligned")
    return scale.float()[:, blocks[:, 0]].contiguous()


def _mxfp4_panels(q: torch.Tensor, scale: torch.Tensor):
    """q uint8 [E, N, K/2] (one byte = the (even, odd) k pair of one column) -> [E, N/32, K/2*32];
    e8m0 scales [E, N, K/32] -> [E, N/32, K/32 * 32]."""
    E, N, half_k = q.shape
    P = N // BLOCK_N
    w = q.reshape(E, P, BLOCK_N, half_k).permute(0, 1, 3, 2).contiguous().reshape(E, P, -1)
    groups = half_k * 2 // MXFP4_GROUP
    s = scale.reshape(E, P, BLOCK_N, groups).permute(0, 1, 3, 2).contiguous().reshape(E, P, -1)
    return w, s


def _pack_one(spec: MoESpec, q, scale, row_order: Optional[torch.Tensor]):
    if row_order is not None:
        q = q[:, row_order]
        if spec.weight_format == "mxfp4":
            scale = scale[:, row_order]
    fmt = spec.weight_format
    if fmt == "bf16":
        return _vnni_panels(q.view(torch.int16)), _EMPTY
    if fmt == "fp8_block128":
        rows = row_order if row_order is not None else torch.arange(q.shape[1])
        return _vnni_panels(q.view(torch.uint8)), _fp8_panel_scales(scale, rows)
    return _mxfp4_panels(q, scale)


def pack(spec: MoESpec, weights: MoEWeights) -> PackedMoE:
    order = w13_row_order(spec)
    w13, s13 = _pack_one(spec, weights.w13, weights.w13_scale, order)
    w2, s2 = _pack_one(spec, weights.w2, weights.w2_scale, None)
    b13 = None if weights.b13 is None else weights.b13[:, order].float().contiguous()
    b2 = None if weights.b2 is None else weights.b2.float().contiguous()
    expert_map = None if weights.expert_map is None else weights.expert_map.contiguous()
    return PackedMoE(w13, s13, w2, s2, b13, b2, expert_map)
