"""The kernel cache on disk: where it is, whether it can be trusted, what a finished entry is, and
the lock that serializes the processes building one entry.

The cache holds shared libraries that moe-hal loads and runs, so it trusts a directory, entry or
file only when this user or root owns it and no one else can write it (root controls the machine
anyway, so a cache built into an image by root serves any user). A finished entry's marker
records its library's size and sha256; the library is loaded only while it still matches them
and carries its own key inside, so a damaged library is rebuilt instead of crashing the process,
and another build's library under the key is refused."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple, Optional

CACHE_ENV = "HAL_CACHE_DIR"
LOCK_TIMEOUT_ENV = "HAL_BUILD_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 1800.0
MARKER = "complete"  # the entry's record of its finished library; an entry without it is rebuilt
KEY_TAG = b"HAL_BUILD_KEY="  # every library carries "HAL_BUILD_KEY=<its key>\0" (see jit.KEY_UNIT)
STAGING_PREFIX = ".build-"


class BuildError(RuntimeError):
    """A kernel build failed; the message says why (the compiler's output, a missing toolchain)."""


class CacheDirError(BuildError):
    """The build cache directory cannot be created or written."""


class UntrustedCacheError(CacheDirError):
    """A cache directory, entry or file that another user could have written: never loaded."""


class EntryState(NamedTuple):
    """What the cache holds under one key. status: "ok" (loadable), "missing", "incomplete" (no
    marker: an interrupted or running build), "damaged" (the library differs from its record:
    rebuilt where the cache is writable) or "foreign" (a consistent entry of another build)."""
    path: Path
    status: str
    reason: str
    marker: dict

    @property
    def library(self) -> Path:
        return self.path / f"{self.path.name}.so"


def cache_dir() -> Path:
    """HAL_CACHE_DIR (a leading ~ expanded), or ~/.cache/moe-hal."""
    given = os.environ.get(CACHE_ENV)
    return Path(os.path.expanduser(given)) if given else Path.home() / ".cache" / "moe-hal"


def _where(root: Path) -> str:
    return f"{CACHE_ENV}={root}" if os.environ.get(CACHE_ENV) else \
        f"the default kernel cache {root} ({CACHE_ENV} is not set)"


def check_trusted(path: Path, follow: bool = False) -> None:
    """Raise UntrustedCacheError unless `path` is owned by this user or root and writable by
    neither group nor others; a symbolic link is refused unless `follow` (the cache root may be
    one)."""
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedCacheError(f"the kernel cache holds a symbolic link at {path}: moe-hal loads only "
                                  f"files it built there; remove {path}")
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UntrustedCacheError(
            f"the kernel cache path {path} is owned by uid {st.st_uid}, not by this user (uid {me}) or "
            f"root: another user could have put a library there for moe-hal to run; remove it, or set "
            f"{CACHE_ENV} to a directory of your own")
    if st.st_mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others")) if st.st_mode & bit)
        raise UntrustedCacheError(
            f"the kernel cache path {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}): "
            f"another user could replace a library moe-hal runs; run `chmod go-w {path}`, or set "
            f"{CACHE_ENV} to a directory of your own")


def _has_finished_entry(root: Path) -> bool:
    return any((p / MARKER).is_file() for p in root.iterdir() if not p.name.startswith("."))


def writable_cache_dir() -> Path:
    """The cache directory, created 0700 if needed, trusted and proven writable; a CacheDirError
    naming HAL_CACHE_DIR otherwise."""
    root = cache_dir()
    try:
        if not root.is_dir():
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, 0o700)  # whatever the umask: only this user reads or writes the cache
        check_trusted(root, follow=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        unreadable = root.is_dir() and not os.access(root, os.R_OK | os.X_OK)
        hint = f"; this user cannot read it either (another user's build is shared by `chmod -R a+rX " \
               f"{root}`)" if unreadable else ""
        raise CacheDirError(f"{_where(root)} is not a writable directory ({exc.strerror or exc}): moe-hal "
                            f"compiles its kernels there; set {CACHE_ENV} to a writable directory"
                            f"{hint}") from None
    return root


def usable_cache_dir() -> Path:
    """The cache directory if builds can come from it: writable, or read-only and holding finished
    builds (a cache deployed in an image; a build missing from it fails naming the entry). A
    CacheDirError naming HAL_CACHE_DIR otherwise. Backends call it when they build a kernel object,
    so a bad cache shows up at selection, not at the first call."""
    try:
        return writable_cache_dir()
    except UntrustedCacheError:
        raise
    except CacheDirError:
        root = cache_dir()
        try:
            if root.is_dir() and _has_finished_entry(root):
                check_trusted(root, follow=True)
                return root
        except OSError:
            pass
        raise


def inspect_entry(root: Path, key: str) -> EntryState:
    """The state of the entry `key` under `root`, its trust checked (UntrustedCacheError) and its
    library compared with the marker's size, sha256 and key."""
    entry = root / key

    def state(status, reason="", marker=None):
        return EntryState(entry, status, reason, marker or {})

    if not root.exists():
        return state("missing")
    check_trusted(root, follow=True)
    if not os.path.lexists(entry):
        return state("missing")
    check_trusted(entry)
    marker_path, library = entry / MARKER, entry / f"{key}.so"
    if not os.path.lexists(marker_path):
        return state("incomplete", "no finished build (an interrupted or running compile)")
    check_trusted(marker_path)
    try:
        marker = json.loads(marker_path.read_text())
        size, digest, marked_key = int(marker["size"]), str(marker["sha256"]), str(marker["key"])
    except (ValueError, KeyError, TypeError, OSError):
        return state("damaged", f"its marker {marker_path} is not a build record")
    if marked_key != key:
        return state("foreign", f"its marker records the build {marked_key}", marker)
    if not os.path.lexists(library):
        return state("damaged", f"the library {library} is missing", marker)
    check_trusted(library)
    found = library.stat().st_size
    if found != size:
        return state("damaged", f"the library {library} is {found} bytes where the build wrote {size} "
                     "(cut short or replaced)", marker)
    data = library.read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        return state("damaged", f"the library {library} differs from the build's sha256 (damaged or "
                     "replaced)", marker)
    if KEY_TAG + key.encode() + b"\0" not in data:
        other = re.search(re.escape(KEY_TAG) + rb"([\w.-]+)\0", data)
        built_as = f"the build {other.group(1).decode()}" if other else "a build that names no key"
        return state("foreign", f"the library {library} comes from {built_as}, not {key}", marker)
    return state("ok", "", marker)


def write_marker(entry: Path, key: str, name: str, seconds: float, what: str) -> None:
    """Record the finished library of `entry` (its size, sha256 and build time); written last and
    renamed into place, so a marker always describes a whole library."""
    library = entry / f"{key}.so"
    data = library.read_bytes()
    record = {"key": key, "name": name, "what": what, "library": library.name, "size": len(data),
              "sha256": hashlib.sha256(data).hexdigest(), "build_seconds": round(seconds, 1)}
    partial = entry / f".{MARKER}.partial"
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.chmod(partial, 0o600)
    os.replace(partial, entry / MARKER)


def restrict(tree: Path) -> None:
    """Take group and other access off every file and directory under `tree` (the compiler and
    linker create theirs under the umask)."""
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, stat.S_IMODE(path.stat().st_mode) & 0o700)


def last_build_seconds(root: Path, name: str) -> Optional[float]:
    """How long the most recent recorded build of `name` under `root` took, if any is recorded."""
    newest = None
    for marker in root.glob(f"{name}_*/{MARKER}"):
        try:
            record, mtime = json.loads(marker.read_text()), marker.stat().st_mtime
            if record.get("name") == name and (newest is None or mtime > newest[0]):
                newest = (mtime, float(record["build_seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return newest[1] if newest else None


def lock_timeout() -> float:
    given = os.environ.get(LOCK_TIMEOUT_ENV)
    if not given:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{LOCK_TIMEOUT_ENV}={given!r} is not a positive number of seconds")
    return seconds


@contextmanager
def build_lock(root: Path, key: str, timeout: float, on_wait: Callable[[Path, str], None]) -> Iterator[None]:
    """Hold the build lock of `key`. The file is opened without following links and never
    truncated by the open; its holder writes "pid N on HOST" into it, which a waiter passes to
    `on_wait` (once) and names when it gives up after `timeout` seconds."""
    path = root / f"{key}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedCacheError(f"the build lock {path} is a symbolic link: moe-hal writes only "
                                      f"files of its own there; remove {path}") from None
        raise CacheDirError(f"the build lock {path} cannot be opened ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UntrustedCacheError(f"the build lock {path} is not a regular file: remove it")
        deadline, told = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
                if not told:
                    on_wait(path, holder)
                    told = True
                if time.monotonic() >= deadline:
                    raise BuildError(
                        f"gave up after {timeout:g} s waiting for the build lock {path}, held by {holder}: "
                        f"if that process is stuck, stop it; {LOCK_TIMEOUT_ENV} sets the wait") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def remove_stale_staging(root: Path, key: str) -> None:
    """Remove what builds of `key` that were killed left behind (call with the key's lock held)."""
    for leftover in root.glob(f"{STAGING_PREFIX}{key}-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def publish(staging: Path, entry: Path) -> None:
    """Move a finished build (marker included) into place as `entry`, replacing an unusable one;
    a rename, so a process never sees half an entry."""
    if os.path.lexists(entry):
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        else:
            shutil.rmtree(entry)
    os.rename(staging, entry)


def entry_size(entry: Path) -> int:
    return sum(p.lstat().st_size for p in entry.rglob("*") if not p.is_symlink() and p.is_file())
