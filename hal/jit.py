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
registered twice). A finished, verified build is loaded without taking any lock or writing
anything, so a read-only cache (an image's) serves the builds it holds. Otherwise concurrent
processes serialize on a file lock per key; the loser of the race finds the finished build and
loads it. What the cache trusts and checks is hal.kernel_cache's part."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from hal import jit_compile, kernel_cache
from hal.kernel_cache import (  # noqa: F401 (the errors and cache directory are this module's API)
    CACHE_ENV,
    BuildError,
    CacheDirError,
    UntrustedCacheError,
    cache_dir,
    usable_cache_dir,
)

SOURCE_PACKAGE = "hal.csrc"
HEADER_SUFFIXES = (".h", ".hpp", ".cuh")
KEY_UNIT = "hal_build_key.cpp"  # compiled into every build: the library names its own key
NINJA_SAFE_PATH = re.compile(r"[\w./+,=@%~-]+")  # torch writes the build directory into build.ninja unescaped

# -fopenmp: ATen's at::parallel_for is an inline `#pragma omp parallel`; without the flag an
# extension silently runs on one thread. The GOMP symbols resolve to the libgomp torch loads.
BASE_CFLAGS = ("-O3", "-std=c++17", "-fopenmp")
BASE_CUDA_CFLAGS = ("-O3", "-std=c++17")

_loaded: dict = {}  # key -> namespace, for this process
_process_lock = threading.Lock()


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


def build(name: str, sources: Sequence[str], *, defines: Optional[Mapping[str, object]] = None,
          extra_cflags: Sequence[str] = (), extra_cuda_cflags: Sequence[str] = (),
          cuda: bool = False, verbose: bool = False) -> str:
    """Compile (or find in the cache) and load one specialization; return the op namespace it
    registered (call its ops as getattr(torch.ops, namespace).op_name). A compile prints what it
    builds with a time estimate and, when done, how long it took (stderr); a process waiting on
    another's build says so. The compiler's own output appears only when it fails (or with
    verbose=True)."""
    defines = dict(defines or {})
    tree, units = _source_tree(sources)
    flags = [*BASE_CFLAGS, *extra_cflags, "||", *BASE_CUDA_CFLAGS, *extra_cuda_cflags]
    key = specialization_key(name, tree, defines, flags, cuda)
    what = ", ".join(f"{k}={v}" for k, v in sorted(defines.items())) or "default"
    with _process_lock:
        if key in _loaded:
            return _loaded[key]
        found = kernel_cache.inspect_entry(cache_dir(), key)
        if found.status != "ok":
            found = _build_entry(name, key, what, tree, units, defines, list(extra_cflags),
                                 list(extra_cuda_cflags), cuda, verbose, found)
        _load_library(found.library)
        _loaded[key] = key
        return key


def _refuse_foreign(found: kernel_cache.EntryState) -> None:
    if found.status == "foreign":
        raise BuildError(f"the kernel cache entry {found.path} holds another build: {found.reason}; "
                         f"remove {found.path} (`hal cache clear {found.path.name}`) to rebuild it")


def _build_entry(name, key, what, tree, units, defines, cflags, cuda_cflags, cuda, verbose, found):
    """Build the entry `key` under the cache's build lock (unless the lock's previous holder
    built it); return its verified state."""
    _refuse_foreign(found)
    try:
        root = kernel_cache.writable_cache_dir()
    except CacheDirError:
        if found.status == "missing":
            raise
        raise CacheDirError(f"the cached build {found.path} cannot be loaded ({found.reason}) and the "
                            f"cache cannot be written to rebuild it: rebuild it where the cache is "
                            f"writable (`hal build`), or set {CACHE_ENV} to a writable directory") from None

    timeout = kernel_cache.lock_timeout()

    def waiting(lock, holder):
        print(f"[moe-hal] waiting for {holder}, which is building {name} ({what}); lock {lock}, "
              f"given up after {timeout:g} s ({kernel_cache.LOCK_TIMEOUT_ENV})", file=sys.stderr, flush=True)

    with kernel_cache.build_lock(root, key, timeout, waiting):
        found = kernel_cache.inspect_entry(root, key)
        _refuse_foreign(found)
        if found.status == "ok":
            return found
        if found.status == "damaged":
            print(f"[moe-hal] rebuilding {found.path}: {found.reason}", file=sys.stderr, flush=True)
        kernel_cache.remove_stale_staging(root, key)
        last = kernel_cache.last_build_seconds(root, name)
        expect = (f"the last build of {name} here took {last:.0f} s" if last is not None else
                  f"no earlier build of {name} here to time it by: a kernel takes minutes")
        print(f"[moe-hal] compiling {name} ({what}) in {found.path}; {expect}", file=sys.stderr, flush=True)
        started = time.monotonic()
        _compile(root, key, name, what, tree, units, defines, cflags, cuda_cflags, cuda, verbose)
        print(f"[moe-hal] compiled {name} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        found = kernel_cache.inspect_entry(root, key)
        if found.status != "ok":
            raise BuildError(f"the build of {key} in {found.path} did not verify: {found.reason}")
        return found


def _load_library(path: Path) -> None:
    import torch

    try:
        torch.ops.load_library(str(path))
    except OSError as exc:
        raise BuildError(f"loading the cached build {path} failed ({exc}): remove {path.parent} to "
                         "rebuild it") from None


def _compile(root, key, name, what, tree, units, defines, cflags, cuda_cflags, cuda, verbose):
    """Compile in a staging directory and publish it as the entry, marker included. The sources
    are copied into the staging directory, so the build names no path outside the cache. A cache
    path ninja cannot spell is built in a temporary directory and copied in."""
    started = time.monotonic()
    outside = None if NINJA_SAFE_PATH.fullmatch(str(root)) else Path(tempfile.mkdtemp(prefix="moe-hal-"))
    staging = Path(tempfile.mkdtemp(prefix=f"{kernel_cache.STAGING_PREFIX}{key}-", dir=outside or root))
    try:
        src = staging / "src"
        for rel, path in tree.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, src / rel)
        (staging / KEY_UNIT).write_text(
            f'extern "C" __attribute__((used)) const char hal_build_key[] = "HAL_BUILD_KEY={key}";\n')
        define_flags = [f"-D{k}={v}" for k, v in sorted(defines.items())]
        define_flags.append(f"-DHAL_OP_NAMESPACE={key}")
        output = jit_compile.run(dict(
            name=key,
            sources=[str(src / rel) for rel in units] + [str(staging / KEY_UNIT)],
            extra_cflags=[*BASE_CFLAGS, *define_flags, *cflags],
            extra_cuda_cflags=[*BASE_CUDA_CFLAGS, *define_flags, *cuda_cflags] if cuda else None,
            extra_include_paths=[str(src)],
            build_directory=str(staging),
            with_cuda=cuda,
            is_python_module=False,
            verbose=verbose,
        ), f"{key} from {', '.join(units)}")
        if verbose and output:
            print(output, file=sys.stderr, end="" if output.endswith("\n") else "\n")
        kernel_cache.restrict(staging)
        kernel_cache.write_marker(staging, key, name, time.monotonic() - started, what)
        if outside is not None:
            moved = Path(tempfile.mkdtemp(prefix=f"{kernel_cache.STAGING_PREFIX}{key}-", dir=root))
            shutil.copytree(staging, moved, dirs_exist_ok=True)
            kernel_cache.restrict(moved)
            staging = moved
        kernel_cache.publish(staging, root / key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if outside is not None:
            shutil.rmtree(outside, ignore_errors=True)
