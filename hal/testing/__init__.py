"""Helpers for kernel tests, here and in third-party backends: poisoned outputs, the accuracy
measure of docs/contract.md, the machine's own capabilities, and the conformance suite every backend
passes (`pytest --pyargs hal.testing.conformance`; the fuzz of invalid inputs is hal.testing.fuzz),
Triton's CPU interpreter with torch's fp8 rounding, Triton's ahead-of-time compile for GPUs the
machine need not have (hal.testing.triton_aot), and torch.library.opcheck on recorded op calls."""

from hal.testing.accuracy import ACCURACY, rel_err
from hal.testing.machine import live_cpu_caps
from hal.testing.opcheck import EAGER_CHECKS, Recorder, opcheck_recorded
from hal.testing.poison import POISON_BYTE, POISON_BYTE_FNUZ, assert_masked_rows, is_poison, poison
from hal.testing.triton_interpreter import fp8_casts_through_torch

__all__ = ["ACCURACY", "EAGER_CHECKS", "POISON_BYTE", "POISON_BYTE_FNUZ", "Recorder",
           "assert_masked_rows", "fp8_casts_through_torch", "is_poison", "live_cpu_caps",
           "opcheck_recorded", "poison", "rel_err"]
