"""AMX's OS-support and permission states, read with arch_prctl(2).

Linux (5.16+) keeps AMX tile data (XSAVE feature 18, XTILEDATA) off until a process asks for it:
ARCH_GET_XCOMP_SUPP says whether the kernel manages the state at all, ARCH_GET_XCOMP_PERM whether
this process may use it, and ARCH_REQ_XCOMP_PERM asks. An AMX instruction run without permission
dies with SIGILL, which is why the CPUID bits alone never make AMX usable."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Optional

from hal.caps import AmxState

ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL_X86_64 = 158  # arch/x86/entry/syscalls/syscall_64.tbl
X86_64_MACHINES = ("x86_64", "amd64")


class ArchPrctlError(OSError):
    pass


def _is_x86_64() -> bool:
    return platform.machine().lower() in X86_64_MACHINES


def _arch_prctl(code: int, arg) -> None:
    if not _is_x86_64():
        raise ArchPrctlError(errno.ENOSYS, f"arch_prctl exists only on x86_64, not {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # syscall(2) is variadic: pass full-width longs so no upper register half is left undefined.
    if libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL_X86_64), ctypes.c_long(code), arg) != 0:
        err = ctypes.get_errno()
        raise ArchPrctlError(err, f"arch_prctl({code:#x}): {os.strerror(err)}")


def _xcomp_mask(code: int) -> int:
    mask = ctypes.c_uint64(0)
    _arch_prctl(code, ctypes.byref(mask))
    return mask.value


def _has_xtiledata(mask: int) -> bool:
    return bool(mask >> XFEATURE_XTILEDATA & 1)


def request_amx_permission() -> bool:
    """Ask the kernel to let this process use AMX tiles; True when it may (now or already).

    Process-wide and idempotent. It fails on kernels without AMX support, in VMs whose hypervisor
    does not expose the tile state, under seccomp filters, or when a thread's sigaltstack is too small
    for the larger signal frame."""
    try:
        return _request_xtiledata()
    except OSError:
        return False


def _request_xtiledata() -> bool:
    if _has_xtiledata(_xcomp_mask(ARCH_GET_XCOMP_PERM)):
        return True
    _arch_prctl(ARCH_REQ_XCOMP_PERM, ctypes.c_long(XFEATURE_XTILEDATA))
    return _has_xtiledata(_xcomp_mask(ARCH_GET_XCOMP_PERM))


def read_amx_state(cpuid: bool) -> AmxState:
    """The three AMX states. Permission is requested here when CPUID and the OS both support AMX:
    asking is the only way to learn whether it would be granted, and it is the request every AMX
    user (oneDNN included) makes before its first tile instruction. The reason names the first
    state that fails (or how permission was obtained)."""
    os_support: Optional[bool] = None
    permitted: Optional[bool] = None
    reasons = []
    try:
        os_support = _has_xtiledata(_xcomp_mask(ARCH_GET_XCOMP_SUPP))
        if not os_support:
            reasons.append("kernel does not support XTILEDATA (ARCH_GET_XCOMP_SUPP bit 18 clear)")
    except OSError as exc:
        reasons.append(f"ARCH_GET_XCOMP_SUPP failed ({exc}); Linux < 5.16 or not x86_64")
    try:
        permitted = _has_xtiledata(_xcomp_mask(ARCH_GET_XCOMP_PERM))
        if not permitted and cpuid and os_support:
            try:
                permitted = _request_xtiledata()
                reasons.append("permission granted on request (ARCH_REQ_XCOMP_PERM)" if permitted
                               else "ARCH_REQ_XCOMP_PERM returned but bit 18 is still clear")
            except OSError as exc:
                reasons.append(f"ARCH_REQ_XCOMP_PERM refused ({exc}): seccomp, hypervisor or a "
                               "sigaltstack too small for the tile state")
        elif not permitted:
            reasons.append("no XTILEDATA permission (ARCH_GET_XCOMP_PERM bit 18 clear)")
    except OSError as exc:
        reasons.append(f"ARCH_GET_XCOMP_PERM failed ({exc})")
    if not cpuid:  # the OS and permission states follow from it; one reason reads better
        reasons = ["CPU has no AMX (no amx_tile in /proc/cpuinfo flags)"]
    return AmxState(cpuid=cpuid, os_support=os_support, permitted=permitted, reason="; ".join(reasons))
