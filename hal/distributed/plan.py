"""What one expert-parallel call moves and runs, per rank: the handshake's counts, the bytes of the
two all-to-alls, and the local kernel's own plan for the routes this rank will compute."""

from __future__ import annotations

import attrs


@attrs.frozen
class EPPlan:
    rank: int
    world_size: int
    backend: str  # the local kernel's backend
    assignment: str
    tokens: int  # this rank's own tokens
    rows_sent: tuple  # (token, rank) rows this rank sends to each rank, itself included
    rows_received: tuple  # rows this rank receives from each rank
    routes_computed: int  # routes the local kernel runs on the arrived rows
    dispatch_bytes_sent: int
    dispatch_bytes_received: int
    combine_bytes_sent: int
    combine_bytes_received: int
    local: object  # the local kernel's plan for those routes

    def describe(self) -> str:
        local = self.local.describe() if hasattr(self.local, "describe") else repr(self.local)
        return "\n".join([
            f"expert parallel rank {self.rank} of {self.world_size}: {self.assignment}; local "
            f"kernel {self.backend}",
            f"  {self.tokens} tokens; rows sent per rank {list(self.rows_sent)}, received per rank "
            f"{list(self.rows_received)}; {self.routes_computed} routes computed here",
            f"  dispatch: {self.dispatch_bytes_sent} B sent, {self.dispatch_bytes_received} B received; "
            f"combine: {self.combine_bytes_sent} B sent, {self.combine_bytes_received} B received "
            "(rows to and from this rank itself included)",
            "  " + local.replace("\n", "\n  "),
        ])
