"""Expert parallelism across processes on torch.distributed: `hal.select_moe_kernel(spec, device,
group=pg)` returns an ExpertParallelKernel that dispatches each rank's tokens to the ranks owning
their experts, runs the rank's local kernel, and combines the results in token order. The masked
(DeepEP low-latency) form is dispatch_masked / combine_masked. See docs/expert-parallel.md."""

from hal.distributed.assignment import ExpertAssignment
from hal.distributed.collectives import CollectiveError
from hal.distributed.group import EPGroup
from hal.distributed.kernel import ExpertParallelKernel
from hal.distributed.masked import MaskedDispatch, combine_masked, dispatch_masked
from hal.distributed.plan import EPPlan
from hal.distributed.select import select_ep_kernel

__all__ = ["CollectiveError", "EPGroup", "EPPlan", "ExpertAssignment", "ExpertParallelKernel",
           "MaskedDispatch", "combine_masked", "dispatch_masked", "select_ep_kernel"]
