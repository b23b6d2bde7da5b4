"""`hal.select_moe_kernel(spec, device, group=...)` lands here: each rank selects its own local
kernel for its device and its share of the experts (ranks may differ in hardware and in expert
count), and wraps it in the expert-parallel kernel. A group of one rank gets the same wrapper, so
code and plans are the same at every world size; its dispatch and combine are self-copies."""

from __future__ import annotations

from typing import Optional

from hal.caps import Caps
from hal.distributed.group import resolve
from hal.distributed.kernel import ExpertParallelKernel, local_spec
from hal.spec import MoESpec


def select_ep_kernel(spec: MoESpec, device="cpu", group=None, *, caps: Optional[Caps] = None,
                     prefer: Optional[str] = None, backends=None,
                     strict: Optional[bool] = None) -> ExpertParallelKernel:
    """`spec` is the whole layer (num_experts global); `group` a torch.distributed process group or
    a hal.distributed.EPGroup. Not a collective."""
    from hal.registry import normalize_device, select_kernel

    if spec.layout != "tokens":
        raise ValueError(f"layout={spec.layout!r} is not allowed with group=: the expert-parallel kernel "
                         "takes the token layout; the masked layout moves through "
                         "hal.distributed.dispatch_masked / combine_masked")
    device = normalize_device(device)
    comm = resolve(group, spec.num_experts, device)
    count = comm.assignment.local_count(comm.rank)
    if spec.num_local_experts not in (None, count):
        raise ValueError(f"num_local_experts={spec.num_local_experts} is not allowed with group=: pass the "
                         f"whole layer's spec; rank {comm.rank} owns {count} experts "
                         f"({comm.assignment.describe()})")
    local = select_kernel(local_spec(spec, count), device, caps=caps, prefer=prefer, backends=backends,
                          strict=strict)
    kernel = ExpertParallelKernel(spec, comm, local)
    kernel.decision = local.decision
    return kernel
