"""Builds csrc/ sources once per specialization and loads them as TORCH_LIBRARY ops.

A specialization is (sources, defines, flags, CUDA or not). Its key hashes the source bytes, the
flags, the torch version and the Python ABI, so a changed source or a torch upgrade rebuilds and
nothing stale is ever loaded. Every build gets its own op namespace, passed to the C++ as
HAL_OP_NAMESPACE, so several specializations of one source live side by side in a process
(TORCH_LIBRARY refuses a namespace registered twice).

Concurrent processes serialize on a file lock per key; the loser of the race finds the finished
build and loads it."""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Optional

CSRC = Path(__file__).resolve().parent.parent / "csrc"

# -fopenmp: ATen's at::parallel_for is an inline `#pragma omp parallel`; without the flag an
# extension silently runs on one thread. The GOMP symbols resolve to the libgomp torch loads.
BASE_CFLAGS = ("-O3", "-std=c++17", "-fopenmp")
BASE_CUDA_CFLAGS = ("-O3", "-std=c++17")

_loaded: dict = {}  # key -> namespace, for this process
_process_lock = threading.Lock()


class BuildError(RuntimeError):
    """A csrc build failed; the message carries the compiler's output."""


def cache_dir() -> Path:
    return Path(os.environ.get("HAL_CACHE_DIR") or Path.home() / ".cache" / "moe-hal")


def source_path(source) -> Path:
    """A source under csrc/ by its relative name, or any file by absolute path."""
    path = Path(source) if Path(source).is_absolute() else CSRC / source
    if not path.is_file():
        raise BuildError(f"kernel source {path} is missing: moe-hal builds its kernels from a source "
                         "checkout (pip install -e .)")
    return path


def specialization_key(name: str, sources: Sequence[Path], defines: Mapping[str, object],
                       flags: Sequence[str], cuda: bool) -> str:
    import torch

    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for header in sorted(CSRC.rglob("*.h")) + sorted(CSRC.rglob("*.cuh")):
        h.update(header.read_bytes())  # sources include shared headers; any edit rebuilds
    h.update(repr(sorted((k, str(v)) for k, v in defines.items())).encode())
    h.update(repr(list(flags)).encode())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{sys.version_info[:2]}|{cuda}".encode())
    return f"{name}_{h.hexdigest()[:16]}"


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(name: str, sources: Sequence[str], *, defines: Optional[Mapping[str, object]] = None,
          extra_cflags: Sequence[str] = (), extra_cuda_cflags: Sequence[str] = (),
          cuda: bool = False, verbose: bool = False) -> str:
    """Compile and load one specialization; return the op namespace it registered
    (call its ops as getattr(torch.ops, namespace).op_name)."""
    defines = dict(defines or {})
    paths = [source_path(s) for s in sources]
    flags = [*BASE_CFLAGS, *extra_cflags, "||", *BASE_CUDA_CFLAGS, *extra_cuda_cflags]
    key = specialization_key(name, paths, defines, flags, cuda)
    with _process_lock:
        if key in _loaded:
            return _loaded[key]
        namespace = key
        define_flags = [f"-D{k}={v}" for k, v in sorted(defines.items())]
        define_flags.append(f"-DHAL_OP_NAMESPACE={namespace}")
        build_dir = cache_dir() / key
        build_dir.mkdir(parents=True, exist_ok=True)
        with _file_lock(cache_dir() / f"{key}.lock"):
            fresh = not (build_dir / f"{key}.so").exists()
            if fresh:
                what = ", ".join(f"{k}={v}" for k, v in sorted(defines.items())) or "default"
                print(f"[moe-hal] compiling {name} ({what}) -> {build_dir} ...", file=sys.stderr,
                      flush=True)
            _load(key, paths, build_dir, define_flags, list(extra_cflags), list(extra_cuda_cflags),
                  cuda, verbose)
        _loaded[key] = namespace
        return namespace


def _load(key, paths, build_dir, define_flags, cflags, cuda_cflags, cuda, verbose):
    from torch.utils import cpp_extension

    captured = io.StringIO()
    try:
        with redirect_stdout(captured), redirect_stderr(captured):
            cpp_extension.load(
                name=key,
                sources=[str(p) for p in paths],
                extra_cflags=[*BASE_CFLAGS, *define_flags, *cflags],
                extra_cuda_cflags=[*BASE_CUDA_CFLAGS, *define_flags, *cuda_cflags] if cuda else None,
                extra_include_paths=[str(CSRC)],
                build_directory=str(build_dir),
                with_cuda=cuda,
                is_python_module=False,
                verbose=verbose,
            )
    except Exception as exc:  # the compiler's message travels in the exception and the capture
        log = captured.getvalue()
        raise BuildError(f"building {key} from {', '.join(p.name for p in paths)} failed:\n"
                         f"{exc}\n{log}".rstrip()) from None
