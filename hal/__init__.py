"""moe-hal: probe the hardware, pick the best MoE kernel for it, run it.

    caps = hal.probe()                       # or hal.probe(profile="h200")
    kernel = hal.select_moe_kernel(spec, device="cpu")
    print(kernel.decision.explain())

The ops ("moe", "moe_masked", "requant"), their templates and override variables: hal.ops.
"""

# The subpackage hal.probe is imported before the function of the same name is defined below, so
# the function wins the attribute and later imports of hal.probe.* do not rebind it.
import hal.probe as _probe_package
from hal import ops
from hal.caps import Caps, CpuCaps, GpuCaps
from hal.registry import (
    NoKernelError,
    SlowPathWarning,
    select_kernel,
    select_moe_kernel,
    select_requant_kernel,
)
from hal.scratch import release_scratch, scratch_bytes
from hal.spec import MoESpec, MoEWeights, RequantSpec

__version__ = "0.1.0"


def probe(deep: bool = False, profile=None) -> Caps:
    """This machine's capabilities, or a recorded profile's. Never raises on odd hardware."""
    return _probe_package.probe(deep=deep, profile=profile)


def profiles() -> list:
    """Names of the recorded capability profiles."""
    return _probe_package.list_profiles()


__all__ = ["Caps", "CpuCaps", "GpuCaps", "MoESpec", "MoEWeights", "NoKernelError", "RequantSpec",
           "SlowPathWarning", "ops", "probe", "profiles", "release_scratch", "scratch_bytes",
           "select_kernel", "select_moe_kernel", "select_requant_kernel"]
