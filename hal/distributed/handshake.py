"""The first collective of every call: each rank's validation status, a fingerprint of the layer it
thinks it runs, and its route counts, all-gathered in one small int64 exchange before any
activation moves. A rank whose input is invalid still takes part, so every rank learns of it and
raises ValueError together: none is left waiting in a later collective."""

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
_STATUS, _FINGERPRINT, _HEAD = 0, 1, 2


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
    vector = torch.zeros(_HEAD + W + E, dtype=torch.int64)
    if problem is not None:
        vector[_STATUS] = 1 + ARGUMENTS.index(_argument_of(str(problem)))
    else:
        vector[_HEAD:_HEAD + W] = rows_to.to("cpu", torch.int64)
        vector[_HEAD + W:] = routes_per_expert.to("cpu", torch.int64)
    vector[_FINGERPRINT] = digest
    table = all_gather_rows(vector.to(comm.device), step, comm).cpu()
    failed = [(r, int(s)) for r, s in enumerate(table[:, _STATUS].tolist()) if s]
    if failed:
        names = ", ".join(f"rank {r}: {ARGUMENTS[s - 1]}" for r, s in failed)
        if problem is not None:
            raise ValueError(f"{problem} (rank {comm.rank}; the layer runs on no rank of the group: "
                             f"{names})") from problem
        raise ValueError(f"invalid input on another rank ({names}): the layer runs on no rank of "
                         f"the group; rank {failed[0][0]} raised the details")
    digests = table[:, _FINGERPRINT].tolist()
    if len(set(digests)) > 1:
        raise ValueError(f"the ranks of the group disagree on the layer (spec, activation dtype or "
                         f"expert assignment differ): fingerprints {digests}")
    return Counts(rows=table[:, _HEAD:_HEAD + W], routes=table[:, _HEAD + W:])
