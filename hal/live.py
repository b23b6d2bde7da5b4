"""Live refinement: the facts about the device a kernel is about to run on that only the running
process can learn, asked once per device and cached.

Selection (backend check() and rank()) reads capabilities and nothing else, so it is the same on a
recorded profile as on the machine. What a capability record cannot promise is settled here, and
only for live capabilities (`caps.profile is None`): a kernel built from a recorded profile keeps
the record's facts, and refuses to run on a host that lacks them (each backend checks that before
its first instruction, with `host_*` below).

    CPU   AMX tile permission for this process (ARCH_REQ_XCOMP_PERM is requested), and whether
          torch's oneDNN runs bf16 BRGEMM on AMX (`amx_bf16_brgemm`).
    GPU   the CUDA runtime's properties a shallow (NVML) probe leaves unknown: occupancy limits,
          warp size, SM count, and the archs the installed torch carries kernels for. Asking
          creates a CUDA context, which is fine: the caller is about to run on that GPU.

The registry refines the target before deciding and every kernel template refines the target it
is built with, so a kernel built directly by a backend sees the same facts."""

from __future__ import annotations

import functools

import attrs

from hal.backend import Target
from hal.caps import Caps, CpuCaps, GpuCaps


def refine(target: Target) -> Target:
    """`target` with its live facts filled in; recorded capabilities are returned as they are."""
    caps = target.caps
    if caps.profile is not None:
        return target
    if target.is_cpu:
        cpu = refine_cpu(caps.cpu)
        return target if cpu is caps.cpu else attrs.evolve(target, caps=attrs.evolve(caps, cpu=cpu))
    gpu = target.gpu
    if gpu is None:
        return target
    refined = refine_gpu(gpu)
    if refined is gpu:
        return target
    gpus = tuple(refined if g.index == gpu.index else g for g in caps.gpus)
    return attrs.evolve(target, caps=attrs.evolve(caps, gpus=gpus))


def refine_cpu(cpu: CpuCaps) -> CpuCaps:
    """AMX stays usable only when this process is granted the tile state."""
    if not cpu.amx.usable or _amx_permission():
        return cpu
    amx = attrs.evolve(cpu.amx, permitted=False,
                       reason="ARCH_REQ_XCOMP_PERM refused for this process: seccomp, hypervisor or "
                              "a sigaltstack too small for the tile state")
    return attrs.evolve(cpu, amx=amx)


def refine_gpu(gpu: GpuCaps) -> GpuCaps:
    """The fields the CUDA runtime knows and `gpu` lacks, filled in; `gpu` itself when there is
    nothing to add, no CUDA runtime to ask, or the runtime's GPU at that index is another model."""
    facts = _gpu_facts(gpu.index)
    if gpu.name and facts.get("name") and facts["name"] != gpu.name:
        return gpu  # the caps describe another GPU than the one at this index
    found = {field: value for field, value in facts.items()
             if value is not None and not getattr(gpu, field)}
    return attrs.evolve(gpu, **found) if found else gpu


def amx_bf16_brgemm(target: Target) -> bool:
    """BRGEMM on AMX for bf16: AMX usable per the target's capabilities and, for live
    capabilities, torch's oneDNN runs bf16 BRGEMM on AMX in this process. A recorded profile's
    promise is taken as recorded (the kernel checks the host with host_amx_bf16_brgemm)."""
    if not target.cpu.amx.usable:
        return False
    return target.caps.profile is not None or host_amx_bf16_brgemm()


@functools.cache
def host_amx_bf16_brgemm() -> bool:
    """This process can run bf16 BRGEMM on AMX through torch's oneDNN: the tile state is granted,
    torch was built with oneDNN, and torch finds AMX tiles on this CPU (its own cpuinfo, asked
    after the permission request)."""
    if not _amx_permission():
        return False
    import torch

    if not torch.backends.mkldnn.is_available():
        return False
    init_amx = getattr(torch.cpu, "_init_amx", None)
    return bool(init_amx()) if init_amx is not None else False


@functools.cache
def host_cpu() -> Caps:
    """This machine's CPU as probed (never HAL_CAPS or a profile): what a kernel built from
    recorded capabilities checks before its first instruction."""
    from hal.probe.cpu import probe_cpu

    return Caps(cpu=probe_cpu())


@functools.cache
def _amx_permission() -> bool:
    from hal.probe.amx import request_amx_permission

    return request_amx_permission()


@functools.cache
def _gpu_facts(index: int) -> dict:
    """GpuCaps field -> value from torch's CUDA runtime for GPU `index`; {} without one."""
    import torch

    from hal.probe.torch_access import TORCH_PROPERTIES, torch_cuda_archs

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return {}
    props = torch.cuda.get_device_properties(index)
    facts: dict = {field: getattr(props, name, None) for field, name in TORCH_PROPERTIES.items()}
    facts["torch_archs"] = torch_cuda_archs(torch, deep=True) or None
    return facts
