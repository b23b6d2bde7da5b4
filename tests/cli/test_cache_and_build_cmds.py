"""`hal cache list | verify | clear` over a cache with a good and a damaged entry, and `hal build`'s
progress, summary and --json (its kernels' compiles are a tiny library's, so it runs in seconds)."""

import json
import os

import pytest

from hal.cli import main as hal_main
from tests.core.test_jit import write_sources
from tests.core.test_kernel_cache import build_in_child

pytestmark = pytest.mark.cpu


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def entries(tmp_path, cache):
    """(good, damaged) entry keys: two builds, the second's library cut short."""
    source = write_sources(tmp_path / "checkout")
    keys = []
    for k in (1, 2):
        rc, ns, _, err = build_in_child(source, k)
        assert rc == 0, err
        keys.append(ns)
    library = cache / keys[1] / f"{keys[1]}.so"
    os.truncate(library, 1000)
    return keys


def test_cache_list_verify_and_clear(cache, entries, capsys):
    good, damaged = entries
    assert hal_main.main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{cache}: 2 entries"
    rows = {line.split()[1]: line for line in lines[1:]}
    assert rows[good].split()[0] == "selftest" and rows[good].endswith(" MiB  ok")
    assert f"  damaged: the library {cache / damaged / damaged}.so is 1000 bytes" in rows[damaged]

    assert hal_main.main(["cache", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {e["key"]: e["status"] for e in listed["entries"]} == {good: "ok", damaged: "damaged"}
    assert all(e["size"] > 0 and e["what"] for e in listed["entries"])

    assert hal_main.main(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert f"BAD {cache / damaged}: damaged" in out and good not in out
    assert out.splitlines()[-1] == f"1 of 2 entries in {cache} verified"

    assert hal_main.main(["cache", "clear", damaged]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"removed {cache / damaged}"
    assert not (cache / damaged).exists() and (cache / good).exists()
    assert hal_main.main(["cache", "verify"]) == 0

    assert hal_main.main(["cache", "clear", "selftest"]) == 0
    assert f"removed {cache / good}" in capsys.readouterr().out
    assert not (cache / good).exists()


def test_cache_verify_names_an_untrusted_entry(cache, entries, capsys):
    good, _ = entries
    os.chmod(cache / good, 0o770)
    assert hal_main.main(["cache", "verify"]) == 1
    assert f"BAD {cache / good}: untrusted: the kernel cache path {cache / good} is writable by group" \
        in capsys.readouterr().out


@pytest.fixture
def compiling_reference(tmp_path, monkeypatch, cache):
    """The reference backend alone, its kernels compiling the tiny library (one per weight
    format), so `hal build` has real builds to report."""
    from hal.backends.reference.kernels import ReferenceMoEKernel

    from hal import jit

    source = write_sources(tmp_path / "checkout")
    monkeypatch.setenv("HAL_BACKENDS", "reference")
    monkeypatch.setattr(jit, "_loaded", {})  # each test's cache builds its own (a plain C library reloads)

    def compile(kernel):
        k = len(kernel.spec.weight_format)
        return [jit.build("selftest", [str(source)], defines={"HAL_TEST_K": k})]

    monkeypatch.setattr(ReferenceMoEKernel, "compile", compile)


def test_build_shows_progress_and_a_summary(compiling_reference, capfd):
    assert hal_main.main(["build"]) == 0
    out, err = capfd.readouterr()
    steps = [line for line in out.splitlines() if line.startswith("[")]
    total = len(steps)
    assert total > 1 and [s.split("]")[0] for s in steps] == [f"[{i}/{total}" for i in range(1, total + 1)]
    assert all(s.endswith(": reference") for s in steps)
    built = [line for line in out.splitlines() if line.startswith("built reference: selftest_")]
    assert len(built) == err.count("[moe-hal] compiled selftest in ") > 1
    assert out.splitlines()[-1].startswith(f"{len(built)} specializations ready in ")
    assert out.splitlines()[-1].endswith("0 specs skipped, 0 failed (" + out.splitlines()[-1].split("(")[-1])


def test_build_json_is_one_object_on_stdout(compiling_reference, cache, capfd):
    assert hal_main.main(["build", "--model", "gpt-oss-20b", "--json"]) == 0
    out, err = capfd.readouterr()
    summary = json.loads(out)
    assert summary["cache"] == str(cache) and summary["specs"] == 1
    assert [b["backend"] for b in summary["built"]] == ["reference"]
    assert (cache / summary["built"][0]["specialization"] / "complete").is_file()
    assert summary["skipped"] == [] and summary["failed"] == [] and summary["seconds"] >= 0
    assert "[1/1] mxfp4 2880x2880: reference" in err
