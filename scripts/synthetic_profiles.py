"""Write the synthetic capability profiles (hal/profiles/*.json) from datasheet figures.

Each profile is marked synthetic=True and lists the figures it uses in `citations`. Values a
datasheet states carry source "datasheet"; values every chip of the arch shares (warp size, 48 KiB
default shared memory, register file, feature flags) carry "arch_table". What no cited source
states stays None with a reason. GPU profiles carry a plausible host CPU, and say which.

    python3 scripts/synthetic_profiles.py            # rewrites the synthetic profiles
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hal.caps import AmxState, CacheLevel, Caps, CpuCaps, GpuCaps, IsaFlags  # noqa: E402
from hal.probe import arch_table  # noqa: E402
from hal.probe.profiles import PROFILE_DIR  # noqa: E402

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
NOT_STATED = "synthetic profile: not stated by the cited datasheets"

AVX2_ONLY = IsaFlags(avx2=True, fma=True)
ZEN4_ISA = IsaFlags(avx2=True, fma=True, avx512f=True, avx512bw=True, avx512vl=True, avx512dq=True,
                    avx512_bf16=True, avx512_vnni=True)
ZEN5_ISA = IsaFlags(avx2=True, fma=True, avx512f=True, avx512bw=True, avx512vl=True, avx512dq=True,
                    avx512_bf16=True, avx512_vnni=True, avx_vnni=True)
SAPPHIRE_RAPIDS_ISA = IsaFlags(avx2=True, fma=True, avx512f=True, avx512bw=True, avx512vl=True,
                               avx512dq=True, avx512_bf16=True, avx512_fp16=True, avx512_vnni=True,
                               avx_vnni=True, amx_tile=True, amx_bf16=True, amx_int8=True)
AMX_USABLE = AmxState(cpuid=True, os_support=True, permitted=True,
                      reason="synthetic: assumes Linux >= 5.16 on bare metal, permission requested")
NO_AMX = AmxState(cpuid=False, os_support=False, permitted=False, reason="CPU has no AMX")


def _caches(l1d, l1i, l2, l3, l3_shared_by, smt):
    """Per-core L1/L2 (shared by the core's SMT threads) and one L3 instance shared by `l3_shared_by`."""
    return (CacheLevel(1, "data", l1d, smt, "per_core"),
            CacheLevel(1, "instruction", l1i, smt, "per_core"),
            CacheLevel(2, "unified", l2, smt, "per_core"),
            CacheLevel(3, "unified", l3, l3_shared_by, "shared"))


def cpu(*, vendor, model_name, family, model, stepping, isa, amx, cores, smt, sockets, caches,
        mem_bandwidth_gbps):
    """A CPU section. The AMX OS/permission states are an assumed scenario (source "scenario"):
    no datasheet states what a kernel or hypervisor grants."""
    logical = cores * smt * sockets
    sources = {name: "datasheet" for name in (
        "vendor", "model_name", "family", "model", "stepping", "isa", "logical_cpus", "physical_cores",
        "usable_cpus", "numa_nodes", "caches", "amx.cpuid")}
    sources["amx"] = "scenario"
    unknown = {}
    if mem_bandwidth_gbps is None:
        unknown["mem_bandwidth_gbps"] = "a VM slice: no datasheet figure applies"
    else:
        sources["mem_bandwidth_gbps"] = "datasheet"
    return CpuCaps(vendor=vendor, model_name=model_name, family=family, model=model, stepping=stepping,
                   isa=isa, amx=amx, logical_cpus=logical, physical_cores=cores * sockets,
                   usable_cpus=logical, numa_nodes=sockets, caches=caches,
                   mem_bandwidth_gbps=mem_bandwidth_gbps, sources=sources, unknown=unknown)


def xeon_8480_host(sockets=2):
    return cpu(vendor="GenuineIntel", model_name="Intel(R) Xeon(R) Platinum 8480+", family=6, model=143,
               stepping=8, isa=SAPPHIRE_RAPIDS_ISA, amx=AMX_USABLE, cores=56, smt=2, sockets=sockets,
               caches=_caches(48 * KIB, 32 * KIB, 2 * MIB, 105 * MIB, 112, 2),
               mem_bandwidth_gbps=307.2 * sockets)


def xeon_8570_host(sockets=2):
    return cpu(vendor="GenuineIntel", model_name="Intel(R) Xeon(R) Platinum 8570", family=6, model=207,
               stepping=2, isa=SAPPHIRE_RAPIDS_ISA, amx=AMX_USABLE, cores=56, smt=2, sockets=sockets,
               caches=_caches(48 * KIB, 32 * KIB, 2 * MIB, 300 * MIB, 112, 2),
               mem_bandwidth_gbps=358.4 * sockets)


def epyc_7742(sockets=1):
    return cpu(vendor="AuthenticAMD", model_name="AMD EPYC 7742 64-Core Processor", family=23, model=49,
               stepping=0, isa=AVX2_ONLY, amx=NO_AMX, cores=64, smt=2, sockets=sockets,
               caches=_caches(32 * KIB, 32 * KIB, 512 * KIB, 16 * MIB, 8, 2),
               mem_bandwidth_gbps=204.8 * sockets)


def epyc_9654(sockets=1):
    return cpu(vendor="AuthenticAMD", model_name="AMD EPYC 9654 96-Core Processor", family=25, model=17,
               stepping=1, isa=ZEN4_ISA, amx=NO_AMX, cores=96, smt=2, sockets=sockets,
               caches=_caches(32 * KIB, 32 * KIB, 1 * MIB, 32 * MIB, 16, 2),
               mem_bandwidth_gbps=460.8 * sockets)


def epyc_7763(sockets=1):
    return cpu(vendor="AuthenticAMD", model_name="AMD EPYC 7763 64-Core Processor", family=25, model=1,
               stepping=1, isa=AVX2_ONLY, amx=NO_AMX, cores=64, smt=2, sockets=sockets,
               caches=_caches(32 * KIB, 32 * KIB, 512 * KIB, 32 * MIB, 16, 2),
               mem_bandwidth_gbps=204.8 * sockets)


def ryzen_9950x():
    return cpu(vendor="AuthenticAMD", model_name="AMD Ryzen 9 9950X 16-Core Processor", family=26,
               model=68, stepping=0, isa=ZEN5_ISA, amx=NO_AMX, cores=16, smt=2, sockets=1,
               caches=_caches(48 * KIB, 32 * KIB, 1 * MIB, 32 * MIB, 16, 2), mem_bandwidth_gbps=89.6)


def ryzen_7950x():
    return cpu(vendor="AuthenticAMD", model_name="AMD Ryzen 9 7950X 16-Core Processor", family=25,
               model=97, stepping=2, isa=ZEN4_ISA, amx=NO_AMX, cores=16, smt=2, sockets=1,
               caches=_caches(32 * KIB, 32 * KIB, 1 * MIB, 32 * MIB, 16, 2), mem_bandwidth_gbps=83.2)


def nvidia_gpu(*, name, cc, sm_count, l2_bytes, memory_bytes, mem_bandwidth_gbps):
    arch = arch_table.nvidia_arch(cc)
    sheet = dict(name=name, sm_count=sm_count, l2_bytes=l2_bytes, memory_bytes=memory_bytes,
                 mem_bandwidth_gbps=mem_bandwidth_gbps, arch=arch_table.nvidia_arch_name(cc))
    table = dict(warp_size=arch_table.NVIDIA_WARP_SIZE,
                 smem_per_block=arch_table.NVIDIA_SMEM_PER_BLOCK_DEFAULT,
                 smem_per_block_optin=arch.smem_per_block_optin, smem_per_sm=arch.smem_per_sm,
                 regs_per_sm=arch_table.NVIDIA_REGS_PER_SM, regs_per_block=arch_table.NVIDIA_REGS_PER_BLOCK,
                 max_threads_per_sm=arch.max_threads_per_sm,
                 max_threads_per_block=arch_table.NVIDIA_MAX_THREADS_PER_BLOCK)
    return _gpu("nvidia", sheet, table, arch_table.nvidia_features(cc))


def amd_gpu(*, name, gfx, cu_count, lds_bytes, l2_bytes, memory_bytes, mem_bandwidth_gbps):
    sheet = dict(name=name, arch=gfx, sm_count=cu_count, smem_per_block=lds_bytes,
                 smem_per_block_optin=lds_bytes, smem_per_sm=lds_bytes, l2_bytes=l2_bytes,
                 memory_bytes=memory_bytes, mem_bandwidth_gbps=mem_bandwidth_gbps, max_threads_per_block=1024)
    table = dict(warp_size=arch_table.amd_warp_size(gfx))
    return _gpu("amd", sheet, table, arch_table.amd_features(gfx))


def _gpu(vendor, sheet, table, features):
    sources = {"vendor": "datasheet", "features": "arch_table"}
    sources.update({k: "datasheet" for k, v in sheet.items() if v is not None})
    sources.update({k: "arch_table" for k in table})
    fields = {**sheet, **table}
    unknown = {k: NOT_STATED for k in ("l2_bytes", "regs_per_sm", "regs_per_block", "max_threads_per_sm",
                                        "driver_version", "driver_api_version", "runtime_version",
                                        "torch_archs") if fields.get(k) is None}
    return GpuCaps(index=0, vendor=vendor, features=features, sources=sources, unknown=unknown, **fields)


def profile(name, cpu_caps, gpus, citations):
    return name, Caps(cpu=cpu_caps, gpus=tuple(gpus), profile=name, synthetic=True, citations=citations)


SPR_HOST = ("host CPU is plausible, not captured: 2x Intel Xeon Platinum 8480+ (56 cores, 105 MB L3, "
            "8x DDR5-4800 = 307.2 GB/s per socket), as in NVIDIA DGX H100")
EMR_HOST = ("host CPU is plausible, not captured: 2x Intel Xeon Platinum 8570 (56 cores, 300 MB L3, "
            "8x DDR5-5600 = 358.4 GB/s per socket), as in NVIDIA DGX B200")
GENOA = "AMD EPYC 9654: 96 cores / 192 threads, 32 KB L1d, 1 MB L2 per core, 32 MB L3 per 8-core CCD, " \
        "12x DDR5-4800 = 460.8 GB/s per socket, AVX-512 incl. BF16 and VNNI, no AMX"

PROFILES = [
    profile("a100", epyc_7742(sockets=2), [nvidia_gpu(
        name="NVIDIA A100-SXM4-80GB", cc=(8, 0), sm_count=108, l2_bytes=40 * MIB, memory_bytes=80 * GIB,
        mem_bandwidth_gbps=2039.0)], (
        "NVIDIA A100 SXM4 80GB: 108 SMs, compute capability 8.0, 80 GB HBM2e at 2039 GB/s, 40 MB L2",
        "CUDA Programming Guide, CC 8.0: 164 KB shared memory per SM, 163 KB (166912 B) per block opt-in, "
        "2048 threads per SM, 64K registers per SM; mma.sync and cp.async, no FP8, no wgmma or TMA",
        "host CPU is plausible, not captured: 2x AMD EPYC 7742 (Rome, Zen 2, 64 cores, 16 MB L3 per "
        "4-core CCX, 8x DDR4-3200 = 204.8 GB/s per socket, AVX2 + FMA, no AVX-512), as in NVIDIA DGX A100")),
    profile("h100", xeon_8480_host(), [nvidia_gpu(
        name="NVIDIA H100 80GB HBM3", cc=(9, 0), sm_count=132, l2_bytes=50 * MIB, memory_bytes=80 * GIB,
        mem_bandwidth_gbps=3350.0)], (
        "NVIDIA H100 SXM5: 132 SMs, compute capability 9.0, 80 GB HBM3 at 3.35 TB/s, 50 MB L2",
        "CUDA Programming Guide, CC 9.0: 228 KB shared memory per SM, 227 KB (232448 B) per block opt-in, "
        "2048 threads per SM, 64K registers per SM",
        SPR_HOST)),
    profile("b200", xeon_8570_host(), [nvidia_gpu(
        name="NVIDIA B200", cc=(10, 0), sm_count=148, l2_bytes=None, memory_bytes=180 * GIB,
        mem_bandwidth_gbps=8000.0)], (
        "NVIDIA B200 (HGX/DGX B200): 148 SMs, compute capability 10.0, 180 GB HBM3e at 8 TB/s",
        "CUDA Programming Guide, CC 10.0: 228 KB shared memory per SM, 227 KB per block opt-in, "
        "2048 threads per SM; tcgen05 (UMMA) and TMEM, no wgmma",
        EMR_HOST)),
    profile("rtx5090", ryzen_9950x(), [nvidia_gpu(
        name="NVIDIA GeForce RTX 5090", cc=(12, 0), sm_count=170, l2_bytes=96 * MIB, memory_bytes=32 * GIB,
        mem_bandwidth_gbps=1792.0)], (
        "NVIDIA GeForce RTX 5090 (GB202): 170 SMs, compute capability 12.0, 32 GB GDDR7 at 1792 GB/s, "
        "96 MB L2",
        "CUDA Programming Guide, CC 12.0: 100 KB shared memory per SM, 99 KB (101376 B) per block opt-in, "
        "1536 threads per SM; no tcgen05, no wgmma (consumer Blackwell)",
        "host CPU is plausible, not captured: AMD Ryzen 9 9950X (Zen 5, 16 cores, AVX-512 incl. BF16, "
        "2x DDR5-5600 = 89.6 GB/s)")),
    profile("mi300x", epyc_9654(sockets=2), [amd_gpu(
        name="AMD Instinct MI300X", gfx="gfx942", cu_count=304, lds_bytes=64 * KIB, l2_bytes=4 * MIB,
        memory_bytes=192 * GIB, mem_bandwidth_gbps=5300.0)], (
        "AMD Instinct MI300X: gfx942 (CDNA 3), 304 CUs, wave64, 64 KB LDS per CU, 192 GB HBM3 at 5.3 TB/s",
        "MI300X caches: 4 MB L2 per XCD (8 XCDs; l2_bytes is one XCD's), 256 MB Infinity Cache "
        "(memory-side, not in l2_bytes)",
        "CDNA 3 FP8 is the FNUZ variant (e4m3fnuz / e5m2fnuz), not OCP e4m3fn",
        "host CPU is plausible, not captured: 2x " + GENOA)),
    profile("rx7900xtx", ryzen_7950x(), [amd_gpu(
        name="AMD Radeon RX 7900 XTX", gfx="gfx1100", cu_count=96, lds_bytes=64 * KIB, l2_bytes=6 * MIB,
        memory_bytes=24 * GIB, mem_bandwidth_gbps=960.0)], (
        "AMD Radeon RX 7900 XTX: gfx1100 (RDNA 3), 96 CUs, wave32 by default, 64 KB LDS per workgroup, "
        "6 MB L2, 96 MB Infinity Cache (not in l2_bytes), 24 GB GDDR6 at 960 GB/s; WMMA, no MFMA, no FP8",
        "host CPU is plausible, not captured: AMD Ryzen 9 7950X (Zen 4, 16 cores, 2x DDR5-5200 = "
        "83.2 GB/s)")),
    profile("sapphire-rapids-vm", cpu(
        vendor="GenuineIntel", model_name="Intel(R) Xeon(R) Platinum 8480+", family=6, model=143, stepping=8,
        isa=SAPPHIRE_RAPIDS_ISA, cores=8, smt=2, sockets=1,
        amx=AmxState(cpuid=True, os_support=False, permitted=False,
                     reason="VM: XCOMP_PERM not granted (the hypervisor passes the tile CPUID bits but not "
                            "the XTILEDATA state: ARCH_GET_XCOMP_SUPP bit 18 clear)"),
        caches=_caches(48 * KIB, 32 * KIB, 2 * MIB, 105 * MIB, 16, 2), mem_bandwidth_gbps=None), [], (
        "Intel Xeon Platinum 8480+ (Sapphire Rapids): AMX-TILE, AMX-BF16, AMX-INT8, AVX-512 incl. FP16 and "
        "BF16, 48 KB L1d, 2 MB L2 per core, 105 MB L3",
        "a 16-vCPU cloud VM slice (8 cores x 2 threads); the AMX state is the common VM failure, not a "
        "measured instance")),
    profile("zen4", epyc_9654(), [], (GENOA, "one socket, no GPU")),
    profile("zen3", epyc_7763(), [], (
        "AMD EPYC 7763 (Milan, Zen 3): 64 cores / 128 threads, 32 KB L1d, 512 KB L2 per core, 32 MB L3 per "
        "8-core CCD, 8x DDR4-3200 = 204.8 GB/s, AVX2 + FMA, no AVX-512", "one socket, no GPU")),
]


def main() -> int:
    for name, caps in PROFILES:
        (PROFILE_DIR / f"{name}.json").write_text(caps.to_json() + "\n")
        print(f"wrote {PROFILE_DIR / name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
