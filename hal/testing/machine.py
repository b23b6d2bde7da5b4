"""The capabilities tests decide from: this machine's own, never a recorded profile's."""

from __future__ import annotations

import functools

from hal.caps import Caps


@functools.cache
def live_cpu_caps() -> Caps:
    """This machine's CPU as probed, whatever HAL_CAPS says: tests decide from the hardware itself
    what can run here, since a recorded profile's AMX on an AMD box would end in SIGILL."""
    from hal.probe.cpu import probe_cpu

    return Caps(cpu=probe_cpu())
