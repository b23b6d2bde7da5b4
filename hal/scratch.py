"""Scratch memory that kernels keep between calls, and handing it back.

Kernels keep their per-call buffers (gathered activations, intermediates, dequantized panels) so
that the next call does not fault in fresh pages; a backend that does registers a holder here, and
hal.release_scratch() frees what every holder keeps without hal naming any backend. A holder is a
pair of callables: `release()` frees what the holder keeps, except buffers of calls running at that
moment, and `held_bytes()` says how many bytes it keeps now."""

from __future__ import annotations

import threading
from collections.abc import Callable

_holders: dict = {}  # name -> (release, held_bytes)
_lock = threading.Lock()


def register(name: str, release: Callable[[], object], held_bytes: Callable[[], int]) -> None:
    """Adds (or replaces) the holder called `name`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r} is not allowed: expected a non-empty string")
    if not callable(release) or not callable(held_bytes):
        raise ValueError("release and held_bytes must be callables")
    with _lock:
        _holders[name] = (release, held_bytes)


def _holders_now() -> list:
    with _lock:
        return list(_holders.values())


def scratch_bytes() -> int:
    """Bytes of scratch every registered holder keeps now."""
    return sum(int(held()) for _, held in _holders_now())


def release_scratch() -> int:
    """Frees the scratch of every registered holder, but buffers of calls running meanwhile in other
    threads; returns the bytes still kept afterwards (0 when no call was running)."""
    for release, _ in _holders_now():
        release()
    return scratch_bytes()
