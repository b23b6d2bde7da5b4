"""Which rank owns which experts. Every expert lives on exactly one rank; every rank owns at least
one (a rank's local spec needs num_local_experts >= 1). A rank's local experts are stacked in the
order the assignment lists them, and that order is the local id the dispatch sends."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch


def _fail(message: str):
    raise ValueError(f"assignment: {message}")


@attrs.frozen
class ExpertAssignment:
    num_experts: int
    experts: tuple  # per rank: the global ids it owns, in local-id order

    def __attrs_post_init__(self):
        seen = sorted(e for rank in self.experts for e in rank)
        if seen != list(range(self.num_experts)):
            _fail(f"every expert in [0, {self.num_experts}) must be owned by exactly one rank; "
                  f"got {len(seen)} owned ids {seen[:8]}{'...' if len(seen) > 8 else ''}")
        empty = [r for r, rank in enumerate(self.experts) if not rank]
        if empty:
            _fail(f"ranks {empty} own no expert: every rank needs at least one")

    @classmethod
    def contiguous(cls, num_experts: int, world_size: int) -> ExpertAssignment:
        """Rank r owns one contiguous slice; the first num_experts % world_size ranks hold one
        expert more than the rest."""
        if not 1 <= world_size <= num_experts:
            _fail(f"world_size={world_size} must be in [1, num_experts={num_experts}]")
        base, extra = divmod(num_experts, world_size)
        bounds = [r * base + min(r, extra) for r in range(world_size + 1)]
        return cls(num_experts, tuple(tuple(range(bounds[r], bounds[r + 1])) for r in range(world_size)))

    @classmethod
    def explicit(cls, num_experts: int, experts_per_rank: Sequence[Sequence[int]]) -> ExpertAssignment:
        """Rank r owns experts_per_rank[r], in that local order."""
        return cls(num_experts, tuple(tuple(int(e) for e in rank) for rank in experts_per_rank))

    @property
    def world_size(self) -> int:
        return len(self.experts)

    def local_count(self, rank: int) -> int:
        return len(self.experts[rank])

    def expert_map(self, rank: int) -> torch.Tensor:
        """int32 [num_experts]: global id -> local id on `rank`, -1 where another rank owns it."""
        table = torch.full((self.num_experts,), -1, dtype=torch.int32)
        table[list(self.experts[rank])] = torch.arange(self.local_count(rank), dtype=torch.int32)
        return table

    def tables(self, device) -> tuple:
        """(owner rank, local id on that rank) of every global expert, int64 [num_experts] each."""
        owner = torch.empty(self.num_experts, dtype=torch.int64)
        local = torch.empty(self.num_experts, dtype=torch.int64)
        for rank, ids in enumerate(self.experts):
            owner[list(ids)] = rank
            local[list(ids)] = torch.arange(len(ids))
        return owner.to(device), local.to(device)

    def describe(self) -> str:
        counts = [len(r) for r in self.experts]
        contiguous = self == ExpertAssignment.contiguous(self.num_experts, self.world_size)
        kind = "contiguous slices" if contiguous else "explicit"
        return f"{self.num_experts} experts over {self.world_size} ranks ({kind}; per rank {counts})"
