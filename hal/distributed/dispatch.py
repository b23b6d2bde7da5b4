"""Dispatch: each token travels once to every rank that owns at least one of its experts (one row
per (token, rank), as DeepEP's normal mode sends it), with the k-wide list of its routes on that
rank. A token whose k experts live on fewer than k ranks moves fewer bytes than one row per route
would, and the weighted sum over its local routes comes back as one row too.

Order: rows leave destination-rank-major, each rank's in token order; they arrive source-rank-major
in the same order, which is what makes combine deterministic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import attrs
import torch

from hal.distributed.collectives import start_all_to_all, wait
from hal.distributed.group import Comm
from hal.distributed.handshake import Counts, handshake


@attrs.frozen
class Routes:
    """This rank's routes grouped by destination rank."""

    tokens: torch.Tensor  # int64 [P]: source token of each outgoing row
    rows_to: torch.Tensor  # int64 [W]: outgoing rows per destination rank
    ids: torch.Tensor  # int32 [P, k]: local expert id on the destination, -1 for routes elsewhere
    weights: torch.Tensor  # fp32 [P, k]: topk weight, 0 where ids is -1
    per_expert: torch.Tensor  # int64 [E]: routes to each global expert


def route(topk_weights, topk_ids, owner: torch.Tensor, local: torch.Tensor, world_size: int) -> Routes:
    """Group routes by owner rank. Ids outside [0, E) (-1 in particular) are dropped here, so no
    table is indexed out of bounds even when the caller skipped validation."""
    E = owner.numel()
    ids = topk_ids.long()
    valid = (ids >= 0) & (ids < E)
    safe = torch.where(valid, ids, torch.zeros_like(ids))
    dest = torch.where(valid, owner[safe], torch.full_like(ids, -1))  # [M, k]
    ranks = torch.arange(world_size, device=ids.device).view(-1, 1, 1)
    hit = dest.unsqueeze(0) == ranks  # [W, M, k]
    to_rank, tokens = torch.nonzero(hit.any(dim=2), as_tuple=True)  # rank-major, token ascending
    here = hit[to_rank, tokens]  # [P, k]
    local_ids = torch.where(here, local[safe[tokens]], torch.full_like(here, -1, dtype=torch.int64))
    weights = torch.where(here, topk_weights[tokens].float(), torch.zeros((), device=ids.device))
    return Routes(tokens=tokens, rows_to=torch.bincount(to_rank, minlength=world_size),
                  ids=local_ids.to(torch.int32), weights=weights,
                  per_expert=torch.bincount(ids[valid], minlength=E))


@attrs.frozen
class Dispatched:
    """Rows that arrived on this rank, and what combine needs to send results back."""

    num_tokens: int  # M of this rank's own call
    tokens: torch.Tensor  # int64 [P]: source token of each row this rank sent
    sent: list  # rows sent to each rank
    received: list  # rows received from each rank
    x: torch.Tensor  # [R, H] arrived rows, source-rank-major
    ids: torch.Tensor  # int32 [R, k]: local expert of each route of the row, -1 for routes elsewhere
    weights: torch.Tensor  # fp32 [R, k]
    x_scale: Optional[torch.Tensor]  # fp32 [R, H/128] when rows are per-token-group FP8
    counts: Counts


def exchange_counts(comm: Comm, topk_weights, topk_ids, tables, digest: int,
                    validate: Optional[Callable[[], None]], step: str = "handshake"):
    """Validate locally, then the handshake: (routes, counts), or ValueError on every rank."""
    problem = None
    if validate is not None:
        try:
            validate()
        except ValueError as exc:
            problem = exc
    E, W = comm.assignment.num_experts, comm.world_size
    routes = None if problem is not None else route(topk_weights, topk_ids, *tables, W)
    counts = handshake(comm, problem, digest,
                       torch.zeros(W, dtype=torch.int64) if routes is None else routes.rows_to,
                       torch.zeros(E, dtype=torch.int64) if routes is None else routes.per_expert, step)
    return routes, counts


def send_rows(comm: Comm, x, routes: Routes, counts: Counts, x_scale=None) -> Dispatched:
    """The data all-to-alls: activation rows, their routes (ids and weights), and their
    per-token-group scales when the rows are FP8."""
    sent, received = counts.sent_by(comm.rank), counts.received_by(comm.rank)
    # ids and weights travel together: weights as their int32 bit pattern.
    meta = torch.cat([routes.ids, routes.weights.view(torch.int32)], dim=1)
    recv_x, work_x = start_all_to_all(x[routes.tokens], sent, received, "dispatch", comm)
    recv_meta, work_meta = start_all_to_all(meta, sent, received, "dispatch", comm)
    works, recv_scale = [work_x, work_meta], None
    if x_scale is not None:
        recv_scale, work_scale = start_all_to_all(x_scale[routes.tokens], sent, received, "dispatch", comm)
        works.append(work_scale)
    wait(works, "dispatch", comm)
    k = routes.ids.shape[1]
    return Dispatched(num_tokens=x.shape[0], tokens=routes.tokens, sent=sent, received=received,
                      x=recv_x, ids=recv_meta[:, :k].contiguous(),
                      weights=recv_meta[:, k:].contiguous().view(torch.float32), x_scale=recv_scale,
                      counts=counts)


def dispatch(comm: Comm, x, topk_weights, topk_ids, tables, digest: int,
             validate: Optional[Callable[[], None]] = None, x_scale=None) -> Dispatched:
    """Send every (token, rank) row to its rank. `tables` is the assignment's (owner, local id);
    `validate` raises ValueError for a bad input, which then reaches every rank."""
    routes, counts = exchange_counts(comm, topk_weights, topk_ids, tables, digest, validate)
    return send_rows(comm, x, routes, counts, x_scale)
