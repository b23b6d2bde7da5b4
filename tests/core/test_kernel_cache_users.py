"""The kernel cache between two users: a cache root built and made read-only (an image's `hal
build`) serves another user, who cannot write it; a cache another user owns is refused. Running as
root, the other user is nobody (setpriv); otherwise the read-only case runs as this user."""

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.core.test_jit import write_sources
from tests.core.test_kernel_cache import CHILD

pytestmark = pytest.mark.cpu

NOBODY = 65534
SETPRIV = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


@functools.cache
def can_switch_user() -> bool:
    """Root with setpriv, and the other user can import hal from this environment (a venv in a
    private directory, as a CI's mktemp -d, is out of its reach)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    run = subprocess.run([*SETPRIV, sys.executable, "-c", "import hal"], capture_output=True, timeout=300,
                         cwd=tempfile.gettempdir())
    return run.returncode == 0


@pytest.fixture
def shared():
    """A directory both users reach (pytest's own tmp_path is private to this user)."""
    where = tempfile.mkdtemp(prefix="hal-users-")
    os.chmod(where, 0o755)
    yield Path(where)
    shutil.rmtree(where)


def run_build(source, k, cache, *, as_other: bool):
    """(returncode, stdout, stderr) of a build and load in a new process, as the other user when
    `as_other` and this process is root."""
    prefix = SETPRIV if as_other and os.geteuid() == 0 else ()
    home = cache.parent / "home"
    home.mkdir(exist_ok=True)
    os.chmod(home, 0o777)
    env = {**os.environ, "HAL_CACHE_DIR": str(cache), "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([*prefix, sys.executable, "-c", CHILD, str(source), str(k)], capture_output=True,
                         text=True, timeout=300, env=env, cwd=str(cache.parent))
    return run.returncode, run.stdout, run.stderr


def test_a_read_only_cache_serves_its_builds_to_a_user_who_cannot_write_it(shared):
    if os.geteuid() == 0 and not can_switch_user():
        pytest.skip("root writes through read-only modes, and no other user can run hal here (setpriv "
                    "missing, or this environment out of its reach)")
    source = write_sources(shared / "src")
    os.chmod(source.parent, 0o755)
    cache = shared / "cache"
    rc, out, err = run_build(source, 2, cache, as_other=False)
    assert rc == 0, err
    ns = out.split()[0]
    if os.geteuid() == 0:  # the cache is private to its builder until shared
        rc, _, err = run_build(source, 2, cache, as_other=True)
        assert rc != 0 and f"this user cannot read it either (another user's build is shared by " \
            f"`chmod -R a+rX {cache}`)" in err
    subprocess.run(["chmod", "-R", "a+rX,a-w", str(cache)], check=True)
    try:
        rc, out, err = run_build(source, 2, cache, as_other=True)
        assert (rc, out.split(), err) == (0, [ns, "2.0"], "")
        rc, _, err = run_build(source, 5, cache, as_other=True)  # not in the image: named, not built
        assert rc != 0 and f"HAL_CACHE_DIR={cache} is not a writable directory" in err
        library = cache / ns / f"{ns}.so"
        os.chmod(library, 0o644)
        os.truncate(library, library.stat().st_size // 2)
        os.chmod(library, 0o444)
        rc, _, err = run_build(source, 2, cache, as_other=True)
        assert rc != 0
        assert f"the cached build {cache / ns} cannot be loaded (the library {library} is " in err
        assert "cannot be written to rebuild it" in err
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(cache)], check=True)


@pytest.mark.parametrize("case", ["the reader's cache is another user's", "others can write an entry"])
def test_a_cache_another_user_could_have_written_is_refused(shared, case):
    """Root reading a cache nobody owns, and nobody reading root's cache where an entry is left
    writable by others: neither loads it. (The other user does not compile here: its Python may
    live where it cannot start a second interpreter.)"""
    if not can_switch_user():
        pytest.skip("running as another user needs root, setpriv and an environment that user can read")
    source = write_sources(shared / "src")
    os.chmod(source.parent, 0o755)
    cache = shared / "cache"
    rc, out, err = run_build(source, 2, cache, as_other=False)
    assert rc == 0, err
    entry = cache / out.split()[0]
    if case == "the reader's cache is another user's":
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(cache)], check=True)
        rc, _, err = run_build(source, 2, cache, as_other=False)
        refused = f"the kernel cache path {cache} is owned by uid {NOBODY}, not by this user (uid 0) or root"
    else:
        subprocess.run(["chmod", "-R", "a+rX", str(cache)], check=True)
        os.chmod(entry, 0o757)
        rc, _, err = run_build(source, 2, cache, as_other=True)
        refused = f"the kernel cache path {entry} is writable by others (mode 757)"
    assert rc != 0 and refused in err
