"""The capability data model: one frozen attrs tree that round-trips through JSON.

Every section carries `sources`, field -> where the value came from: proc, sysfs, cpuid,
arch_prctl, os, cgroup, nvml, arch_table (a per-arch constant), nvml+arch_table, torch, triton,
amdsmi, measured, datasheet, scenario (a synthetic profile's stated premise); and `unknown`,
field -> why it is None. A probe that cannot read a field leaves it None and says why; it never
raises."""

from __future__ import annotations

import json
import typing
from typing import Optional

import attrs

SCHEMA_VERSION = 1


def _str_dict():
    return attrs.field(factory=dict)


@attrs.frozen
class IsaFlags:
    avx2: bool = False
    fma: bool = False
    avx512f: bool = False
    avx512bw: bool = False
    avx512vl: bool = False
    avx512dq: bool = False
    avx512_bf16: bool = False
    avx512_fp16: bool = False
    avx512_vnni: bool = False
    avx_vnni: bool = False
    amx_tile: bool = False
    amx_bf16: bool = False
    amx_int8: bool = False
    amx_fp16: bool = False

    @property
    def avx512(self) -> bool:
        """The AVX-512 subset the CPU kernels compile for (Skylake-SP and later)."""
        return self.avx512f and self.avx512bw and self.avx512vl and self.avx512dq


@attrs.frozen
class AmxState:
    """AMX is usable only when the CPU has it (cpuid), the kernel saves its tile state
    (ARCH_GET_XCOMP_SUPP) and this process may use it (ARCH_GET_XCOMP_PERM, requested with
    ARCH_REQ_XCOMP_PERM). VMs often pass the CPUID bits through with no OS support."""

    cpuid: bool = False
    os_support: Optional[bool] = None
    permitted: Optional[bool] = None
    reason: str = ""

    @property
    def usable(self) -> bool:
        return bool(self.cpuid and self.os_support and self.permitted)


@attrs.frozen
class CacheLevel:
    level: int
    kind: str  # data | instruction | unified
    size_bytes: int
    shared_by_cpus: int  # logical CPUs that share one instance
    scope: str  # per_core | shared

    @property
    def per_core(self) -> bool:
        return self.scope == "per_core"


@attrs.frozen
class CpuCaps:
    vendor: Optional[str] = None  # GenuineIntel | AuthenticAMD | ...
    model_name: Optional[str] = None
    family: Optional[int] = None
    model: Optional[int] = None
    stepping: Optional[int] = None
    isa: IsaFlags = attrs.field(factory=IsaFlags)
    amx: AmxState = attrs.field(factory=AmxState)
    logical_cpus: Optional[int] = None
    physical_cores: Optional[int] = None
    usable_cpus: Optional[int] = None  # min(affinity mask, cgroup cpu.max quota)
    numa_nodes: Optional[int] = None
    caches: tuple = attrs.field(default=(), converter=tuple)  # of CacheLevel
    mem_bandwidth_gbps: Optional[float] = None  # measured (hal probe --bandwidth) or datasheet
    sources: dict = _str_dict()
    unknown: dict = _str_dict()

    def cache(self, level: int, kind: str = "data") -> Optional[CacheLevel]:
        for c in self.caches:
            if c.level == level and c.kind in (kind, "unified"):
                return c
        return None


@attrs.frozen
class GpuFeatures:
    """Derived from the arch, so a recorded profile carries them and selection stays pure."""

    mma_sync: bool = False  # NVIDIA sm_80+: mma.sync m16n8k16 bf16/fp16
    cp_async: bool = False  # NVIDIA sm_80+
    wgmma: bool = False  # sm_90a only
    tma: bool = False  # sm_90+
    tcgen05: bool = False  # sm_100 / sm_103 (datacenter Blackwell), not sm_120
    fp8: Optional[str] = None  # "ocp" (e4m3fn) | "fnuz" (e4m3fnuz, gfx942) | None
    mfma: bool = False  # AMD CDNA matrix cores


@attrs.frozen
class GpuCaps:
    index: int = 0
    vendor: Optional[str] = None  # nvidia | amd
    name: Optional[str] = None
    arch: Optional[str] = None  # "sm_90" | "gfx942"
    warp_size: Optional[int] = None
    sm_count: Optional[int] = None  # SMs on NVIDIA, CUs on AMD
    smem_per_block: Optional[int] = None  # bytes without opt-in (48 KiB on NVIDIA)
    smem_per_block_optin: Optional[int] = None  # bytes after cudaFuncSetAttribute
    smem_per_sm: Optional[int] = None
    regs_per_sm: Optional[int] = None
    regs_per_block: Optional[int] = None
    max_threads_per_sm: Optional[int] = None
    max_threads_per_block: Optional[int] = None
    l2_bytes: Optional[int] = None
    memory_bytes: Optional[int] = None
    mem_bandwidth_gbps: Optional[float] = None  # peak from bus width x memory clock
    driver_version: Optional[str] = None
    driver_api_version: Optional[str] = None  # newest CUDA/HIP API the driver supports, e.g. "13.0"
    runtime_version: Optional[str] = None
    torch_archs: tuple = attrs.field(default=(), converter=tuple)  # archs the installed torch targets
    features: GpuFeatures = attrs.field(factory=GpuFeatures)
    sources: dict = _str_dict()
    unknown: dict = _str_dict()

    @property
    def compute_capability(self) -> Optional[tuple]:
        if self.vendor != "nvidia" or not self.arch or not self.arch.startswith("sm_"):
            return None
        digits = self.arch[3:].rstrip("a")
        return int(digits[:-1]), int(digits[-1])


@attrs.frozen
class Caps:
    schema_version: int = SCHEMA_VERSION
    cpu: CpuCaps = attrs.field(factory=CpuCaps)
    gpus: tuple = attrs.field(default=(), converter=tuple)  # of GpuCaps
    profile: Optional[str] = None  # name when loaded from hal/profiles or HAL_CAPS
    synthetic: bool = False  # True for profiles written from datasheets, not captured
    citations: tuple = attrs.field(default=(), converter=tuple)  # datasheet figures a synthetic profile uses
    captured_on: Optional[str] = None  # host description and date of a real capture
    software: dict = _str_dict()  # python, torch, triton versions at capture
    deep: bool = False  # True when torch/Triton were asked (a CUDA context was created)
    unknown: dict = _str_dict()  # why a whole section could not be read, e.g. "gpus.nvidia"

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(attrs.asdict(self), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Caps:
        return from_dict(cls, json.loads(text))


# `hal probe --json` appends the preset-to-kernel table under this key; it is derived from the
# capabilities, so loading drops it.
SELECTION_KEY = "selection"
# The element type of each tuple field.
_TUPLE_ITEMS = {"caches": CacheLevel, "gpus": GpuCaps, "torch_archs": str, "citations": str}


def from_dict(cls, data, path: str = ""):
    """Build an attrs class from `attrs.asdict` output, following the field annotations; a value
    of the wrong type is a ValueError naming its field (dotted, from the top)."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path or cls.__name__}: expected an object, got {type(data).__name__}")
    if cls is Caps:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"capabilities schema_version={data.get('schema_version')!r}: this hal "
                             f"reads version {SCHEMA_VERSION}")
        data = {k: v for k, v in data.items() if k != SELECTION_KEY}
    unknown_keys = set(data) - {f.name for f in attrs.fields(cls)}
    if unknown_keys:
        raise ValueError(f"{path or cls.__name__}: unknown keys {sorted(unknown_keys)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for field in attrs.fields(cls):
        if field.name in data:
            where = f"{path}.{field.name}" if path else field.name
            kwargs[field.name] = _typed(hints[field.name], data[field.name], where, field.name)
    return cls(**kwargs)


def _typed(kind, value, where: str, name: str):
    """`value` as a field of annotation `kind` holds it, or a ValueError naming `where`."""
    optional = typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind)
    if optional:
        if value is None:
            return None
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if attrs.has(kind):
        return from_dict(kind, value, where)
    if kind is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_typed(_TUPLE_ITEMS[name], v, f"{where}[{i}]", name) for i, v in enumerate(value))
    if kind is dict:
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ValueError(f"{where}: expected an object of strings, got {_shown(value)}")
        return dict(value)
    allowed = (int, float) if kind is float else (kind,)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, allowed):
        null = " or null" if optional else ""
        raise ValueError(f"{where}: expected {_SCALARS_NAMES[kind]}{null}, got {_shown(value)}")
    return value


_SCALARS_NAMES = {bool: "true or false", int: "an integer", str: "a string", float: "a number"}


def _shown(value) -> str:
    text = json.dumps(value) if isinstance(value, (str, bool, int, float)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."
