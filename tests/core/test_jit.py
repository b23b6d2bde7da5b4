"""hal.jit: one build per specialization, cached across processes, compiler errors surfaced."""

import subprocess
import sys
import textwrap

import pytest
import torch

from hal import jit

pytestmark = pytest.mark.cpu

SOURCE = textwrap.dedent("""
    #include <torch/library.h>
    #include <ATen/ATen.h>
    at::Tensor add_k(const at::Tensor& x) { return x + HAL_TEST_K; }
    TORCH_LIBRARY(HAL_OP_NAMESPACE, m) { m.def("add_k(Tensor x) -> Tensor", &add_k); }
""")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "selftest.cpp"
    source.write_text(SOURCE)
    return source


def test_specializations_build_once_and_coexist(cache, capfd):
    ns2 = jit.build("selftest", [str(cache)], defines={"HAL_TEST_K": 2})
    first = capfd.readouterr().err
    ns3 = jit.build("selftest", [str(cache)], defines={"HAL_TEST_K": 3})
    capfd.readouterr()
    assert ns2 != ns3
    assert "[moe-hal] compiling selftest (HAL_TEST_K=2)" in first
    x = torch.arange(4.0)
    assert torch.equal(getattr(torch.ops, ns2).add_k(x), x + 2)
    assert torch.equal(getattr(torch.ops, ns3).add_k(x), x + 3)
    # same process, same key: no second compile line
    assert jit.build("selftest", [str(cache)], defines={"HAL_TEST_K": 2}) == ns2
    assert "compiling" not in capfd.readouterr().err


def test_cache_is_reused_by_a_new_process(cache):
    jit.build("selftest", [str(cache)], defines={"HAL_TEST_K": 5})
    code = (f"from hal import jit; import torch; ns = jit.build('selftest', [{str(cache)!r}], "
            f"defines={{'HAL_TEST_K': 5}}); print(getattr(torch.ops, ns).add_k(torch.zeros(1)).item())")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "5.0"
    assert "compiling" not in run.stderr


def test_compile_error_carries_the_compiler_message(cache):
    cache.write_text(SOURCE.replace("return x + HAL_TEST_K;", "return x + undefined_symbol_xyz;"))
    with pytest.raises(jit.BuildError, match="undefined_symbol_xyz"):
        jit.build("selftest", [str(cache)], defines={"HAL_TEST_K": 1})


def test_missing_source_is_named():
    with pytest.raises(jit.BuildError, match="no_such_kernel.cpp"):
        jit.build("nothing", ["cpu/no_such_kernel.cpp"])
