"""The first collectives of every call, before any activation moves: a fixed-length header (each
rank's validation status, a fingerprint of the layer it thinks it runs, and the length of its
per-expert counts), then, once every rank agrees on those, the route counts themselves. A rank
whose input is invalid still takes part, so every rank learns of it and raises ValueError together:
none is left waiting in a later collective, and ranks built for different expert counts never
exchange vectors of different lengths (which gloo and NCCL do not survive)."""

from __future__ import annotations

import zlib
from typing import Optional

import attrs
import torch

from hal.distributed.collectives import all_gather_rows
from hal.distributed.group import Comm

# Argument names a per-call ValueError can start with, longest first so "x_scale" is not read as "x".
ARGUMENTS = ("topk_weights", "topk_ids", "x_scale", "expert_out", "prepared", "max_m", "out", "x",
             "input")
_STATUS, _FINGERPRINT, _EXPERTS = range(3)  # the header


def fingerprint(*facts) -> int:
    """A 32-bit digest of what every rank must agree on (sizes, dtypes, the assignment)."""
    return zlib.crc32(repr(facts).encode())


def _argument_of(message: str) -> str:
    return next(a for a in ARGUMENTS if message.startswith(a) or a == "input")


@attrs.frozen
class Counts:
    """What the handshake learned: rows[src, dst] (rows rank src sends to rank dst) and
    routes[src, e] (routes rank src sends to global expert e)."""

    rows: torch.Tensor
    routes: torch.Tensor

    def sent_by(self, rank: int) -> list:
        return self.rows[rank].tolist()

    def received_by(self, rank: int) -> list:
        return self.rows[:, rank].tolist()


def handshake(comm: Comm, problem: Optional[ValueError], digest: int, rows_to: torch.Tensor,
              routes_per_expert: torch.Tensor, step: str = "handshake") -> Counts:
    """Exchange status and counts; raise ValueError on every rank if any rank's input was invalid or
    the ranks disagree on the layer."""
    W, E = comm.world_size, routes_per_expert.numel()
    header = torch.tensor([0, digest, E], dtype=torch.int64)
    if problem is not None:
        header[_STATUS] = 1 + ARGUMENTS.index(_argument_of(str(problem)))
    heads = all_gather_rows(header.to(comm.device), step, comm).cpu()
    failed = [(r, int(s)) for r, s in enumerate(heads[:, _STATUS].tolist()) if s]
    if failed:
        names = ", ".join(f"rank {r}: {ARGUMENTS[s - 1]}" for r, s in failed)
        if problem is not None:
            raise ValueError(f"{problem} (rank {comm.rank}; the layer runs on no rank of the group: "
                             f"{names})") from problem
        raise ValueError(f"invalid input on another rank ({names}): the layer runs on no rank of "
                         f"the group; rank {failed[0][0]} raised the details")
    experts = heads[:, _EXPERTS].tolist()
    if len(set(experts)) > 1:
        raise ValueError(f"the ranks of the group disagree on the layer: num_experts per rank {experts}")
    digests = heads[:, _FINGERPRINT].tolist()
    if len(set(digests)) > 1:
        raise ValueError(f"the ranks of the group disagree on the layer (spec, activation dtype or "
                         f"expert assignment differ): fingerprints {digests}")
    vector = torch.cat([rows_to.to("cpu", torch.int64), routes_per_expert.to("cpu", torch.int64)])
    table = all_gather_rows(vector.to(comm.device), step, comm).cpu()
    return Counts(rows=table[:, :W], routes=table[:, W:])
