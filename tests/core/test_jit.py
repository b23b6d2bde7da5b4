"""hal.jit: one build per specialization, keyed by content (never by path), cached across
processes, one progress line per compile, compiler and cache errors surfaced where they happen.

Most tests build a tiny plain C++ library (no torch headers: seconds, not a minute) and read its
value through ctypes; one builds a real TORCH_LIBRARY op set."""

import ctypes
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from hal import jit

pytestmark = pytest.mark.cpu

HEADER = "#pragma once\nconstexpr double kOffset = 0.0;\n"
SOURCE = textwrap.dedent("""
    #include "selftest_offset.h"
    extern "C" double hal_selftest_value() { return HAL_TEST_K + kOffset; }
""")
TORCH_SOURCE = textwrap.dedent("""
    #include <torch/library.h>
    #include <ATen/ATen.h>
    at::Tensor add_k(const at::Tensor& x) { return x + HAL_TEST_K; }
    TORCH_LIBRARY(HAL_OP_NAMESPACE, m) { m.def("add_k(Tensor x) -> Tensor", &add_k); }
""")


def write_sources(folder, header=HEADER):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "selftest_offset.h").write_text(header)
    (folder / "selftest.cpp").write_text(SOURCE)
    return folder / "selftest.cpp"


def value_of(namespace) -> float:
    lib = ctypes.CDLL(str(jit.cache_dir() / namespace / f"{namespace}.so"))
    lib.hal_selftest_value.restype = ctypes.c_double
    return lib.hal_selftest_value()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def source(tmp_path, cache):
    return write_sources(tmp_path / "checkout")


def test_a_compile_says_what_it_builds_and_how_long_it_took_and_a_hit_says_nothing(source, capfd):
    ns = jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 2})
    first, done = capfd.readouterr().err.splitlines()
    assert first.startswith("[moe-hal] compiling selftest (HAL_TEST_K=2) in ")
    assert "no earlier build of selftest here" in first
    assert re.fullmatch(r"\[moe-hal\] compiled selftest in \d+ s", done)
    assert value_of(ns) == 2.0
    assert jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 2}) == ns
    assert capfd.readouterr().err == ""
    jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 3})  # estimated from the last one
    assert re.search(r"compiling selftest \(HAL_TEST_K=3\) in .*; the last build of selftest here "
                     r"took \d+ s$", capfd.readouterr().err.splitlines()[0])


def test_two_checkouts_share_one_build(tmp_path, source, cache, capfd):
    """The same sources in another folder (a second checkout, an installed wheel), in a new
    process, load the first one's build: the key and the build name no source path."""
    ns = jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 5})
    assert capfd.readouterr().err.count("[moe-hal] compiling") == 1
    other = write_sources(tmp_path / "elsewhere" / "deeper")
    code = (f"from hal import jit; print(jit.build('selftest', [{str(other)!r}], "
            "defines={'HAL_TEST_K': 5}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == ns
    assert run.stderr == ""  # no compile line: nothing was rebuilt
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [ns]
    ninja = (cache / ns / "build.ninja").read_text()
    assert str(tmp_path / "checkout") not in ninja and str(tmp_path / "elsewhere") not in ninja
    assert value_of(ns) == 5.0


def test_an_edited_header_is_a_new_build(source, capfd):
    ns = jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 1})
    write_sources(source.parent, header=HEADER.replace("0.0", "10.0"))
    capfd.readouterr()
    edited = jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 1})
    assert edited != ns
    assert capfd.readouterr().err.startswith("[moe-hal] compiling")
    assert value_of(ns) == 1.0 and value_of(edited) == 11.0


def test_compile_error_carries_the_compiler_message(source):
    source.write_text(SOURCE.replace("HAL_TEST_K + kOffset", "undefined_symbol_xyz"))
    with pytest.raises(jit.BuildError, match="undefined_symbol_xyz"):
        jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 1})


def test_missing_source_is_named(cache):
    with pytest.raises(jit.BuildError, match="no_such_kernel.cpp"):
        jit.build("nothing", ["cpu/no_such_kernel.cpp"])


def test_installed_sources_are_found_through_the_package():
    assert "TORCH_LIBRARY" in jit.source_file("cpu/moe_brgemm.cpp").read_text()
    assert jit.source_file("cuda/marlin_moe_configs.h").is_file()


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_unusable_cache_dir_is_named_before_compiling(tmp_path, monkeypatch, source, where, capfd):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    path = blocker if where == "a file" else blocker / "cache"
    monkeypatch.setenv("HAL_CACHE_DIR", str(path))
    with pytest.raises(jit.CacheDirError, match=f"HAL_CACHE_DIR={path} is not a writable directory"):
        jit.usable_cache_dir()
    with pytest.raises(jit.CacheDirError, match="HAL_CACHE_DIR"):
        jit.build("selftest", [str(source)], defines={"HAL_TEST_K": 9})
    assert "compiling" not in capfd.readouterr().err


def test_read_only_cache_dir_is_named(tmp_path, monkeypatch):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes through a read-only mode; the file-in-the-way cases cover root")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setenv("HAL_CACHE_DIR", str(locked))
    with pytest.raises(jit.CacheDirError, match="HAL_CACHE_DIR"):
        jit.usable_cache_dir()


def test_torch_library_specializations_coexist(tmp_path, cache):
    """Two specializations of one TORCH_LIBRARY source load side by side, each in its own op
    namespace."""
    source = tmp_path / "ops.cpp"
    source.write_text(TORCH_SOURCE)
    ns2 = jit.build("selftest_ops", [str(source)], defines={"HAL_TEST_K": 2})
    ns3 = jit.build("selftest_ops", [str(source)], defines={"HAL_TEST_K": 3})
    assert ns2 != ns3
    x = torch.arange(4.0)
    assert torch.equal(getattr(torch.ops, ns2).add_k(x), x + 2)
    assert torch.equal(getattr(torch.ops, ns3).add_k(x), x + 3)
