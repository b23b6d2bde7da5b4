"""The expert-parallel MoE kernel: the same `moe` call as a single-process kernel, run by every
rank of a process group on its own tokens. One call is three steps, each public so a benchmark can
time them apart: dispatch (handshake, then rows to the ranks owning their experts), compute (the
rank's local kernel on what arrived) and combine (weighted partial rows back, summed in fp32)."""

from __future__ import annotations

import inspect
from typing import Optional

import attrs
import torch

from hal.distributed.combine import combine, sum_per_row
from hal.distributed.dispatch import Dispatched, dispatch, exchange_counts
from hal.distributed.group import Comm
from hal.distributed.handshake import fingerprint
from hal.distributed.plan import EPPlan
from hal.inputs import check_token_inputs, require
from hal.kernel import KernelBase, Prepared
from hal.spec import MoESpec, MoEWeights
from hal.weights_check import check_expert_map

PER_EXPERT = ("w13", "w2", "w13_scale", "w2_scale", "b13", "b2")
META_BYTES_PER_ROUTE = 8  # int32 local id + fp32 weight for each of the k slots of a row


def local_spec(spec: MoESpec, local_experts: int) -> MoESpec:
    """The spec a rank's local kernel is selected for: its own expert count, and one route per
    row, since the arrived rows reach the local kernel one route each."""
    return attrs.evolve(spec, top_k=1,
                        num_local_experts=None if local_experts == spec.num_experts else local_experts)


def check_ids(topk_ids, num_experts: int) -> None:
    """-1 is a dropped route; anything else must be a global expert id."""
    if isinstance(topk_ids, torch.Tensor) and topk_ids.numel() and not topk_ids.dtype.is_floating_point:
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        require(lo >= -1 and hi < num_experts, f"topk_ids holds values in [{lo}, {hi}]: expected -1 "
                                               f"(no route) or an expert id in [0, {num_experts})")


class ExpertParallelKernel(KernelBase):
    """One rank's share of an expert-parallel layer: its local kernel, its experts (by the group's
    assignment) and the group. Built by hal.select_moe_kernel(spec, device, group=...)."""

    op = "moe"

    def __init__(self, spec: MoESpec, comm: Comm, local):
        super().__init__(spec, local.target)
        self.comm = comm
        self.local = local
        self.backend = f"ep:{local.backend}"
        self.experts = comm.assignment.experts[comm.rank]
        self._tables = comm.assignment.tables(self.device)
        # The whole layer but this rank's share, which may differ between ranks.
        self._digest = fingerprint(attrs.astuple(attrs.evolve(spec, num_local_experts=None)),
                                   comm.assignment.experts)
        # The local kernel sees local ids directly: ids [0, L) map to themselves.
        self._local_map = None
        if local.spec.is_ep:
            table = torch.full((spec.num_experts,), -1, dtype=torch.int32)
            table[: len(self.experts)] = torch.arange(len(self.experts), dtype=torch.int32)
            self._local_map = table

    def compile(self) -> list:
        return self.local.compile()

    def prepare_weights(self, weights: MoEWeights) -> Prepared:
        """All num_experts experts (this rank keeps its own), or this rank's experts with an
        expert_map (global id -> index in the weights) naming exactly the experts the assignment
        gives this rank. Local: no collective."""
        if not isinstance(weights, MoEWeights):
            raise ValueError(f"weights must be hal.MoEWeights, got {type(weights).__name__}")
        E, mine = self.spec.num_experts, self.experts
        held = weights.w13.shape[0] if isinstance(weights.w13, torch.Tensor) and weights.w13.dim() else 0
        if weights.expert_map is None:
            if held != E:
                raise ValueError(f"weights.w13 holds {held} experts and there is no expert_map: expected "
                                 f"all {E} experts, or this rank's {len(mine)} with weights.expert_map")
            order = list(mine)
        else:
            if not 1 <= held <= E:
                raise ValueError(f"weights.w13 holds {held} experts: expected 1 to {E}")
            check_expert_map(weights.expert_map, attrs.evolve(self.spec, num_local_experts=held))
            table = weights.expert_map.cpu()
            present = set(torch.nonzero(table >= 0).flatten().tolist())
            order = [int(table[g]) for g in mine]
            if present != set(mine) or len(set(order)) != len(order):
                raise ValueError(f"weights.expert_map holds experts {sorted(present)}: rank "
                                 f"{self.comm.rank} owns {list(mine)} ({self.comm.assignment.describe()}),"
                                 " each at its own index")
        picked = {}
        if order != list(range(held)):
            index = torch.tensor(order, dtype=torch.long, device=weights.w13.device)
            picked = {name: getattr(weights, name).index_select(0, index) for name in PER_EXPERT
                      if getattr(weights, name) is not None}
        expert_map = None if self._local_map is None else self._local_map.to(weights.w13.device)
        local = attrs.evolve(weights, **picked, expert_map=expert_map)
        return Prepared(self.backend, self.spec, self.local.prepare_weights(local))

    def _validator(self, x, topk_weights, topk_ids, prepared, out):
        def validate():
            self._check_autograd(out, x=x, topk_weights=topk_weights)
            self._check_prepared(prepared)
            ids = topk_ids
            if isinstance(ids, torch.Tensor) and ids.dtype in (torch.int32, torch.int64):
                check_ids(ids, self.spec.num_experts)
                ids = ids.clamp_min(0)  # the common checks take -1 as out of range
            check_token_inputs(self.spec, self.device, x, topk_weights, ids, out)
        return validate

    def dispatch(self, x, topk_weights, topk_ids, prepared: Prepared, out=None, *,
                 check: bool = True) -> Dispatched:
        """Step 1, collective. With check=True a bad argument on any rank raises ValueError on all."""
        validate = self._validator(x, topk_weights, topk_ids, prepared, out) if check else None
        return dispatch(self.comm, x, topk_weights, topk_ids, self._tables, self._digest, validate)

    def compute(self, dispatched: Dispatched, prepared: Prepared) -> torch.Tensor:
        """Step 2, local: the local kernel on every arrived route, one route per row, then the
        weighted routes of each arrived row summed in fp32: [R, H] partial rows."""
        rows, slots = torch.nonzero(dispatched.ids >= 0, as_tuple=True)
        x = dispatched.x
        y = self.local(x[rows], dispatched.weights[rows, slots].unsqueeze(1).contiguous(),
                       dispatched.ids[rows, slots].unsqueeze(1).contiguous(), prepared.data, check=False)
        return sum_per_row(rows, y, x.shape[0], x.dtype)

    def combine(self, dispatched: Dispatched, partial: torch.Tensor, out=None) -> torch.Tensor:
        """Step 3, collective: [M, H] in x's dtype."""
        return combine(self.comm, dispatched, partial, out)

    def __call__(self, x, topk_weights, topk_ids, prepared: Prepared, out: Optional[torch.Tensor] = None,
                 *, check: bool = True):
        dispatched = self.dispatch(x, topk_weights, topk_ids, prepared, out, check=check)
        return self.combine(dispatched, self.compute(dispatched, prepared), out)

    def plan(self, topk_ids) -> EPPlan:
        """Collective (every rank must call it): the handshake exchanges route counts, no activation
        moves and the layer does not run. The local plan is the local kernel's for the routes that
        will arrive here, grouped by local expert."""
        spec, comm = self.spec, self.comm

        def validate():
            require(isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 2
                    and topk_ids.shape[1] == spec.top_k and topk_ids.dtype in (torch.int32, torch.int64),
                    f"topk_ids must be an int32/int64 tensor of shape (M, {spec.top_k})")
            check_ids(topk_ids, spec.num_experts)

        ones = torch.ones(getattr(topk_ids, "shape", (0, spec.top_k)), device=self.device)
        _, counts = exchange_counts(comm, ones, topk_ids, self._tables, self._digest, validate,
                                    "plan handshake")
        per_local = counts.routes[:, list(self.experts)].sum(dim=0)
        ids = torch.repeat_interleave(torch.arange(len(self.experts)), per_local).to(torch.int32)
        ids = ids.view(-1, 1).to(self.device)
        if "expert_map" in inspect.signature(self.local.plan).parameters and self._local_map is not None:
            local_plan = self.local.plan(ids, expert_map=self._local_map)
        else:
            local_plan = self.local.plan(ids)
        sent, received = counts.sent_by(comm.rank), counts.received_by(comm.rank)
        x_bytes = spec.hidden_size * torch.empty((), dtype=getattr(torch, spec.act_dtype)).element_size()
        row_bytes = x_bytes + META_BYTES_PER_ROUTE * spec.top_k
        return EPPlan(rank=comm.rank, world_size=comm.world_size, backend=self.local.backend,
                      assignment=comm.assignment.describe(), tokens=int(topk_ids.shape[0]),
                      rows_sent=tuple(sent), rows_received=tuple(received),
                      routes_computed=int(per_local.sum()),
                      dispatch_bytes_sent=sum(sent) * row_bytes,
                      dispatch_bytes_received=sum(received) * row_bytes,
                      combine_bytes_sent=sum(received) * x_bytes, combine_bytes_received=sum(sent) * x_bytes,
                      local=local_plan)
