"""The kernel cache's trust model, as one user sees it: private modes whatever the umask, a
library loaded only while it matches its record (size, sha256, key) and lives in a directory no
one else can write, the build lock never followed through a link and never waited on forever,
a finished build served without a lock or a write, cache paths ninja cannot spell.

Builds and damaged-library loads run in child processes: a library mapped into this process must
not be cut short under it."""

import fcntl
import os
import shutil
import subprocess
import sys
import time

import pytest

from hal import jit, kernel_cache
from tests.core.test_jit import write_sources

pytestmark = pytest.mark.cpu

CHILD = """
import ctypes, sys
from hal import jit
ns = jit.build("selftest", [sys.argv[1]], defines={"HAL_TEST_K": int(sys.argv[2])})
lib = ctypes.CDLL(str(jit.cache_dir() / ns / f"{ns}.so"))
lib.hal_selftest_value.restype = ctypes.c_double
print(ns, lib.hal_selftest_value())
"""


def build_in_child(source, k, timeout=300, **env):
    """(returncode, namespace or None, value or None, stderr) of a build and load in a new process."""
    run = subprocess.run([sys.executable, "-c", CHILD, str(source), str(k)], capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, **env})
    words = run.stdout.split()
    return run.returncode, words[0] if words else None, float(words[1]) if words else None, run.stderr


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit, "_loaded", {})  # this process may hold the same key from another cache
    return tmp_path / "cache"


@pytest.fixture
def source(tmp_path, cache):
    return write_sources(tmp_path / "checkout")


@pytest.fixture
def built(source):
    """The namespace of a finished HAL_TEST_K=2 build, made by another process."""
    rc, ns, value, err = build_in_child(source, 2)
    assert rc == 0 and value == 2.0, err
    return ns


def test_the_cache_is_private_whatever_the_umask(source, cache):
    code = f"import os; os.umask(0); exec({CHILD!r})"
    run = subprocess.run([sys.executable, "-c", code, str(source), "2"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    for path in cache.rglob("*"):
        assert path.lstat().st_mode & 0o077 == 0, f"{path} is open to others: {oct(path.lstat().st_mode)}"


@pytest.mark.parametrize("where, how", [("entry", "group-writable"), ("library", "others-writable"),
                                        ("root", "group-writable"), ("entry", "another owner")])
def test_an_entry_others_could_write_is_refused(source, cache, built, where, how):
    path = {"entry": cache / built, "library": cache / built / f"{built}.so", "root": cache}[where]
    if how == "another owner":
        if os.geteuid() != 0:
            pytest.skip("only root can give a file to another user")
        os.chown(path, 65534, 65534)
    else:
        os.chmod(path, path.stat().st_mode | (0o020 if how == "group-writable" else 0o002))
    rc, _, _, err = build_in_child(source, 2)
    assert rc != 0
    assert "UntrustedCacheError" in err and f"the kernel cache path {path} is " in err
    assert ("owned by uid 65534" if how == "another owner" else "chmod go-w") in err


def test_a_planted_library_without_a_build_record_is_rebuilt_not_run(source, cache, built):
    """The key is computable from public inputs: a library dropped under it with a bare marker
    (or none) is never loaded; the cache builds its own."""
    rc, other, value, err = build_in_child(source, 7)
    assert rc == 0 and value == 7.0, err
    shutil.copyfile(cache / other / f"{other}.so", cache / built / f"{built}.so")
    (cache / built / "complete").write_text("")
    rc, ns, value, err = build_in_child(source, 2)
    assert (rc, ns, value) == (0, built, 2.0), err
    assert f"rebuilding {cache / built}: its marker" in err


def test_a_truncated_library_is_rebuilt(source, cache, built):
    library = cache / built / f"{built}.so"
    size = library.stat().st_size
    os.truncate(library, size // 2)
    rc, ns, value, err = build_in_child(source, 2)
    assert (rc, ns, value) == (0, built, 2.0), err
    assert f"rebuilding {cache / built}: the library {library} is {size // 2} bytes" in err
    assert library.stat().st_size == size


def test_a_damaged_library_in_a_cache_that_cannot_be_written_is_named(source, cache, built, monkeypatch):
    library = cache / built / f"{built}.so"
    with open(library, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 16)

    def unwritable():
        raise kernel_cache.CacheDirError("not writable")

    monkeypatch.setattr(kernel_cache, "writable_cache_dir", unwritable)
    with pytest.raises(jit.CacheDirError, match=f"the cached build {cache / built} cannot be loaded "
                       rf"\(the library {library} differs from the build's sha256"):
        jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 2})


def test_another_builds_library_under_the_key_is_refused(source, cache, built):
    """A consistent entry whose library registered another namespace: a BuildError naming it, not
    an AttributeError at the first op."""
    rc, other, _, err = build_in_child(source, 3)
    assert rc == 0, err
    shutil.copyfile(cache / other / f"{other}.so", cache / built / f"{built}.so")
    kernel_cache.write_marker(cache / built, built, "selftest", 1.0, "HAL_TEST_K=2")
    rc, _, _, err = build_in_child(source, 2)
    assert rc != 0
    assert f"the kernel cache entry {cache / built} holds another build" in err
    assert f"comes from the build {other}, not {built}" in err


def test_the_lock_file_is_never_followed_through_a_link(source, cache, built, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    shutil.rmtree(cache / built)
    (cache / f"{built}.lock").unlink()
    (cache / f"{built}.lock").symlink_to(victim)
    rc, _, _, err = build_in_child(source, 2)
    assert victim.read_text() == "precious"
    assert rc != 0 and f"the build lock {cache / built}.lock is a symbolic link" in err


def hold(lock_path, holder="pid 4242 on buildhost"):
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, holder.encode())
    return fd


def test_a_finished_build_loads_while_another_process_holds_its_lock(source, cache, built):
    fd = hold(cache / f"{built}.lock")
    try:
        rc, ns, value, err = build_in_child(source, 2, timeout=120, HAL_BUILD_LOCK_TIMEOUT="600")
    finally:
        os.close(fd)
    assert (rc, ns, value) == (0, built, 2.0), err
    assert err == ""


def test_a_stuck_lock_holder_is_named_and_the_wait_ends(source, cache, built):
    shutil.rmtree(cache / built)
    fd = hold(cache / f"{built}.lock")
    try:
        started = time.monotonic()
        rc, _, _, err = build_in_child(source, 2, timeout=120, HAL_BUILD_LOCK_TIMEOUT="2")
        waited = time.monotonic() - started
    finally:
        os.close(fd)
    assert rc != 0 and waited < 60
    assert err.count("[moe-hal] waiting for pid 4242 on buildhost, which is building selftest "
                     "(HAL_TEST_K=2)") == 1
    assert f"gave up after 2 s waiting for the build lock {cache / built}.lock, held by pid 4242 on " \
           "buildhost" in err and "HAL_BUILD_LOCK_TIMEOUT" in err


def test_the_lock_holder_writes_who_it_is(cache):
    cache.mkdir()
    with kernel_cache.build_lock(cache, "k", 1.0, on_wait=None):
        held = (cache / "k.lock").read_text()
    assert held == f"pid {os.getpid()} on {os.uname().nodename}\n"
    assert (cache / "k.lock").read_text() == ""


@pytest.mark.parametrize("given", ["soon", "0", "-5"])
def test_a_bad_lock_timeout_is_named(monkeypatch, given):
    monkeypatch.setenv("HAL_BUILD_LOCK_TIMEOUT", given)
    with pytest.raises(ValueError, match=f"HAL_BUILD_LOCK_TIMEOUT='{given}' is not a positive number"):
        kernel_cache.lock_timeout()


def test_a_finished_build_is_served_by_a_cache_that_cannot_be_written(source, cache, built, monkeypatch):
    def unwritable():
        raise kernel_cache.CacheDirError("not writable")

    monkeypatch.setattr(kernel_cache, "writable_cache_dir", unwritable)
    assert jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 2}) == built
    with pytest.raises(jit.CacheDirError, match="not writable"):
        jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 4})


def test_a_cache_path_ninja_cannot_spell_works(tmp_path, monkeypatch):
    cache = tmp_path / "a $dollar: and spaces"
    monkeypatch.setenv("HAL_CACHE_DIR", str(cache))
    source = write_sources(tmp_path / "checkout")
    rc, ns, value, err = build_in_child(source, 6)
    assert (rc, value) == (0, 6.0), err
    assert kernel_cache.inspect_entry(cache, ns).status == "ok"
    assert sorted(p.name for p in cache.iterdir()) == [ns, f"{ns}.lock"]


def test_a_tilde_in_the_cache_variable_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HAL_CACHE_DIR", "~/kernels")
    assert jit.cache_dir() == tmp_path / "kernels"
    assert jit.usable_cache_dir() == tmp_path / "kernels" and (tmp_path / "kernels").is_dir()
