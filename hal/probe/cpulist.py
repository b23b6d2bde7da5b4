"""Parsers for the kernel's CPU-list and size notations used across sysfs."""

from __future__ import annotations

SIZE_SUFFIXES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_cpu_list(text: str) -> frozenset:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}. An empty string is the empty set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            first, last = part.split("-", 1)
            lo, hi = int(first), int(last)
            if hi < lo:
                raise ValueError(f"cpu list {text!r}: range {part!r} runs backwards")
            cpus.update(range(lo, hi + 1))
        else:
            cpus.add(int(part))
    return frozenset(cpus)


def parse_size(text: str) -> int:
    """sysfs cache sizes: '32K' -> 32768, '1M' -> 1048576, '512' -> 512 (bytes)."""
    text = text.strip().upper().removesuffix("B")
    suffix = text[-1] if text and text[-1] in "KMG" else ""
    number = text[: len(text) - len(suffix)]
    if not number.isdigit():
        raise ValueError(f"size {text!r}: expected digits with an optional K/M/G suffix")
    return int(number) * SIZE_SUFFIXES[suffix]
