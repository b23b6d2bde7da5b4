"""The process group an expert-parallel layer runs over: a torch.distributed group, the expert
assignment and the collective timeout, resolved once when the kernel is selected."""

from __future__ import annotations

from datetime import timedelta
from typing import Optional

import attrs
import torch

from hal.distributed.assignment import ExpertAssignment

# Backends whose all_to_all_single takes tensors on one kind of device only.
DEVICE_OF_BACKEND = {"gloo": "cpu", "nccl": "cuda"}


@attrs.frozen
class EPGroup:
    """What `select_moe_kernel(..., group=)` accepts besides a bare process group: the group with an
    explicit expert assignment and/or a timeout for every collective of the layer (default: the
    group's own timeout, set at init_process_group)."""

    group: object
    assignment: Optional[ExpertAssignment] = None
    timeout: Optional[timedelta] = None


@attrs.frozen
class Comm:
    group: object
    rank: int
    world_size: int
    backend: str
    device: torch.device  # where the collectives' tensors live
    assignment: ExpertAssignment
    timeout: Optional[timedelta]


def resolve(group, num_experts: int, device: str) -> Comm:
    """A Comm for this rank, or ValueError naming the argument that does not fit."""
    import torch.distributed as dist

    settings = group if isinstance(group, EPGroup) else EPGroup(group)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: torch.distributed is not initialized (call init_process_group first)")
    try:
        rank = dist.get_rank(settings.group)
        world = dist.get_world_size(settings.group)
        backend = str(dist.get_backend(settings.group)).lower()
    except Exception as exc:  # a non-group object or a group this process is not part of
        raise ValueError(f"group={settings.group!r} is not a process group this rank belongs to: "
                         f"{exc}") from exc
    if rank < 0:
        raise ValueError(f"group: this process is not a member of {settings.group!r}")
    kind = torch.device(device).type
    wanted = DEVICE_OF_BACKEND.get(backend)
    if wanted is not None and wanted != kind:
        raise ValueError(f"device={device!r} does not fit the group's {backend} backend: it moves "
                         f"{wanted} tensors")
    assignment = settings.assignment or ExpertAssignment.contiguous(num_experts, world)
    if assignment.num_experts != num_experts or assignment.world_size != world:
        raise ValueError(f"assignment covers {assignment.num_experts} experts over "
                         f"{assignment.world_size} ranks: expected {num_experts} over {world}")
    timeout = settings.timeout
    if timeout is not None and not (isinstance(timeout, timedelta) and timeout.total_seconds() > 0):
        raise ValueError(f"timeout={timeout!r}: expected a positive datetime.timedelta or None")
    return Comm(settings.group, rank, world, backend, torch.device(device), assignment, timeout)
