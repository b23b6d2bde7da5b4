"""hal.backends.marlin: W4A16 (GPTQ uint4b8, group 128 or per channel) MoE on NVIDIA sm_80+, with
compile-time kIsEP / kHasBias specializations and an occupancy-aware launch config.
Entry point: marlin = "hal.backends.marlin:backend". See docs/backends/marlin.md."""

from hal.backends.marlin.backend import backend

__all__ = ["backend"]
