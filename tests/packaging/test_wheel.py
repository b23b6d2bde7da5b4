"""A built wheel is a working product: installed into a fresh venv, away from the checkout, it
selects cpu_brgemm, compiles it from the kernel sources the wheel carries (into an empty cache)
and matches the float64 reference; from a folder holding a user's own `backends` and `hal`, and
on a CPU install without triton, which the wheel does not require."""

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cpu, pytest.mark.packaging]

ROOT = Path(__file__).resolve().parents[2]

RUN_A_KERNEL = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch

    if "--no-triton" in sys.argv:  # as if triton were not installed: no import finds it
        sys.modules["triton"] = None

    import hal
    import hal.backends
    from hal.backends.reference import ops
    from hal.synth import random_routing, random_tokens, random_weights
    from hal.testing import ACCURACY, poison, rel_err

    venv = Path(sys.prefix)
    for module in (hal, hal.backends):  # the wheel's packages, never the checkout's or the user's
        assert venv in Path(module.__file__).parents, module.__file__
    for fmt, tokens in (("fp8_block128", 37), ("bf16", 5)):
        spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=160,
                           weight_format=fmt)
        kernel = hal.select_moe_kernel(spec, "cpu")
        assert kernel.backend == "cpu_brgemm", kernel.decision.explain()
        weights = random_weights(spec, seed=11)
        prepared = kernel.prepare_weights(weights)
        x = random_tokens(spec, tokens, seed=12)
        topk_weights, topk_ids = random_routing(spec, tokens, seed=13)
        out = poison(torch.empty_like(x))
        kernel(x, topk_weights, topk_ids, prepared, out=out)
        ref = ops.moe_tokens(spec, x, topk_weights, topk_ids, weights, compute_dtype=torch.float64)
        err = rel_err(out, ref)
        print(f"{fmt}: {kernel.backend} rel err {err:.2e}")
        assert err <= ACCURACY, (fmt, err)
""")


def running_site_dirs() -> list:
    import site

    return list(site.getsitepackages())


def test_wheel_builds_and_runs_a_cpu_kernel_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HAL_CACHE_DIR"] = str(tmp_path / "kernel-cache")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, env=env, timeout=600)
    wheel = next(wheels.glob("moe_hal-*.whl"))

    # The venv sees the running interpreter's packages (torch, Triton, pip) through a .pth, as
    # --system-site-packages would where this interpreter is not itself a venv; moe-hal itself
    # comes only from the wheel, installed into the venv's own site-packages (first on sys.path).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    (site_packages / "_running_interpreter.pth").write_text(
        f"import site; list(map(site.addsitedir, {running_site_dirs()!r}))\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, env=env, timeout=600)

    # The user's working directory has packages of its own named like moe-hal's folders: a
    # `backends` package that fails on import and a `hal` folder of data.
    work = tmp_path / "work"
    (work / "backends" / "cpu_brgemm").mkdir(parents=True)
    (work / "backends" / "__init__.py").write_text("raise ImportError('the user's own backends')\n")
    (work / "hal").mkdir()
    (work / "hal" / "notes.txt").write_text("not a package\n")
    run = subprocess.run([python, "-c", RUN_A_KERNEL], cwd=work, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("cpu_brgemm rel err") == 2
    assert run.stderr.count("compiling cpu_brgemm") == 1  # built from the wheel's sources

    # Without triton the CPU kernels run as before, and hal probe says what triton would add.
    run = subprocess.run([python, "-c", RUN_A_KERNEL, "--no-triton"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("cpu_brgemm rel err") == 2
    probe = subprocess.run([python, "-c", "import sys; sys.modules['triton'] = None; "
                            "from hal.cli.main import main; sys.exit(main(['probe']))"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert "triton is not installed: requant, triton_moe, w4afp8 cannot run here" in probe.stdout


def test_the_wheel_requires_no_triton_and_builds_without_warnings(tmp_path):
    """A CPU-only install pulls no triton (about 1 GB): only the test extra names it. The build
    prints no setuptools deprecation or missing-package warning."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                            "-w", str(wheels), str(ROOT)], env=env, capture_output=True, text=True,
                           timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    log = build.stdout + build.stderr
    for warning in ("SetuptoolsDeprecationWarning", "is absent from the `packages` configuration"):
        assert warning not in log, warning
    wheel = next(wheels.glob("moe_hal-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:") and "triton" in line]
        names = archive.namelist()
    assert requires and all('extra == "test"' in line for line in requires), requires
    assert "hal/backends/cpu_brgemm/backend.py" in names and "hal/profiles/h100.json" in names
    assert not any(name.startswith("backends/") for name in names)
