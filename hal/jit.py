"""Builds the kernel sources once per specialization and loads them as TORCH_LIBRARY ops.

The sources ship inside the installed package (csrc/ of the repository, installed as the resource
package `hal.csrc`), so a wheel builds its kernels as a source checkout does. A specialization is
(sources, defines, flags, CUDA or not). Its key hashes everything the object code depends on, by
content: the sources and every header beside them, the defines and flags, the compiler's identity
and version, torch's version and C++ ABI, and the Python ABI. It hashes no path: two checkouts or
installs of the same sources share one build. The sources are copied into the key's directory and
compiled from there, so nothing in the build (build.ninja, include paths) names where they came
from, and moving the package never triggers a rebuild.

Every build gets its own op namespace, passed to the C++ as HAL_OP_NAMESPACE, so several
specializations of one source live side by side in a process (TORCH_LIBRARY refuses a namespace
registered twice). Concurrent processes serialize on a file lock per key; the loser of the race
finds the finished build and loads it."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Optional

SOURCE_PACKAGE = "hal.csrc"
HEADER_SUFFIXES = (".h", ".hpp", ".cuh")
CACHE_ENV = "HAL_CACHE_DIR"
DONE_MARKER = "complete"  # written after a build loaded once; a directory without it is rebuilt

# -fopenmp: ATen's at::parallel_for is an inline `#pragma omp parallel`; without the flag an
# extension silently runs on one thread. The GOMP symbols resolve to the libgomp torch loads.
BASE_CFLAGS = ("-O3", "-std=c++17", "-fopenmp")
BASE_CUDA_CFLAGS = ("-O3", "-std=c++17")

_loaded: dict = {}  # key -> namespace, for this process
_process_lock = threading.Lock()


class BuildError(RuntimeError):
    """A kernel build failed; the message says why (the compiler's output, a missing toolchain)."""


class CacheDirError(BuildError):
    """The build cache directory cannot be created or written."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "moe-hal")


def usable_cache_dir() -> Path:
    """The cache directory, created if needed and proven writable; a CacheDirError naming
    HAL_CACHE_DIR otherwise. Backends call it when they build a kernel object, so a bad cache
    shows up at selection, not at the first call."""
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        where = f"{CACHE_ENV}={root}" if os.environ.get(CACHE_ENV) else \
            f"the default kernel cache {root} ({CACHE_ENV} is not set)"
        raise CacheDirError(f"{where} is not a writable directory ({exc.strerror or exc}): moe-hal "
                            f"compiles its kernels there; set {CACHE_ENV} to a writable directory") from None
    return root


def source_root() -> Path:
    """The directory the installed kernel sources live in."""
    from importlib import resources

    try:
        root = resources.files(SOURCE_PACKAGE)
    except ModuleNotFoundError:
        raise BuildError(f"the kernel sources ({SOURCE_PACKAGE}) are not installed with moe-hal: "
                         "reinstall the package") from None
    if not isinstance(root, Path):
        raise BuildError(f"the kernel sources are inside an archive ({root}): install moe-hal unzipped")
    return root


def source_file(name: str) -> Path:
    """One installed kernel source or header by its relative name, e.g. "cuda/marlin_moe_configs.h"."""
    path = source_root() / name
    if not path.is_file():
        raise BuildError(f"kernel source {name} is missing from {path.parent}")
    return path


def _source_tree(sources: Sequence) -> tuple:
    """({relative name: file} of the sources and every header they may include, [the sources'
    relative names]). A name relative to the installed sources brings all their headers; a file
    given by absolute path brings the headers beside it."""
    tree, units = {}, []
    for source in sources:
        given = Path(source)
        if given.is_absolute():
            if not given.is_file():
                raise BuildError(f"kernel source {given} is missing")
            root, rel = given.parent, given.name
            headers = [p for p in root.iterdir() if p.suffix in HEADER_SUFFIXES and p.is_file()]
        else:
            root, rel = source_root(), str(source)
            source_file(rel)
            headers = [p for p in root.rglob("*") if p.suffix in HEADER_SUFFIXES]
        for path in [*headers, root / rel]:
            tree[path.relative_to(root).as_posix()] = path
        units.append(rel)
    return tree, units


@functools.cache
def _tool_version(command: str) -> str:
    try:
        run = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"the compiler {command!r} cannot run ({exc}): moe-hal builds its CPU kernels "
                         "with a C++17 compiler (set CXX to choose one) and its CUDA kernels with nvcc "
                         "(set CUDA_HOME)") from None
    if run.returncode:
        raise BuildError(f"{command} --version failed: {run.stderr.strip()}")
    return f"{command}: {run.stdout.strip()}"


def toolchain_identity(cuda: bool) -> str:
    """The compilers a build uses, by name and version, as torch's extension builder picks them."""
    from torch.utils import cpp_extension

    parts = [_tool_version(os.environ.get("CXX", "c++"))]
    if cuda:
        if cpp_extension.CUDA_HOME is None:
            raise BuildError("nvcc was not found (set CUDA_HOME or put nvcc on PATH): the CUDA kernels "
                             "are compiled with it")
        parts.append(_tool_version(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")))
    return "\n".join(parts)


def abi_identity() -> str:
    """torch's version, build and C++ ABI, and the Python ABI the library is loaded into."""
    import torch

    return "|".join(str(v) for v in (
        torch.__version__, torch.version.git_version, torch.version.cuda,
        getattr(torch.version, "hip", None), torch._C._GLIBCXX_USE_CXX11_ABI,
        sys.implementation.cache_tag, sysconfig.get_config_var("EXT_SUFFIX")))


def specialization_key(name: str, tree: Mapping[str, Path], defines: Mapping[str, object],
                       flags: Sequence[str], cuda: bool) -> str:
    h = hashlib.sha256()
    for rel in sorted(tree):
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(tree[rel].read_bytes()).digest())
    h.update(repr(sorted((k, str(v)) for k, v in defines.items())).encode())
    h.update(repr(list(flags)).encode())
    h.update(f"cuda={cuda}".encode())
    h.update(toolchain_identity(cuda).encode())
    h.update(abi_identity().encode())
    return f"{name}_{h.hexdigest()[:16]}"


@contextmanager
def _file_lock(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(name: str, sources: Sequence[str], *, defines: Optional[Mapping[str, object]] = None,
          extra_cflags: Sequence[str] = (), extra_cuda_cflags: Sequence[str] = (),
          cuda: bool = False, verbose: bool = False) -> str:
    """Compile (or find in the cache) and load one specialization; return the op namespace it
    registered (call its ops as getattr(torch.ops, namespace).op_name). A compile prints one line
    to stderr; the compiler's own output appears only when it fails (or with verbose=True)."""
    defines = dict(defines or {})
    tree, units = _source_tree(sources)
    flags = [*BASE_CFLAGS, *extra_cflags, "||", *BASE_CUDA_CFLAGS, *extra_cuda_cflags]
    key = specialization_key(name, tree, defines, flags, cuda)
    with _process_lock:
        if key in _loaded:
            return _loaded[key]
        root = usable_cache_dir()
        build_dir = root / key
        define_flags = [f"-D{k}={v}" for k, v in sorted(defines.items())]
        define_flags.append(f"-DHAL_OP_NAMESPACE={key}")
        with _file_lock(root / f"{key}.lock"):
            if (build_dir / DONE_MARKER).exists():
                _load_library(build_dir / f"{key}.so")
            else:
                what = ", ".join(f"{k}={v}" for k, v in sorted(defines.items())) or "default"
                print(f"[moe-hal] compiling {name} ({what}) in {build_dir} ...", file=sys.stderr, flush=True)
                _compile(key, tree, units, build_dir, define_flags, list(extra_cflags),
                         list(extra_cuda_cflags), cuda, verbose)
                (build_dir / DONE_MARKER).write_text("")
        _loaded[key] = key
        return key


def _load_library(path: Path) -> None:
    import torch

    try:
        torch.ops.load_library(str(path))
    except OSError as exc:
        raise BuildError(f"loading the cached build {path} failed ({exc}): remove {path.parent} to "
                         "rebuild it") from None


def _compile(key, tree, units, build_dir, define_flags, cflags, cuda_cflags, cuda, verbose):
    """Copy the sources into the build directory and compile them there, so the build names no
    path outside the cache. A directory left by an interrupted build is started afresh (it may
    hold torch's stale build lock)."""
    from torch.utils import cpp_extension

    shutil.rmtree(build_dir, ignore_errors=True)
    src = build_dir / "src"
    for rel, path in tree.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, src / rel)
    captured = io.StringIO()
    try:
        with redirect_stdout(captured), redirect_stderr(captured):
            cpp_extension.load(
                name=key,
                sources=[str(src / rel) for rel in units],
                extra_cflags=[*BASE_CFLAGS, *define_flags, *cflags],
                extra_cuda_cflags=[*BASE_CUDA_CFLAGS, *define_flags, *cuda_cflags] if cuda else None,
                extra_include_paths=[str(src)],
                build_directory=str(build_dir),
                with_cuda=cuda,
                is_python_module=False,
                verbose=verbose,
            )
    except Exception as exc:  # the compiler's message travels in the exception and the capture
        log = captured.getvalue()
        raise BuildError(f"building {key} from {', '.join(units)} failed:\n{exc}\n{log}".rstrip()) from None
