"""Combine: each rank sums, in fp32, the weighted expert outputs of every row that arrived (one
partial row per (token, rank)), sends the partial rows back the way they came, and each source
rank adds them into its tokens in fp32, then casts to the output dtype. A token with no live route
gets zeros, as in the single-process op; FFN_e includes b2_e, so each route adds its bias once,
scaled by its weight."""

from __future__ import annotations

from typing import Optional

import torch

from hal.distributed.collectives import start_all_to_all, wait
from hal.distributed.dispatch import Dispatched
from hal.distributed.group import Comm


def sum_per_row(rows: torch.Tensor, values: torch.Tensor, num_rows: int, dtype) -> torch.Tensor:
    """[num_rows, H] in `dtype`: the fp32 sum of values[i] into row rows[i]."""
    acc = torch.zeros((num_rows, values.shape[1]), dtype=torch.float32, device=values.device)
    acc.index_add_(0, rows, values.float())
    return acc.to(dtype)


def combine(comm: Comm, dispatched: Dispatched, partial: torch.Tensor,
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """partial [R, H]: one row per arrived row. Returns [M, H] (into `out` when given) in partial's
    dtype."""
    back, work = start_all_to_all(partial, dispatched.received, dispatched.sent, "combine", comm)
    wait([work], "combine", comm)
    total = torch.zeros((dispatched.num_tokens, partial.shape[1]), dtype=torch.float32,
                        device=partial.device)
    total.index_add_(0, dispatched.tokens, back.float())
    if out is None:
        return total.to(partial.dtype)
    out.copy_(total)
    return out
