"""The low-latency form (DeepEP low-latency style): dispatch straight into the masked layout
[E_local, max_m, H] with masked_m[E_local], so masked ops (the FP8 requant, the W4AFP8 masked MoE)
run on what arrived, then combine the expert outputs back into token order.

Rows move as in the token form (one per (token, rank), with the k routes it has there); the
receiver places each route's row at the next free slot of its local expert, source-rank-major and
in token order. Every rank must pass the same max_m (DeepEP's fixed buffer); it is part of the
handshake's fingerprint, and a max_m too small for some expert raises ValueError on every rank
before any activation moves. Without max_m the layout is as tall as the busiest expert of the
group, the same on every rank."""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from hal.distributed.combine import combine, sum_per_row
from hal.distributed.dispatch import Dispatched, exchange_counts, send_rows
from hal.distributed.group import Comm, resolve
from hal.distributed.handshake import fingerprint, handshake
from hal.distributed.kernel import check_ids
from hal.inputs import require
from hal.spec import TOKEN_GROUP


@attrs.frozen
class MaskedDispatch:
    x: torch.Tensor  # [E_local, max_m, H] in the source's dtype; rows >= masked_m[e] unwritten
    x_scale: Optional[torch.Tensor]  # fp32 [E_local, max_m, H/128], column-major as DeepEP emits it
    masked_m: torch.Tensor  # int32 [E_local]
    expected_rows: int  # mean routes per local expert, the masked GEMMs' launch hint
    rows: torch.Tensor  # int64 [routes]: the arrived row of each placed route
    slots: torch.Tensor  # int64 [routes]: which of that row's k routes
    expert: torch.Tensor  # int64 [routes]: local expert
    position: torch.Tensor  # int64 [routes]: row within the expert's slab
    dispatched: Dispatched
    comm: Comm
    digest: int


def _validate(x, topk_weights, topk_ids, x_scale, max_m, num_experts):
    def validate():
        require(isinstance(x, torch.Tensor) and x.dim() == 2 and x.is_contiguous(),
                f"x must be a contiguous [M, H] tensor, got {tuple(getattr(x, 'shape', ()))}")
        M, H = x.shape
        require(isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 2 and topk_ids.shape[0] == M
                and topk_ids.dtype in (torch.int32, torch.int64) and topk_ids.device == x.device,
                f"topk_ids must be an int32/int64 tensor of shape ({M}, k) on {x.device}")
        check_ids(topk_ids, num_experts)
        require(isinstance(topk_weights, torch.Tensor) and topk_weights.shape == topk_ids.shape
                and topk_weights.dtype.is_floating_point and topk_weights.device == x.device,
                f"topk_weights must be a float tensor of shape {tuple(topk_ids.shape)} on {x.device}")
        if x_scale is not None:
            require(H % TOKEN_GROUP == 0, f"x has {H} columns: per-token-group scales need a multiple "
                                          f"of {TOKEN_GROUP}")
            require(isinstance(x_scale, torch.Tensor) and tuple(x_scale.shape) == (M, H // TOKEN_GROUP)
                    and x_scale.dtype == torch.float32 and x_scale.device == x.device,
                    f"x_scale must be a float32 tensor of shape ({M}, {H // TOKEN_GROUP}) on {x.device}")
        require(max_m is None or (isinstance(max_m, int) and not isinstance(max_m, bool) and max_m >= 0),
                f"max_m={max_m!r}: expected None or an int >= 0")
    return validate


def dispatch_masked(group, x, topk_weights, topk_ids, *, num_experts: int, x_scale=None,
                    max_m: Optional[int] = None, check: bool = True) -> MaskedDispatch:
    """Collective. x [M, H] (bf16, or FP8 with x_scale fp32 [M, H/128]); topk_* [M, k], -1 for no
    route. `group` is a process group or a hal.distributed.EPGroup."""
    comm = resolve(group, num_experts, str(x.device) if isinstance(x, torch.Tensor) else "cpu")
    assignment = comm.assignment
    mine = list(assignment.experts[comm.rank])
    width = tuple(x.shape[1:]) if isinstance(x, torch.Tensor) else ()
    digest = fingerprint("masked", num_experts, width, getattr(x, "dtype", None), x_scale is not None,
                         max_m, assignment.experts)
    validate = _validate(x, topk_weights, topk_ids, x_scale, max_m, num_experts) if check else None
    routes, counts = exchange_counts(comm, topk_weights, topk_ids, assignment.tables(comm.device), digest,
                                     validate)
    busiest = int(counts.routes.sum(dim=0).max()) if num_experts else 0
    if max_m is not None and busiest > max_m:
        expert = int(counts.routes.sum(dim=0).argmax())
        raise ValueError(f"max_m={max_m} is too small: expert {expert} receives {busiest} routes "
                         "(the layer runs on no rank of the group)")
    height = busiest if max_m is None else max_m
    dispatched = send_rows(comm, x, routes, counts, x_scale)

    rows, slots = torch.nonzero(dispatched.ids >= 0, as_tuple=True)
    experts = dispatched.ids[rows, slots].long()
    order = torch.argsort(experts, stable=True)  # by expert, then source rank and token
    rows, slots, experts = rows[order], slots[order], experts[order]
    masked_m = torch.bincount(experts, minlength=len(mine))
    starts = torch.cumsum(masked_m, 0) - masked_m
    position = torch.arange(rows.numel(), device=rows.device) - starts[experts]
    H = x.shape[1]
    layout = torch.empty((len(mine), height, H), dtype=x.dtype, device=x.device)
    layout[experts, position] = dispatched.x[rows]
    scale = None
    if x_scale is not None:
        scale = torch.empty((len(mine), H // TOKEN_GROUP, height), dtype=torch.float32,
                            device=x.device).transpose(1, 2)
        scale[experts, position] = dispatched.x_scale[rows]
    return MaskedDispatch(x=layout, x_scale=scale, masked_m=masked_m.to(torch.int32),
                          expected_rows=-(-rows.numel() // len(mine)), rows=rows, slots=slots,
                          expert=experts, position=position, dispatched=dispatched, comm=comm,
                          digest=digest)


def combine_masked(masked: MaskedDispatch, expert_out: torch.Tensor, out: Optional[torch.Tensor] = None,
                   *, check: bool = True) -> torch.Tensor:
    """Collective. expert_out [E_local, max_m, H]: FFN_e of each placed row (unweighted, as masked
    kernels write it). Returns [M, H] in expert_out's dtype: each token's weighted sum over its
    routes, fp32-accumulated. With check=True a wrong expert_out on any rank raises ValueError on
    every rank before the rows move."""
    comm = masked.comm
    if check:
        problem = None
        try:
            require(isinstance(expert_out, torch.Tensor) and expert_out.shape == masked.x.shape
                    and expert_out.dtype.is_floating_point and expert_out.device == masked.x.device,
                    f"expert_out must be a float tensor of shape {tuple(masked.x.shape)} on "
                    f"{masked.x.device}")
        except ValueError as exc:
            problem = exc
        handshake(comm, problem, masked.digest, torch.zeros(comm.world_size, dtype=torch.int64),
                  torch.zeros(0, dtype=torch.int64), "combine handshake")
    d = masked.dispatched
    values = expert_out[masked.expert, masked.position].float() \
        * d.weights[masked.rows, masked.slots].unsqueeze(1)
    partial = sum_per_row(masked.rows, values, d.x.shape[0], expert_out.dtype)
    return combine(comm, d, partial, out)
