"""The interface every backend implements. A backend is an object exposed through the entry-point
group "hal.backends"; hal/ never imports a backend module by name.

    name      open string, unique
    ops       the ops it serves, among "moe", "moe_masked", "requant" (hal/ops.py)
    check(spec, target) -> Verdict      every reason it cannot run `spec` on `target`; pure: reads
                                        only (spec, target.caps), no subprocess, torch or Triton
    rank(spec, target)  -> int          higher wins among accepted backends; pure likewise
    build(spec, target) -> kernel       a subclass of the op's template in hal.kernel; checks the
                                        toolchain (compiler, nvcc, Triton) and raises if it lacks one
    priority  optional int (default 0): among equal ranks the higher wins, then the name
    act_quants optional tuple (default ("none",)): the activation numerics (MoESpec.act_quant) its
              kernels compute; selection rejects the others before check() is asked
    packages  optional tuple (default ()): the Python packages its build() imports beyond moe-hal's
              own requirements (e.g. "triton"), so `hal probe` can say what a missing one disables
"""

from __future__ import annotations

import os
from typing import Optional, Protocol, runtime_checkable

import attrs

from hal.caps import Caps, CpuCaps, GpuCaps
from hal.verdict import Verdict

# Ranks are a convention between backends, gathered here so their order is visible in one place.
RANK_REFERENCE = 0  # the portable oracle: below every fast path
RANK_PORTABLE_FAST = 50  # a compiled kernel that runs on any CPU/GPU of its kind
RANK_SPECIALIZED = 100  # a kernel built for this exact hardware feature (AMX, mma.sync, ...)


def act_quant_problems(backend, spec) -> list:
    """Why `backend` cannot compute the spec's activation numerics, if it cannot: a kernel held to
    the oracle of other numerics would be off by their difference (several percent for fp8)."""
    wanted = getattr(spec, "act_quant", "none")
    served = getattr(backend, "act_quants", ("none",))
    if wanted in served:
        return []
    return [f"act_quant={wanted!r}: its kernels compute " + ", ".join(repr(a) for a in served)]


def checked(backend, spec, target: Target) -> Verdict:
    """The backend's verdict on `spec` with the activation numerics it declares held to first:
    every reason from both."""
    verdict = backend.check(spec, target)
    numerics = act_quant_problems(backend, spec)
    if not numerics:
        return verdict
    return Verdict.from_reasons(numerics + ([] if verdict.ok else list(verdict.reasons)))


def missing_packages(backends) -> dict:
    """{package: [backend names]} for each package a backend declares that is not installed here,
    found without importing anything."""
    from importlib.util import find_spec

    missing: dict = {}
    for backend in backends:
        for package in getattr(backend, "packages", ()):
            if find_spec(package) is None:
                missing.setdefault(package, []).append(backend.name)
    return missing


def triton_interpreting() -> bool:
    """Triton runs kernels in its numpy interpreter (TRITON_INTERPRET=1), so a Triton backend can
    run on the CPU: correctly, and far too slowly to be chosen unless a caller names it."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@attrs.frozen
class Target:
    """Where a kernel will run: the device string and the capabilities that apply to it."""

    device: str  # "cpu" or "cuda:N"
    caps: Caps

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def cpu(self) -> CpuCaps:
        return self.caps.cpu

    @property
    def gpu(self) -> Optional[GpuCaps]:
        """The GPU this target names, or None on CPU or when the caps list no such GPU."""
        if self.is_cpu:
            return None
        index = int(self.device.split(":")[1]) if ":" in self.device else 0
        for gpu in self.caps.gpus:
            if gpu.index == index:
                return gpu
        return None


@runtime_checkable
class Backend(Protocol):
    name: str
    ops: tuple

    def check(self, spec, target: Target) -> Verdict: ...

    def rank(self, spec, target: Target) -> int: ...

    def build(self, spec, target: Target): ...
