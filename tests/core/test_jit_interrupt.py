"""Ctrl-C during a first compile: the compiler stops with the build, KeyboardInterrupt reaches the
caller, and the cache keeps no half entry. The compiler is a script that records its pid and
sleeps, so the test sees exactly the process a real cc1plus would be."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.core.test_jit import write_sources

pytestmark = pytest.mark.cpu

FAKE_CXX = textwrap.dedent("""\
    #!/bin/sh
    for arg in "$@"; do
        if [ "$arg" = "-c" ]; then echo $$ >> "$FAKE_CXX_PIDS"; exec sleep 300; fi
    done
    echo "12.0.0"
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_interrupting_a_compile_stops_the_compiler(tmp_path):
    cxx, pids, cache = tmp_path / "fake-cxx", tmp_path / "pids", tmp_path / "cache"
    cxx.write_text(FAKE_CXX)
    cxx.chmod(0o755)
    source = write_sources(tmp_path / "checkout")
    code = f"from hal import jit; jit.build('selftest', [{str(source)!r}], defines={{'HAL_TEST_K': 1}})"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CXX": str(cxx), "FAKE_CXX_PIDS": str(pids),
                                 "HAL_CACHE_DIR": str(cache)})
    try:
        deadline = time.monotonic() + 240
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        compilers = [int(p) for p in pids.read_text().split()]
        assert compilers and all(alive(p) for p in compilers)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 30
    while any(alive(p) for p in compilers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in compilers), "a compiler outlived the interrupted build"
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
