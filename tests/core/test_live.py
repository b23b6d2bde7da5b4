"""hal.live: the one place where live facts refine capabilities, once per device, for live caps
only; and the backends use it instead of probing for themselves."""

import attrs
import pytest

import hal
from hal import live
from hal.backend import Target
from hal.caps import AmxState, Caps, CpuCaps, GpuCaps, GpuFeatures, IsaFlags

pytestmark = pytest.mark.cpu

AMX_CPU = CpuCaps(isa=IsaFlags(avx2=True, fma=True, avx512f=True, avx512bw=True, avx512vl=True,
                               avx512dq=True, avx512_bf16=True),
                  amx=AmxState(cpuid=True, os_support=True, permitted=True))
H200_SHALLOW = GpuCaps(index=0, vendor="nvidia", name="NVIDIA H200", arch="sm_90",
                       features=GpuFeatures(mma_sync=True, fp8="ocp"))


@pytest.fixture
def host(monkeypatch):
    """A fake host: AMX permission refused or granted, torch's oneDNN on AMX or not, and a CUDA
    runtime reporting what NVML left unknown. Returns the count of questions asked."""
    asked = {"permission": 0}

    def permission():
        asked["permission"] += 1
        return asked.get("granted", False)

    monkeypatch.setattr(live, "_amx_permission", permission)
    monkeypatch.setattr(live, "host_amx_bf16_brgemm", lambda: asked.get("onednn", False))
    monkeypatch.setattr(live, "_gpu_facts", lambda index: {"warp_size": 32, "sm_count": 132,
                                                           "smem_per_block_optin": 232448,
                                                           "name": "NVIDIA H200"})
    return asked


def test_recorded_profiles_are_taken_as_recorded(host):
    for name in ("emerald-rapids", "h200"):
        caps = hal.probe(profile=name)
        for device in ("cpu", "cuda:0"):
            target = Target(device, caps)
            assert live.refine(target) is target
    assert host["permission"] == 0
    assert live.amx_bf16_brgemm(Target("cpu", hal.probe(profile="emerald-rapids")))


def test_live_amx_needs_this_process_permission(host):
    target = Target("cpu", Caps(cpu=AMX_CPU))
    refused = live.refine(target)
    assert not refused.cpu.amx.usable and "ARCH_REQ_XCOMP_PERM refused" in refused.cpu.amx.reason
    host["granted"] = True
    assert live.refine(target).cpu.amx.usable
    no_amx = Target("cpu", Caps(cpu=attrs.evolve(AMX_CPU, amx=AmxState())))
    asked = host["permission"]
    assert live.refine(no_amx) is no_amx and host["permission"] == asked, "no AMX: nothing to ask"


def test_live_bf16_brgemm_also_needs_torchs_onednn(host):
    target = Target("cpu", Caps(cpu=AMX_CPU))
    assert not live.amx_bf16_brgemm(target)
    host["onednn"] = True
    assert live.amx_bf16_brgemm(target)
    assert not live.amx_bf16_brgemm(Target("cpu", Caps(cpu=attrs.evolve(AMX_CPU, amx=AmxState()))))


def test_live_gpu_fields_are_filled_and_known_ones_kept(host):
    target = Target("cuda:0", Caps(gpus=(H200_SHALLOW,)))
    gpu = live.refine(target).gpu
    assert (gpu.warp_size, gpu.sm_count, gpu.smem_per_block_optin) == (32, 132, 232448)
    assert gpu.name == "NVIDIA H200"
    other = attrs.evolve(H200_SHALLOW, name="AMD Instinct MI300X", vendor="amd", arch="gfx942")
    assert live.refine_gpu(other) is other, "the runtime's GPU is another model: nothing is mixed in"


def test_kernels_built_directly_see_the_refined_target(host):
    from hal.backends.cpu_brgemm.kernel import CpuBrgemmKernel
    from hal.backends.requant.kernels import RequantTritonKernel

    spec = hal.MoESpec(num_experts=4, top_k=1, hidden_size=128, intermediate_size=64,
                       weight_format="fp8_block128")
    kernel = CpuBrgemmKernel(spec, Target("cpu", Caps(cpu=AMX_CPU)))
    assert not kernel.target.cpu.amx.usable and not kernel.brgemm_supported
    host["granted"] = host["onednn"] = True
    assert CpuBrgemmKernel(spec, Target("cpu", Caps(cpu=AMX_CPU))).brgemm_supported
    pytest.importorskip("triton")
    requant = RequantTritonKernel(hal.RequantSpec(8, 256), Target("cuda:0", Caps(gpus=(H200_SHALLOW,))))
    assert requant.target.gpu.warp_size == 32 and requant.plan(64).warp_size == 32
